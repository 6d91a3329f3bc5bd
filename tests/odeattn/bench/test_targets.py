"""The targets, judged from ratios paired per round (odeattn.bench.targets)."""

from odeattn.bench import check_targets, paired_ratio


def _row(shape, path, round_s, **extra):
    return {"shape": shape, "path": path, "round_s": round_s, **extra}


def test_targets_use_the_ratios_paired_per_round():
    # torch-plain / torch-eager per round: 1/2, 4/1, 2/3 -> median 0.67 (not met), while the ratio of
    # the medians, 2 / 2, would be 1.0; ort-bitnet / ort-bitnet-int per round: 2, 0.5, 3 -> median 2 (met)
    rows = [_row("small", "torch-plain", [1.0, 4.0, 2.0]), _row("small", "torch-eager", [2.0, 1.0, 3.0], peak_fraction=0.9),
            _row("large", "ort-bitnet", [2.0, 1.0, 3.0]), _row("large", "ort-bitnet-int", [1.0, 2.0, 1.0]),
            _row("large", "jax-jit", [1.0], peak_fraction=0.5, xla_fraction=0.8),
            _row("large", "torch-eager", [1.0], peak_fraction=0.84, products_fraction=0.95, median_s=1.0),
            _row("large", "ort-opset17", [0.8], products_fraction=0.75, median_s=0.8),
            _row("large", "torch-compile", [0.9], products_fraction=0.85, median_s=0.9),
            _row("small", "ort-opset17", [1.0, 3.0, 2.0]), _row("small", "ort-opset23", [2.0, 1.0, 2.5])]
    # the block's products alone, per forward (60 GFLOP): in XLA 1 s, 60 GFLOP/s, 60% of the peak
    # (below 70%: XLA's matmul is the limit); in torch 0.8 s, 75%
    result = {"paths": rows, "peaks": [{"shape": "large", "round_gflops": [100.0], "xla_round_gflops": [60.0], "flop": 60e9,
                                        "products_round_s": {"xla": [1.0], "torch": [0.8]},
                                        "ort_projections_round_s": {"float": [1.0, 1.0, 1.0], "int": [0.5, 0.5, 0.5]}}],
              "long_context": {"shape": [1, 8192, 512, 8], "rows": {"torch-eager": {"peak_rss_bytes": 2e9}}}}
    got = {t["target"]: t for t in check_targets(result)}
    assert paired_ratio(rows, "small", "torch-plain", "torch-eager") == {"median": 2 / 3, "min": 0.5, "max": 4.0}
    assert got["torch-eager >= 1.25x torch-plain (small)"]["met"] is False
    assert paired_ratio(rows, "large", "ort-bitnet", "ort-bitnet-int") == {"median": 2.0, "min": 0.5, "max": 3.0}
    assert got["ort-bitnet-int >= 1.5x ort-bitnet (large)"]["met"] is True
    # ort-opset17 / ort-opset23 per round: 0.5, 3, 0.8 -> median 0.8 (not met), while the ratio of
    # the medians, 2 / 2, would be 1.0 (met); the large shape has no ort rows here
    assert got["ort-opset23 >= ort-opset17 (small)"] == {"target": "ort-opset23 >= ort-opset17 (small)",
                                                         "value": "0.80x (min 0.50, max 3.00)", "met": False, "note": ""}
    assert got["ort-opset23 >= ort-opset17 (large)"]["met"] is None
    assert got["fastest path >= 85% of peak (small)"]["met"] is True
    assert got["fastest path >= 85% of peak (large)"] == {
        "target": "fastest path >= 85% of peak (large)", "value": "torch-eager 84.0%", "met": False,
        "note": "the block's float products alone, in the fastest library: 75.0%"}
    jax = got["jax-jit >= 70% of peak (large)"]  # 50% of the peak; its products alone in XLA reach 60%
    assert jax["met"] is True and jax["value"] == "50.0% (the alternative)"
    assert "in XLA: 60.0% of peak; jax-jit runs at 83% of that, so XLA's CPU matmul is the limit" in jax["note"]
    # ort-bitnet 2, 1, 3 s, its float projections 1 s, integer 0.5 s: 2 / 1.5, 1 / 0.5, 3 / 2.5 -> median 1.33
    assert got["ort-bitnet-int >= 1.5x ort-bitnet (large)"]["note"].startswith("estimate 1.33x: ort-bitnet with its projections")
    rows[4]["peak_fraction"] = 0.3  # 50% of XLA's products alone: the block loses as much as XLA
    jax = {t["target"]: t for t in check_targets(result)}["jax-jit >= 70% of peak (large)"]
    assert jax["met"] is False and "so XLA's CPU matmul is not the only limit" in jax["note"]
    rows[4]["peak_fraction"] = 0.5
    result["peaks"][0]["products_round_s"]["xla"] = [0.5]  # 120 GFLOP/s alone: no longer the limit
    jax = {t["target"]: t for t in check_targets(result)}["jax-jit >= 70% of peak (large)"]
    assert jax["met"] is False and "so XLA's CPU matmul is not the limit" in jax["note"]
    rows[4]["peak_fraction"] = None  # not timed
    assert {t["target"]: t for t in check_targets(result)}["jax-jit >= 70% of peak (large)"]["met"] is None
    rows[4]["peak_fraction"] = 0.5
    assert got["torch-eager peak memory < 1 GB (B1 T8192 D512 H8)"]["met"] is False
    # the exact paths' shares of the products alone: the slowest, ort-opset17's 75%, misses 80%;
    # torch-eager's 1 s against the fastest, ort-opset17's 0.8 s: 0.80x, more than 10% slower
    exact = got["every exact path >= 80% of products alone (large)"]
    assert exact["met"] is False and exact["value"] == "slowest ort-opset17 75.0%"
    assert "jax-jit" not in exact["note"]  # jax-jit's row has no products_fraction here: not judged
    fastest = got["torch-eager within 10% of the fastest exact path (large)"]
    assert fastest["met"] is False and fastest["value"] == "0.80x (min 0.80, max 0.80) of ort-opset17"
    rows[1]["round_s"] = [0.5, 2.0, 1.0]  # now per round 2, 2, 2
    assert check_targets(result)[0]["met"] is True
    assert [t["met"] for t in check_targets({"paths": [], "peaks": []})] == [None] * 10

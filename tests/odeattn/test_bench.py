"""The bench command runs and reports what it claims to (no timing is asserted here)."""

import json
import statistics

import numpy as np
import pytest

import ode_ref as R
from odeattn import bench as B
from odeattn.bench import flops
from odeattn.cli import main
from odeattn.conformance.tolerance import relative_error, tolerance


def test_flop_formula_by_hand():
    cfg = R.ODEConfig(hidden_size=4, num_heads=2, ode_solver="heun", ode_steps=3)
    # per evaluation: qkv 2*1*2*4*12 = 192, scores 2*1*2*2*4 = 32, a@v 32, out 2*1*2*4*4 = 64 -> 320
    assert flops(1, 2, 4, cfg) == 320 * 2 * 3


@pytest.mark.parametrize("mode, solver, steps", [("encoder", "rk4", 2), ("decoder", "rk4", 3), ("decoder", "euler", 2),
                                                 ("encoder", "rk38", 1)])
def test_torch_plain_agrees_with_the_spec(mode, solver, steps):
    """The plain block runs the spec's weights (loaded by the seed's state_dict names, strictly)
    and computes the spec's block: its error against the spec in float64 is within the float32
    tolerance derived from the spec's own float32 error on this case (conformance.tolerance)."""
    torch = pytest.importorskip("torch")
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, mode=mode, ode_solver=solver, ode_steps=steps)
    params = R.init_params(cfg, seed=3, perturb_norms=True)  # norm weight and bias not the identity
    x = np.random.default_rng(3).normal(size=(2, 8, 16))
    want = R.ode_block(params, x, cfg)
    e32 = relative_error(R.ode_block({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), cfg), want)
    with torch.no_grad():
        got = B.plain_torch_block(cfg, params)(torch.from_numpy(x.astype(np.float32))).numpy()
    assert relative_error(got, want) <= tolerance(e32, "float32")


@pytest.mark.parametrize("field, change", [("norm_type", {"norm_type": "rms_norm"}), ("use_bitnet", {"use_bitnet": True}),
                                           ("ode_use_pe", {"ode_use_pe": True}), ("ode_solver", {"ode_solver": "rk2_gated"})])
def test_torch_plain_names_a_config_it_does_not_cover(field, change):
    pytest.importorskip("torch")
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, **change)
    with pytest.raises(ValueError, match=f"^{field}: torch-plain covers"):
        B.plain_torch_block(cfg, R.init_params(cfg))


def test_interleave_is_round_robin_with_a_wake_call_and_a_burst(monkeypatch):
    calls, idle = [], []
    monkeypatch.setattr(B.time, "sleep", lambda s: idle.append((s, len(calls))))
    entries = [B.Timed(name, lambda name=name: calls.append(name), 1.0, call_s)
               for name, call_s in (("a", 0.01), ("b", 0.1), ("slow", 1.0))]
    B.interleave(entries, repeats=3, burst_s=0.05)
    turns = [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert turns == ["a", "b", "slow", "b", "slow", "a", "slow", "a", "b"]  # every entry once a round, the start rotating
    starts = [i for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert idle == [(B.SETTLE_S, i) for i in starts]  # idle before every turn, the previous runtime's threads settling
    # round 0, sized from call_s: a: wake + 5 timed (0.05 / 0.01); b: wake + 1 (at least one); slow: no wake (over 0.5 s) + 1
    assert calls[:9] == ["a"] * 6 + ["b"] * 2 + ["slow"]
    assert [len(e.rounds[0]) for e in entries] == [5, 1, 1]
    for e in entries:  # later rounds: sized from the previous burst's median (these calls take microseconds)
        assert [len(t) for t in e.rounds[1:]] == [B.MAX_BURST] * 2 and e.call_s == statistics.median(e.rounds[-1])
    assert len(calls) == 6 + 2 + 1 + 2 * 3 * (1 + B.MAX_BURST)  # later rounds: every entry woken, then a full burst


def _row(shape, path, round_s, **extra):
    return {"shape": shape, "path": path, "round_s": round_s, **extra}


def test_targets_use_the_ratios_paired_per_round():
    # torch-plain / torch-eager per round: 1/2, 4/1, 2/3 -> median 0.67 (not met), while the ratio of
    # the medians, 2 / 2, would be 1.0; ort-bitnet / ort-bitnet-int per round: 2, 0.5, 3 -> median 2 (met)
    rows = [_row("small", "torch-plain", [1.0, 4.0, 2.0]), _row("small", "torch-eager", [2.0, 1.0, 3.0], peak_fraction=0.9),
            _row("large", "ort-bitnet", [2.0, 1.0, 3.0]), _row("large", "ort-bitnet-int", [1.0, 2.0, 1.0]),
            _row("large", "jax-jit", [1.0], peak_fraction=0.5, xla_fraction=0.8),
            _row("large", "torch-eager", [1.0], peak_fraction=0.84),
            _row("small", "ort-opset17", [1.0, 3.0, 2.0]), _row("small", "ort-opset23", [2.0, 1.0, 2.5])]
    # the block's products alone, per forward (60 GFLOP): in XLA 1 s, 60 GFLOP/s, 60% of the peak
    # (below 70%: XLA's matmul is the limit); in torch 0.8 s, 75%
    result = {"paths": rows, "peaks": [{"shape": "large", "round_gflops": [100.0], "xla_round_gflops": [60.0], "flop": 60e9,
                                        "products_round_s": {"xla": [1.0], "torch": [0.8]},
                                        "ort_projections_round_s": {"float": [1.0, 1.0, 1.0], "int": [0.5, 0.5, 0.5]}}],
              "long_context": {"shape": [1, 8192, 512, 8], "rows": {"torch-eager": {"peak_rss_bytes": 2e9}}}}
    got = {t["target"]: t for t in B.targets(result)}
    assert B.paired_ratio(rows, "small", "torch-plain", "torch-eager") == {"median": 2 / 3, "min": 0.5, "max": 4.0}
    assert got["torch-eager >= 1.25x torch-plain (small)"]["met"] is False
    assert B.paired_ratio(rows, "large", "ort-bitnet", "ort-bitnet-int") == {"median": 2.0, "min": 0.5, "max": 3.0}
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
    jax = {t["target"]: t for t in B.targets(result)}["jax-jit >= 70% of peak (large)"]
    assert jax["met"] is False and "so XLA's CPU matmul is not the only limit" in jax["note"]
    rows[4]["peak_fraction"] = 0.5
    result["peaks"][0]["products_round_s"]["xla"] = [0.5]  # 120 GFLOP/s alone: no longer the limit
    jax = {t["target"]: t for t in B.targets(result)}["jax-jit >= 70% of peak (large)"]
    assert jax["met"] is False and "so XLA's CPU matmul is not the limit" in jax["note"]
    rows[4]["peak_fraction"] = None  # not timed
    assert {t["target"]: t for t in B.targets(result)}["jax-jit >= 70% of peak (large)"]["met"] is None
    rows[4]["peak_fraction"] = 0.5
    assert got["torch-eager peak memory < 1 GB (B1 T8192 D512 H8)"]["met"] is False
    rows[1]["round_s"] = [0.5, 2.0, 1.0]  # now per round 2, 2, 2
    assert B.targets(result)[0]["met"] is True and B.targets({"paths": [], "peaks": []})[0]["met"] is None


FLOP = (8 * 8 * 16**2 + 4 * 8**2 * 16) * 4 * 4  # B1 T8 D16: 8 B T D^2 + 4 B T^2 D per evaluation, rk4 x 4 steps


def test_bench_quick_table_structure(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(B.QUICK, "peak_sizes", (32,))
    monkeypatch.setattr(B, "SETTLE_S", 0.0)  # the idle gaps matter for timing, not for the structure
    code = main(["bench", "--quick", "--shape", "1,8,16,2", "--repeats", "2", "--paths",
                 "torch-plain,torch-eager,ort-opset17,ort-int8,ort-bitnet-int", "--json", str(tmp_path / "b.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "vs plain (min..max)" in out and "targets (ratios from this run):" in out and "time vs steps" not in out
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["quick"] and result["repeats"] == 2 and result["scaling"] is None
    rows = {r["path"]: r for r in result["paths"]}
    assert "skipped" not in rows["ort-bitnet-int"] and rows["ort-bitnet-int"]["use_bitnet"]
    timed = {p: r for p, r in rows.items() if "round_s" in r}
    plain = timed["torch-plain"]["round_s"]
    for r in timed.values():
        assert len(r["round_s"]) == 2 and r["min_s"] <= r["median_s"] == statistics.median(r["round_s"])
        assert r["gflop"] == FLOP / 1e9
        ratios = [p / t for p, t in zip(plain, r["round_s"])]
        want = None if r["use_bitnet"] else {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        assert r["vs_plain"] == want  # the plain block has no BitLinear: no ratio across configs
        assert r["setup_s"] >= 0 and r["first_call_s"] > 0 and r["max_rel_error"] < (1e-2 if r["path"] == "ort-int8" else 1e-5)  # int8: test_deploy's measured bound
        assert r["memory"]["peak_rss_bytes"] > 0
    assert timed["torch-plain"]["vs_plain"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert timed["ort-int8"]["max_rel_error"] > 1e-5 and timed["ort-int8"]["file_bytes"] > 0  # lossy int8
    assert timed["torch-eager"]["file_bytes"] is None
    out_bytes = 8 * 16 * 4  # the output alone is a live tensor of the forward
    assert timed["torch-eager"]["memory"]["live_tensor_bytes"] >= out_bytes and timed["ort-opset17"]["memory"]["live_tensor_bytes"] is None
    (peak,) = result["peaks"]
    assert {(k["library"], k["size"]) for k in peak["kernels"]} >= {(lib, s) for lib in ("torch.mm", "numpy", "ort MatMul")
                                                                    for s in ("32x32x32", "8x16x48")}
    assert len(peak["round_gflops"]) == 2
    assert set(peak["products_round_s"]) == {"torch", "numpy", "ort", "xla"} and peak["flop"] == FLOP
    assert set(peak["ort_projections_round_s"]) == {"float", "int"}
    assert all(len(t) == 2 and min(t) > 0 for t in [*peak["products_round_s"].values(), *peak["ort_projections_round_s"].values()])
    assert "the block's products alone" in out and "ONNX Runtime's two projections alone" in out
    fractions = [FLOP / t / 1e9 / p for t, p in zip(timed["torch-eager"]["round_s"], peak["round_gflops"])]
    assert timed["torch-eager"]["peak_fraction"] == pytest.approx(statistics.median(fractions), rel=1e-12)
    assert [t["met"] for t in result["targets"]] == [None] * 8  # no target's shape in this run


def test_bench_long_context_reports_memory_and_skips_the_spec(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(B.QUICK, "peak_sizes", (16,))
    monkeypatch.setattr(B, "SETTLE_S", 0.0)
    monkeypatch.setitem(B.QUICK, "long_shape", (1, 64, 16, 2))
    code = main(["bench", "--quick", "--long-context", "--shape", "1,8,16,2", "--repeats", "1",
                 "--paths", "spec-f64,torch-eager", "--json", str(tmp_path / "b.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "long context: B1 T64 D16 H2" in out and "spec-f64        skipped: the NumPy spec materialises" in out
    result = json.loads((tmp_path / "b.json").read_text())
    long = result["long_context"]["rows"]
    assert long["torch-eager"]["call_s"] > 0 and long["torch-eager"]["peak_rss_bytes"] > 0
    # the forward's live tensors include at least its output, 64 x 16 float32
    assert long["torch-eager"]["live_tensor_bytes"] >= 64 * 16 * 4
    (target,) = [t for t in result["targets"] if t["target"].startswith("torch-eager peak memory")]
    assert target["met"] is (long["torch-eager"]["peak_rss_bytes"] < 1e9) and target["value"].endswith(" MB")


def test_bench_scaling_and_plot(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(B, "PEAK_SIZES", (16,))
    monkeypatch.setitem(B.SHAPES, "small", (1, 8, 16, 2))  # the scaling lines' shape, at fewer points
    monkeypatch.setattr(B, "SCALING", {"steps": (1, 2), "seq": (8, 16), "export_steps": (1, 16), "compile_steps": (1, 4),
                                       "compile_repeats": 1})
    code = main(["bench", "--shape", "1,8,16,2", "--repeats", "1", "--warmup", "0", "--paths", "spec-f64",
                 "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert code == 0
    assert "JAX compile vs steps" in capsys.readouterr().out
    result = json.loads((tmp_path / "b.json").read_text())
    sizes = result["scaling"]["export_vs_steps"]
    assert sizes[-1]["inlined_bytes"] > 2 * sizes[0]["inlined_bytes"]  # the inlined form grows with steps
    assert [e["steps"] for e in result["scaling"]["jax_compile_vs_steps"]] == [1, 4]
    assert [e["seq"] for e in result["scaling"]["time_vs_seq"]] == [8, 16]
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_refuses_bad_arguments(tmp_path, capsys):
    assert main(["bench", "--paths", "torch-eager,cuda-magic", "--no-scaling"]) == 2
    assert "unknown ['cuda-magic']" in capsys.readouterr().err
    assert main(["bench", "--quick", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["odeattn bench: --plot: the plot shows the scaling tables, which --quick skips; drop one of them"]


def test_bench_decode_reports_both_ways_and_the_cache(tmp_path, capsys):
    code = main(["bench", "--decode", "--contexts", "4,8", "--repeats", "1", "--steps", "1",
                 "--decode-runtimes", "torch,ort", "--json", str(tmp_path / "d.json")])
    assert code == 0
    assert "cached decoding vs recomputing the prefix" in capsys.readouterr().out
    rows = json.loads((tmp_path / "d.json").read_text())["decode"]
    assert [(r["context"], r["runtime"]) for r in rows] == [(4, "torch"), (4, "ort"), (8, "torch"), (8, "ort")]
    # rk4 x 1 step: 4 evaluations, K and V of 256 floats per slot: 2 * 4 * 8 * 256 * 4 bytes at context 8
    assert rows[-1]["cache_mb"] == 2 * 4 * 8 * 256 * 4 / 1e6
    assert all(r["speedup"] == r["recompute_s"] / r["cached_s"] for r in rows)


def test_bench_decode_refuses_bad_arguments(capsys):
    assert main(["bench", "--decode", "--contexts", "128,x"]) == 2
    assert capsys.readouterr().err.strip() == "odeattn bench: --contexts: expected comma-separated integers >= 2; got '128,x'"
    assert main(["bench", "--decode", "--decode-runtimes", "torch,tpu"]) == 2
    assert "--decode-runtimes: unknown ['tpu']" in capsys.readouterr().err


def test_bench_memory_reports_both_modes_and_the_ratio(tmp_path, capsys):
    code = main(["bench", "--memory", "--shape", "1,8,16,2", "--memory-steps", "1,4", "--solver", "euler",
                 "--repeats", "1", "--json", str(tmp_path / "m.json"), "--plot", str(tmp_path / "m.png")])
    assert code == 0
    out = capsys.readouterr().out
    assert "training memory vs steps" in out and "with checkpointing: peak 4 steps / 1 step" in out
    result = json.loads((tmp_path / "m.json").read_text())
    rows = {(r["runtime"], r["steps"], r["checkpoint"]): r for r in result["memory"]}
    assert sorted(rows) == sorted((rt, s, c) for rt in ("torch", "jax") for s in (1, 4) for c in (False, True))
    for runtime in ("torch", "jax"):  # without checkpointing the peak grows with steps, and more than with it
        plain = rows[runtime, 4, False]["peak_bytes"] - rows[runtime, 1, False]["peak_bytes"]
        checkpointed = rows[runtime, 4, True]["peak_bytes"] - rows[runtime, 1, True]["peak_bytes"]
        assert plain > 2 * checkpointed >= 0
    ratio = {(r["runtime"], r["checkpoint"]): r for r in result["ratios"]}
    r = ratio["torch", True]
    assert r["peak_ratio"] == rows["torch", 4, True]["peak_bytes"] / rows["torch", 1, True]["peak_bytes"]
    assert r["meets_target"] == (r["peak_ratio"] <= 1.5) and ratio["torch", False]["meets_target"] is None
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_memory_refuses_bad_arguments(capsys):
    assert main(["bench", "--memory", "--memory-steps", "1,0"]) == 2
    assert capsys.readouterr().err.strip() == "odeattn bench: --memory-steps: expected comma-separated integers >= 1; got '1,0'"
    assert main(["bench", "--memory", "--memory-runtimes", "torch,ort"]) == 2
    assert "--memory-runtimes: unknown ['ort']; expected some of torch, jax" in capsys.readouterr().err
    assert main(["bench", "--memory", "--decode"]) == 2
    assert "--memory: measures training, --decode decoding" in capsys.readouterr().err


def test_every_library_runs_the_same_product_chain():
    """The products-alone timings run one computation in every library: product_chain in NumPy is
    the reference, and each library's result agrees within float32 rounding of its sums: measured
    at most 6.8e-7 relative; the bound, 256 roundings (sums of 32 terms, 16 evaluations chained,
    each library in its own order), leaves room for other CPUs' kernels; a product wired to the
    wrong operand differs by O(1)."""
    for module in ("torch", "onnxruntime", "jax"):
        pytest.importorskip(module)
    ops = B.product_operands((1, 16, 32, 4))
    want = B.product_chain(*(ops[k] for k in B.CHAIN_ARGS), 16)
    import torch

    libs = dict(B.product_kernels((1, 16, 32, 4), 16, torch.get_num_threads(), print))
    assert set(libs) == set(B.PRODUCT_LIBS)
    for lib, fn in libs.items():
        got = fn()
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            assert relative_error(np.asarray(g), w) <= 256 * 2.0**-24, lib


def test_ort_projections_sum_every_evaluation_in_both_forms():
    """Float and integer projections of 3 evaluations: each result is 3 times one evaluation's
    product (the integer one exactly, levels less the zero point 128 times the ternary weights)."""
    pytest.importorskip("onnxruntime")
    shape = (1, 4, 8, 2)
    for integer in (False, True):
        once, thrice = (B.ort_projections(shape, e, 1, integer=integer)() for e in (1, 3))
        for a, b in zip(once, thrice):
            assert a.dtype == (np.int32 if integer else np.float32) and a.shape in ((4, 24), (4, 8))
            if integer:
                assert np.array_equal(3 * a, b)
            else:
                np.testing.assert_allclose(b, 3 * a, rtol=1e-6)

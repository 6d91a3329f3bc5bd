"""`odeattn bench`: the command runs and reports what it claims to (no timing is asserted here)."""

import json
import statistics

import pytest

from odeattn.bench import PRODUCT_LIBS, scaling, timing
from odeattn.bench import run as bench_run
from odeattn.cli import main


FLOP = (8 * 8 * 16**2 + 4 * 8**2 * 16) * 4 * 4  # B1 T8 D16: 8 B T D^2 + 4 B T^2 D per evaluation, rk4 x 4 steps


def test_quick_table_gives_every_path_its_paired_ratios_memory_and_peak(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(bench_run.QUICK, "peak_sizes", (32,))
    monkeypatch.setattr(timing, "SETTLE_S", 0.0)  # the idle gaps matter for timing, not for the structure
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
    assert set(peak["products_round_s"]) == set(PRODUCT_LIBS) and peak["flop"] == FLOP
    limit = peak["limit"]  # the library that reached the round's peak most often: one with a matmul timed
    assert limit["gflops"] == statistics.median(peak["round_gflops"]) and limit["of"] == 2 and 1 <= limit["rounds"] <= 2
    assert limit["library"] in {k["library"] for k in peak["kernels"]}
    assert f"the limit: {limit['gflops']:.1f} GFLOP/s (the median of each round's best), reached by {limit['library']}" in out
    assert set(result["machine"]) == {"vendor", "model", "isa", "features"} and out.startswith("machine: ")
    assert set(peak["ort_projections_round_s"]) == {"float", "int"}
    assert all(len(t) == 2 and min(t) > 0 for t in [*peak["products_round_s"].values(), *peak["ort_projections_round_s"].values()])
    assert "the block's products alone" in out and "ONNX Runtime's two projections alone" in out
    fractions = [FLOP / t / 1e9 / p for t, p in zip(timed["torch-eager"]["round_s"], peak["round_gflops"])]
    assert timed["torch-eager"]["peak_fraction"] == pytest.approx(statistics.median(fractions), rel=1e-12)
    assert [t["met"] for t in result["targets"]] == [None] * 10  # no target's shape in this run


def test_long_context_reports_memory_and_skips_the_spec(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(bench_run.QUICK, "peak_sizes", (16,))
    monkeypatch.setattr(timing, "SETTLE_S", 0.0)
    monkeypatch.setitem(bench_run.QUICK, "long_shape", (1, 64, 16, 2))
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


def test_scaling_lines_cover_their_points_and_the_plot_is_a_png(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(bench_run, "PEAK_SIZES", (16,))
    monkeypatch.setattr(timing, "SETTLE_S", 0.0)  # the idle gaps matter for timing, not for the lines' structure
    monkeypatch.setattr(scaling, "SCALING", {"steps": (1, 2), "seq": (8, 16), "export_steps": (1, 16), "compile_steps": (1, 4),
                                       "compile_repeats": 1})
    code = main(["bench", "--shape", "1,8,16,2", "--repeats", "1", "--warmup", "0", "--paths", "spec-f64",
                 "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert code == 0
    out = capsys.readouterr().out
    assert "JAX compile vs steps" in out and "scaling lines, at the shape 1x8x16x2 (B1 T8 D16 H2):" in out  # --shape's, named
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["scaling"]["shape"] == "1x8x16x2" and result["scaling"]["dims"] == [1, 8, 16, 2]
    sizes = result["scaling"]["export_vs_steps"]
    assert sizes[-1]["inlined_bytes"] > 2 * sizes[0]["inlined_bytes"]  # the inlined form grows with steps
    assert [e["steps"] for e in result["scaling"]["jax_compile_vs_steps"]] == [1, 4]
    assert [e["seq"] for e in result["scaling"]["time_vs_seq"]] == [8, 16]
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_decode_reports_both_ways_and_the_cache_size(tmp_path, capsys):
    code = main(["bench", "--decode", "--contexts", "4,8", "--repeats", "1", "--steps", "1",
                 "--decode-runtimes", "torch,ort", "--json", str(tmp_path / "d.json")])
    assert code == 0
    assert "cached decoding vs recomputing the prefix" in capsys.readouterr().out
    rows = json.loads((tmp_path / "d.json").read_text())["decode"]
    assert [(r["context"], r["runtime"]) for r in rows] == [(4, "torch"), (4, "ort"), (8, "torch"), (8, "ort")]
    # rk4 x 1 step: 4 evaluations, K and V of 256 floats per slot: 2 * 4 * 8 * 256 * 4 bytes at context 8
    assert rows[-1]["cache_mb"] == 2 * 4 * 8 * 256 * 4 / 1e6
    assert all(r["speedup"] == r["recompute_s"] / r["cached_s"] for r in rows)


def test_memory_reports_both_modes_and_the_peak_ratio(tmp_path, capsys):
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


@pytest.mark.parametrize("argv, message", [
    pytest.param(["bench", "--paths", "torch-eager,cuda-magic", "--no-scaling"], "--paths: unknown ['cuda-magic']",
                 id="unknown-path"),
    pytest.param(["bench", "--steps", "65537"], "--steps: expected at most 65536 (the config's bound on ode_steps); got 65537",
                 id="steps-past-the-bound"),
    pytest.param(["bench", "--shape", "1,8,15,2"], "--shape: expected four positive integers with d_model a multiple of heads",
                 id="shape-width-not-a-multiple-of-heads"),
    pytest.param(["bench", "--quick", "--plot", "{d}/p.png"],
                 "--plot: the plot shows the scaling tables, which --quick skips; drop one of them", id="plot-with-quick"),
    pytest.param(["bench", "--plot", "{d}/p.png", "--no-scaling"],
                 "--plot: the plot shows the scaling tables, which --no-scaling skips", id="plot-without-scaling"),
    pytest.param(["bench", "--json", "{d}/missing/b.json"], "--json: the folder '{d}/missing' does not exist",
                 id="json-in-a-missing-folder"),
    pytest.param(["bench", "--json", "{d}"], "--json: expected a file path; got the folder '{d}'", id="json-is-a-folder"),
    pytest.param(["bench", "--decode", "--contexts", "128,x"], "--contexts: expected comma-separated integers >= 2; got '128,x'",
                 id="decode-contexts-not-integers"),
    pytest.param(["bench", "--decode", "--decode-runtimes", "torch,tpu"], "--decode-runtimes: unknown ['tpu']",
                 id="decode-unknown-runtime"),
    pytest.param(["bench", "--decode", "--long-context"], "--long-context: an option of the main table, which --decode replaces",
                 id="decode-with-a-main-table-option"),
    pytest.param(["bench", "--memory", "--memory-steps", "1,0"],
                 "--memory-steps: expected comma-separated integers >= 1; got '1,0'", id="memory-steps-below-one"),
    pytest.param(["bench", "--memory", "--memory-steps", "1,x"],
                 "--memory-steps: expected comma-separated integers >= 1; got '1,x'", id="memory-steps-not-integers"),
    pytest.param(["bench", "--memory", "--memory-runtimes", "torch,ort"],
                 "--memory-runtimes: unknown ['ort']; expected some of torch, jax", id="memory-unknown-runtime"),
    pytest.param(["bench", "--memory", "--decode"], "--memory: measures training, --decode decoding", id="memory-with-decode"),
    pytest.param(["bench", "--compile", "--memory"], "--compile: times the first call, --memory another table",
                 id="compile-with-memory"),
    pytest.param(["bench", "--compile", "--quick"], "--quick: an option of the main table, which --compile replaces",
                 id="compile-with-a-main-table-option"),
    pytest.param(["bench", "--memory", "--shape", "1,8,16,2", "--shape", "1,4,8,2"], "--shape: --memory takes one shape; got 2",
                 id="memory-with-two-shapes"),
    pytest.param(["bench", "--memory", "--plot", "{d}/m.svg"], "--plot: expected a file ending in .png; got '{d}/m.svg'",
                 id="memory-plot-not-png"),
    pytest.param(["bench", "--memory", "--paths", "torch-eager"], "--paths: an option of the main table, which --memory replaces",
                 id="memory-with-a-main-table-option"),
    pytest.param(["bench", "--solver", "rk2_gated", "--no-scaling"],
                 "--solver rk2_gated: torch-plain, in the main table's paths, runs the fixed tableaus only",
                 id="gated-solver-with-the-plain-baseline"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


@pytest.mark.parametrize("option", ["--steps", "--repeats"])
def test_counts_below_one_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["bench", option, "0"], f"argument {option}: expected an integer >= 1; got '0'", capsys)


@pytest.mark.parametrize("option", ["--threads", "--warmup"])
def test_negative_counts_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["bench", option, "-1"], f"argument {option}: expected an integer >= 0; got '-1'", capsys)


@pytest.mark.parametrize("missing, argv, extra", [
    ("torch", ["--quick"], "torch"),  # the quick table's torch paths
    ("onnxruntime", ["--quick", "--paths", "spec-f32,ort-opset17"], "onnx"),
    ("jax", ["--no-scaling", "--paths", "spec-f32,jax-jit"], "jax"),
    ("jax", ["--paths", "spec-f32"], "jax"),  # the scaling lines compile with JAX
    ("torch", ["--decode", "--decode-runtimes", "torch"], "torch"),
    ("jax", ["--compile"], "jax"),
])
def test_a_missing_extra_is_named_in_one_line_before_any_work(missing, argv, extra, capsys, monkeypatch):
    """As every other command does: a package the run needs and lacks stops it at once, naming
    the extra, instead of a run of skipped rows."""
    import importlib.util

    from odeattn.commands import bench as B

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    for work in ("run_bench", "decode_result", "compile_result", "memory_result"):
        monkeypatch.setattr(B, work, lambda *a, **kw: pytest.fail("started work before checking the packages"))
    assert main(["bench", *argv]) == 2
    assert capsys.readouterr().err.strip() == (f"odeattn bench: needs the package {missing!r}, which is not installed; "
                                               f"install it with: pip install 'odeattn[{extra}]'")


def test_the_spec_paths_alone_need_no_extra(capsys, monkeypatch):
    from odeattn.commands import bench as B

    monkeypatch.setattr(B, "require", lambda m: pytest.fail(f"required {m}"))
    monkeypatch.setattr(B, "run_bench", lambda *a, **kw: {"stop": True})
    monkeypatch.setattr(B, "format_tables", lambda result: "table")
    assert main(["bench", "--quick", "--paths", "spec-f64,spec-f32"]) == 0


def test_the_scaling_plot_names_its_shape(drawn_figure):
    from odeattn.bench import plot_scaling

    sc = {"shape": "1x8x16x2", "dims": [1, 8, 16, 2], "time_vs_steps": [{"steps": 1, "median_s": 1.0}, {"steps": 2, "median_s": 2.0}]}
    fig = drawn_figure(lambda path: plot_scaling({"scaling": sc}, path))
    assert fig._suptitle.get_text() == "scaling at the shape 1x8x16x2 (B1 T8 D16 H2)"

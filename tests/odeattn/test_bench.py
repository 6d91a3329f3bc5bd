"""The bench command runs and reports what it claims to (no timing is asserted here)."""

import json

import ode_ref as R
from odeattn.bench import flops
from odeattn.cli import main


def test_flop_formula_by_hand():
    cfg = R.ODEConfig(hidden_size=4, num_heads=2, ode_solver="heun", ode_steps=3)
    # per evaluation: qkv 2*1*2*4*12 = 192, scores 2*1*2*2*4 = 32, a@v 32, out 2*1*2*4*4 = 64 -> 320
    assert flops(1, 2, 4, cfg) == 320 * 2 * 3


def test_bench_runs_and_writes_json_and_plot(tmp_path, capsys):
    code = main(["bench", "--shape", "1,8,16,2", "--repeats", "1", "--warmup", "0", "--paths",
                 "spec-f64,torch-eager,ort-opset17,ort-int8", "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert code == 0
    out = capsys.readouterr().out
    assert "float32 matmul peak" in out and "vs eager" in out and "JAX compile vs steps" in out
    assert "file kB" in out and "ONNX --inline file vs steps" in out
    result = json.loads((tmp_path / "b.json").read_text())
    rows = {r["path"]: r for r in result["paths"]}
    assert rows["torch-eager"]["speedup_vs_torch_eager"] == 1.0
    # the ONNX rows carry their file and error; int8 is lossy, the float export is not
    assert rows["torch-eager"]["file_bytes"] is None and rows["ort-int8"]["file_bytes"] > 0
    assert rows["ort-opset17"]["max_rel_error"] < 1e-5 < rows["ort-int8"]["max_rel_error"]
    sizes = result["scaling"]["export_vs_steps"]
    assert sizes[-1]["inlined_bytes"] > 2 * sizes[0]["inlined_bytes"]  # the inlined form grows with steps
    # per evaluation 8*1*8*16^2 + 4*1*8^2*16 = 20480 flop; rk4 (4 stages) x 4 steps
    assert all(r["gflop"] == 20480 * 4 * 4 / 1e9 for r in rows.values())
    assert [e["steps"] for e in result["scaling"]["jax_compile_vs_steps"]] == [1, 4, 16, 64]
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_refuses_bad_arguments(capsys):
    assert main(["bench", "--paths", "torch-eager,cuda-magic", "--no-scaling"]) == 2
    assert "unknown ['cuda-magic']" in capsys.readouterr().err


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

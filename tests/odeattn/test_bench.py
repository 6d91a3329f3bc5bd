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
                 "spec-f64,torch-eager,ort-opset17", "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert code == 0
    out = capsys.readouterr().out
    assert "float32 matmul peak" in out and "vs eager" in out and "JAX compile vs steps" in out
    result = json.loads((tmp_path / "b.json").read_text())
    rows = {r["path"]: r for r in result["paths"]}
    assert rows["torch-eager"]["speedup_vs_torch_eager"] == 1.0
    # per evaluation 8*1*8*16^2 + 4*1*8^2*16 = 20480 flop; rk4 (4 stages) x 4 steps
    assert all(r["gflop"] == 20480 * 4 * 4 / 1e9 for r in rows.values())
    assert [e["steps"] for e in result["scaling"]["jax_compile_vs_steps"]] == [1, 4, 16, 64]
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_refuses_bad_arguments(capsys):
    assert main(["bench", "--paths", "torch-eager,cuda-magic", "--no-scaling"]) == 2
    assert "unknown ['cuda-magic']" in capsys.readouterr().err

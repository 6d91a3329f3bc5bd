import json

from odeattn.cli import main


def test_info_lists_choices_and_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "rk38 (order 4, 4 stages)" in out and "dynamic_tanh" in out and "decoder" in out
    assert "torch" in out and "onnxruntime" in out


def test_the_main_job(tmp_path, capsys):
    """`odeattn conformance`: every golden case on every built-in backend and dtype, in worker
    processes; float64 also within 1e-12 relative (the ports' float64 bar)."""
    code = main(["conformance", "--float64-bound", "1e-12", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(row["backend"], row["dtype"]): row for row in report["summary"]}
    assert set(rows) == {("spec", "float64"), ("torch", "float32"), ("torch", "float64"), ("jax", "float32"),
                         ("jax", "float64"), ("onnxruntime", "float32"), ("onnxruntime-opset23", "float32"),
                         ("onnx-reference", "float32")}
    assert all(row["passed"] == report["cases"] and row["failed"] == 0 for row in rows.values())
    assert not report["backend_errors"] and not report["notes"]

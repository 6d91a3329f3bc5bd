import json

from odeattn.cli import main


def test_info_lists_choices_and_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "rk38 (order 4, 4 stages)" in out and "dynamic_tanh" in out and "decoder" in out
    assert "torch" in out and "onnxruntime" in out


def test_conformance_main_job_on_a_subset(tmp_path, capsys):
    code = main(["conformance", "-k", "block_derf_euler", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert {row["backend"] for row in summary} >= {"spec", "torch", "jax", "onnxruntime", "onnx-reference"}
    assert all(row["failed"] == 0 and row["passed"] == 2 for row in summary)

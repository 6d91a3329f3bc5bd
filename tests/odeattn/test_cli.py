import json

from odeattn.cli import main


def test_info_lists_choices_and_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "rk38 (order 4, 4 stages)" in out and "dynamic_tanh" in out and "decoder" in out


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
                         ("onnxruntime-integer", "float32"), ("onnx-reference", "float32")}
    # every case passes everywhere, but the decode cases on opset 23, which has no decode models,
    # the grad cases on the exported graphs, which have no backward pass, and on the integer
    # BitLinear export, every case but the use_bitnet block cases
    from odeattn.conformance.golden import load_cases

    count = {kind: sum(1 for c in report["results"] if c["backend"] == "spec" and c["case"].startswith(kind))
             for kind in ("decode_", "grad_")}
    assert count["decode_"] >= 6 and count["grad_"] >= 14
    bitnet_blocks = sum(1 for c in load_cases() if c.config.use_bitnet and not c.decoded and c.z1_bar is None)
    assert bitnet_blocks >= 16
    for key, row in rows.items():
        skipped = {"onnxruntime": count["grad_"], "onnx-reference": count["grad_"],
                   "onnxruntime-opset23": count["grad_"] + count["decode_"],
                   "onnxruntime-integer": report["cases"] - bitnet_blocks}.get(key[0], 0)
        assert (row["passed"], row["skipped"], row["failed"]) == (report["cases"] - skipped, skipped, 0), key
    assert not report["backend_errors"] and not report["notes"]


def test_version_and_python_dash_m():
    import subprocess
    import sys

    import ode_ref

    done = subprocess.run([sys.executable, "-m", "odeattn", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"odeattn {ode_ref.__version__}"


def test_info_says_which_backends_are_installed(capsys, monkeypatch):
    from odeattn.conformance import adapters

    monkeypatch.setitem(adapters.BUILTIN, "torch", adapters.Builtin("x:Y", ("odeattn_absent_package",)))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "  spec                 installed" in out
    assert "  torch                not installed (missing odeattn_absent_package)" in out


def test_a_missing_extra_is_named(capsys, monkeypatch):
    import odeattn.export.cli as export_cli

    def needs_onnx(args):
        raise ModuleNotFoundError("No module named 'onnx'", name="onnx")

    monkeypatch.setattr(export_cli, "cmd_run", needs_onnx)
    assert main(["run", "model.onnx"]) == 2
    assert capsys.readouterr().err.strip() == (
        "odeattn run: needs the package 'onnx', which is not installed; install it with: pip install 'odeattn[onnx]'")

"""`odeattn info`: the spec's choices and which backends are installed."""

import importlib.util

from odeattn.cli import main


def test_info_lists_choices_and_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "rk38 (order 4, 4 stages)" in out and "dynamic_tanh" in out and "decoder" in out


def test_info_says_which_backends_are_installed(capsys, monkeypatch):
    from odeattn.conformance import adapters

    monkeypatch.setitem(adapters.BUILTIN, "torch", adapters.Builtin("x:Y", ("odeattn_absent_package",)))
    assert main(["info"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.split("--backend NAME):\n")[1].splitlines())
    assert rows["spec"] == "installed" and rows["torch"] == "not installed (missing odeattn_absent_package)"
    if importlib.util.find_spec("flax"):
        assert rows["flax"] == "installed, runs on request"


def test_info_imports_no_runtime_to_list_them():
    """The versions come from the packages' metadata: torch, jax and ONNX Runtime stay unimported."""
    import importlib.metadata
    import subprocess
    import sys

    code = ("import sys\nfrom odeattn.cli import main\nmain(['info'])\n"
            "print('imported:', sorted(m for m in ('torch', 'jax', 'jaxlib', 'onnx', 'onnxruntime') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "imported: []", lines[-1]
    assert f"  numpy        {importlib.metadata.version('numpy')}" in lines


def test_info_reports_a_package_absent_without_importing_it(capsys, monkeypatch):
    from odeattn.commands import info

    monkeypatch.setattr(info, "OPTIONAL", ("numpy", "odeattn_absent_package"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "  odeattn_absent_package not installed" in out

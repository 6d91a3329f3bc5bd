"""odeattn.cli: the commands in their order, --version, `python -m odeattn`, and the one error exit."""

import pytest

from odeattn.cli import build_parser, main


def test_help_lists_the_commands_in_order(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "{info,init,conformance,export,run,bench,diagnose,demo}" in out


def test_version_and_python_dash_m():
    import subprocess
    import sys

    import ode_ref

    done = subprocess.run([sys.executable, "-m", "odeattn", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"odeattn {ode_ref.__version__}"


def test_a_missing_extra_is_named(capsys, monkeypatch):
    from odeattn.commands import run

    def needs_onnx(args):
        raise ModuleNotFoundError("No module named 'onnx'", name="onnx")

    monkeypatch.setattr(run, "run", needs_onnx)
    assert main(["run", "model.onnx"]) == 2
    assert capsys.readouterr().err.strip() == (
        "odeattn run: needs the package 'onnx', which is not installed; install it with: pip install 'odeattn[onnx]'")


def test_a_missing_package_of_no_extra_is_not_hidden(monkeypatch):
    from odeattn.commands import run

    def needs_something(args):
        raise ModuleNotFoundError("No module named 'odeattn_absent'", name="odeattn_absent")

    monkeypatch.setattr(run, "run", needs_something)
    with pytest.raises(ModuleNotFoundError):
        main(["run", "model.onnx"])


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_a_command_error_is_one_line_per_message_line_and_exit_2(error, capsys, monkeypatch):
    from odeattn.commands import info

    def refuses(args):
        raise error("first: wrong\nsecond: wrong too")

    monkeypatch.setattr(info, "run", refuses)
    assert main(["info"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == ["odeattn info: first: wrong", "odeattn info: second: wrong too"]

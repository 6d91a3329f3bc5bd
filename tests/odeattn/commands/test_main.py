"""odeattn.cli: the commands in their order, --version, `python -m odeattn`, and the one error exit:
bad input in one line, a bug with its traceback."""

import pytest

from odeattn.cli import build_parser, main


def test_help_lists_the_commands_in_order(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "{info,init,conformance,export,run,bench,diagnose,demo}" in out


def test_every_command_has_a_description_and_every_option_its_help():
    """`odeattn CMD --help` says what the command does and what each option is (info, run and
    bench's --solver, --steps and --json had none)."""
    import argparse

    missing = []

    def walk(parser, name):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub, p in a.choices.items():
                    missing.extend([] if p.description else [f"{name} {sub}: no description"])
                    walk(p, f"{name} {sub}")
            elif not a.help:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}: no help")

    walk(build_parser(), "odeattn")
    assert not missing, missing


def test_python_dash_m_odeattn_runs_the_command_and_version_prints_the_version():
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


def test_require_names_a_missing_module_and_its_absent_parent():
    from odeattn.commands.args import require

    require("numpy.linalg")
    for name in ("odeattn_no_such_module", "odeattn_no_such_module.child"):
        with pytest.raises(ModuleNotFoundError) as err:
            require(name)
        assert err.value.name == name


def test_a_missing_package_of_no_extra_is_not_hidden(monkeypatch):
    from odeattn.commands import run

    def needs_something(args):
        raise ModuleNotFoundError("No module named 'odeattn_absent'", name="odeattn_absent")

    monkeypatch.setattr(run, "run", needs_something)
    with pytest.raises(ModuleNotFoundError):
        main(["run", "model.onnx"])


@pytest.fixture
def config(tmp_path):
    import json

    import ode_ref as R

    (tmp_path / "c.json").write_text(json.dumps(R.ODEConfig(hidden_size=8, num_heads=2).to_dict()))
    return str(tmp_path / "c.json")


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_an_error_in_the_checks_is_one_line_per_message_line_and_exit_2(error, config, capsys, monkeypatch):
    """What a command raises while it reads and checks its input (args.user_input) is bad input."""
    from odeattn.commands import diagnose

    def refuses(args):
        raise error("first: wrong\nsecond: wrong too")

    monkeypatch.setattr(diagnose, "check_options", refuses)
    assert main(["diagnose", "--config", config, "--no-plot"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == ["odeattn diagnose: first: wrong",
                                                               "odeattn diagnose: second: wrong too"]


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_an_error_after_the_checks_is_a_bug_and_keeps_its_traceback(error, config, capsys, monkeypatch):
    """The same error raised by the work after the checks is not taken for bad input."""
    from odeattn import diagnose

    def breaks(*args, **kwargs):
        raise error("an internal bug")

    monkeypatch.setattr(diagnose, "diagnose", breaks)
    with pytest.raises(error, match="an internal bug"):
        main(["diagnose", "--config", config, "--no-plot"])
    assert "an internal bug" not in capsys.readouterr().err


def test_a_command_that_failed_prints_one_line_and_returns_its_code(capsys, monkeypatch):
    from odeattn.commands import info
    from odeattn.commands.args import CommandFailed

    def fails(args):
        raise CommandFailed("the quantiser left a projection in float", code=1)

    monkeypatch.setattr(info, "run", fails)
    assert main(["info"]) == 1
    assert capsys.readouterr().err.splitlines() == ["odeattn info: the quantiser left a projection in float"]


@pytest.mark.parametrize("argv, line", [
    pytest.param(["conformance", "--backends", "torch"],
                 "odeattn conformance: unknown option --backends; did you mean --backend?", id="conformance-backends"),
    pytest.param(["conformance", "--backends=torch"],
                 "odeattn conformance: unknown option --backends; did you mean --backend?", id="conformance-backends-equals"),
    pytest.param(["conformance", "generate", "--goldn", "g"],
                 "odeattn conformance: unknown option --goldn; did you mean --golden?", id="conformance-generate-goldn"),
    pytest.param(["run", "m.onnx", "--sq", "3"], "odeattn run: unknown option --sq; did you mean --seq?", id="run-sq"),
    pytest.param(["run", "--treads", "2", "m.onnx"], "odeattn run: unknown option --treads; did you mean --threads?",
                 id="run-treads-before-the-model"),
    pytest.param(["export", "--prefll"], "odeattn export: unknown option --prefll; did you mean --prefill?",
                 id="export-prefil-before-the-required-options"),
    pytest.param(["demo", "train", "--stpes", "3"], "odeattn demo train: unknown option --stpes; did you mean --steps?",
                 id="demo-train-stpes"),
    pytest.param(["info", "--zzz"], "odeattn info: unknown option --zzz", id="info-nothing-near"),
    pytest.param(["--verison"], "odeattn: unknown option --verison; did you mean --version?", id="top-level-verison"),
    pytest.param(["demo"], "odeattn demo: expected a subcommand: train", id="demo-without-a-subcommand"),
    pytest.param([], "odeattn: expected a command: info, init, conformance, export, run, bench, diagnose, demo",
                 id="no-command"),
])
def test_an_unknown_option_or_a_missing_subcommand_is_named(argv, line, capsys):
    """Parser (odeattn/commands/args.py), for every command: an option it does not take is named,
    with the nearest it does (not what a positional made of the option's value), and a missing
    subcommand with the ones there are; one line, exit 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith(line), err


@pytest.mark.parametrize("argv, line", [
    pytest.param(["conformance", "torch"], "odeattn conformance: argument action: invalid choice: 'torch'", id="unknown-action"),
    pytest.param(["demo", "trian"], "odeattn demo: argument demo: invalid choice: 'trian' (choose from 'train')",
                 id="unknown-subcommand"),
    pytest.param(["run", "m.onnx", "--x"], "odeattn run: argument --x: expected one argument", id="option-without-its-value"),
    pytest.param(["run"], "odeattn run: the following arguments are required: model", id="missing-positional"),
    pytest.param(["run", "m.onnx", "--seed", "-1"], "odeattn run: argument --seed: expected an integer >= 0; got '-1'",
                 id="negative-number-value"),  # a value, not an unknown option -1
])
def test_argparse_s_own_message_stays_where_it_is_the_right_one(argv, line, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith(line), err


@pytest.mark.parametrize("argv", [
    pytest.param(["conformance", "-k", "-1"], id="negative-number-value"),
    pytest.param(["conformance", "--back", "spec", "-j2"], id="abbreviation-and-attached-short-value"),
    pytest.param(["conformance", "-k=-x-", "--exclude=-y"], id="values-that-look-like-options"),
    pytest.param(["run", "m.onnx", "--", "extra"], id="after-a-double-dash"),
])
def test_what_argparse_takes_is_still_taken(argv):
    if "--" in argv:  # a positional too many after --: argparse's own message, not an unknown option
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        return
    build_parser().parse_args(argv)


def test_an_option_before_its_command_is_said_to_belong_after_it(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--steps", "4", "init", "foo"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == ("odeattn init: --steps belongs after the command: odeattn init --steps ... "
                                               "(see odeattn init --help)")


def test_a_typo_in_a_config_key_gets_the_nearest_field(tmp_path, capsys):
    import json

    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 8, "num_head": 2}))
    assert main(["diagnose", "--config", str(tmp_path / "c.json"), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "odeattn diagnose: --config: config: unknown key(s) ['num_head']; did you mean 'num_heads'?"

"""`odeattn diagnose`: the table and plot it writes, and bad input refused in one line with exit 2
before any work."""

import json

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main

DIAGNOSE = ["diagnose", "--config", "{d}/c.json", "--plot", "{d}/d.png"]


@pytest.mark.parametrize("argv, message", [
    pytest.param(DIAGNOSE + ["--plot", "{d}/missing/d.png"], "--plot: the folder '{d}/missing' does not exist",
                 id="plot-in-a-missing-folder"),
    pytest.param(DIAGNOSE + ["--plot", "{d}/d.svg"], "--plot: expected a file ending in .png; got '{d}/d.svg'", id="plot-not-png"),
    pytest.param(DIAGNOSE + ["--max-steps", "64", "--ref-steps", "100"],
                 "--ref-steps: expected an even integer >= 2 x --max-steps (128); got 100", id="ref-steps-too-few"),
    pytest.param(DIAGNOSE + ["--ref-steps", "131072"],
                 "--ref-steps: expected at most 65536 (the config's bound on ode_steps); got 131072", id="ref-steps-past-the-bound"),
    pytest.param(DIAGNOSE + ["--weights", "{d}/nan.safetensors"], "--weights: params['ode_func.out_proj.weight'] holds NaN or Inf",
                 id="weights-with-nan"),
    pytest.param(["diagnose", "--config", "{d}/wide.json", "--weights", "{d}/w.safetensors", "--plot", "{d}/d.png"],
                 "--weights: params['ode_func.qkv.weight']: expected shape (36, 12); got (24, 8)", id="weights-of-another-width"),
    pytest.param(["diagnose", "--config", "{d}/bad.json", "--plot", "{d}/d.png"], "--config '{d}/bad.json': not valid JSON",
                 id="config-not-json"),
    pytest.param(["diagnose", "--config", "{d}/typo.json", "--plot", "{d}/d.png"], "--config: config: unknown key(s) ['ode_solvr']",
                 id="config-with-a-typo"),
    pytest.param(DIAGNOSE + ["--weights", "{d}/none.safetensors"], "params file: no such file '{d}/none.safetensors'",
                 id="weights-missing"),
    pytest.param(DIAGNOSE + ["--x", "{d}/empty.npy"], "--x: expected shape (batch, seq, 8) with batch, seq >= 1; got (1, 0, 8)",
                 id="x-empty"),
    pytest.param(DIAGNOSE + ["--x", "{d}/ints.npy"], "--x: expected dtype float32 or float64; got int64", id="x-of-integers"),
    pytest.param(DIAGNOSE + ["--x", "{d}/nan_x.npy"], "--x: holds NaN or Inf", id="x-with-nan"),
    pytest.param(DIAGNOSE + ["--x", "{d}"], "--x: Is a directory: '{d}'", id="x-is-a-folder"),
    pytest.param(DIAGNOSE + ["--x", "{d}/c.json"], "--x: expected a .npy array; '{d}/c.json' is not one (no .npy header)",
                 id="x-not-npy"),
    pytest.param(DIAGNOSE + ["--x", "{d}/none.npy"], "--x: no such file '{d}/none.npy'", id="x-missing"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


@pytest.mark.parametrize("option", ["--max-steps", "--seq"])
def test_counts_below_one_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["diagnose", "--config", "c.json", option, "0"],
                          f"argument {option}: expected an integer >= 1; got '0'", capsys)


@pytest.mark.parametrize("tol", ["0", "1", "1.5", "nan", "x"])
def test_the_tolerance_must_be_a_fraction(tol, capsys, argument_type_refused):
    argument_type_refused(["diagnose", "--config", "c.json", "--tol", tol],
                          f"argument --tol: expected a number in (0, 1); got '{tol}'", capsys)


def test_the_command_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=3)
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(R.init_params(cfg, seed=1), tmp_path / "w.safetensors")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).normal(size=(1, 3, 8)).astype(np.float32))
    code = main(["diagnose", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "--x", str(tmp_path / "x.npy"), "--max-steps", "16", "--ref-steps", "256",
                 "--plot", str(tmp_path / "d.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"weights: {tmp_path / 'w.safetensors'}; x: {tmp_path / 'x.npy'}, shape [1, 3, 8]" in out
    assert "reference: rk4 with 256 steps; its own error (vs 128 steps)" in out
    assert all(f"\n{name:<10}" in out for name in R.TABLEAUS)
    assert "this config (heun, 3 steps): error" in out
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"


def test_a_missing_matplotlib_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    (tmp_path / "c.json").write_text(json.dumps(R.ODEConfig(hidden_size=16, num_heads=2).to_dict()))
    assert main(["diagnose", "--config", str(tmp_path / "c.json"), "--plot", str(tmp_path / "d.png")]) == 2
    assert capsys.readouterr().err.strip() == ("odeattn diagnose: needs the package 'matplotlib', which is not "
                                               "installed; install it with: pip install 'odeattn[bench]'")
    assert not (tmp_path / "d.png").exists()

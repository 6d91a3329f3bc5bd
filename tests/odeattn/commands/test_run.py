"""`odeattn run`: bad input refused in one line with exit 2, and nothing written unless asked."""

import numpy as np
import pytest

from odeattn.cli import main


@pytest.mark.parametrize("argv, message", [
    pytest.param(["run", "{d}/no_z.onnx"], "model: expected an output 'z'; it has outputs ['y']", id="model-without-z"),
    pytest.param(["run", "{d}/no_x.onnx"], "model: expected an input 'x' [batch, seq, d_model]; it has inputs ['a']",
                 id="model-without-x"),
    pytest.param(["run", "{d}/scalar.onnx"], "model: input 'x' must be [batch, seq, d_model] with d_model fixed; it has rank 0",
                 id="model-x-of-rank-0"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}/empty.npy"],
                 "x: expected shape [batch, seq, 8] with batch, seq >= 1; got [1, 0, 8]", id="x-empty"),
    pytest.param(["run", "{d}/m.onnx", "-o", "{d}/z.txt"], "-o: expected a file ending in .npy; got '{d}/z.txt'",
                 id="output-not-npy"),
    pytest.param(["run", "{d}/m.onnx", "-o", "{d}/missing/z.npy"], "-o: the folder '{d}/missing' does not exist",
                 id="output-in-a-missing-folder"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}"], "--x/--padding-mask: Is a directory", id="x-is-a-folder"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


@pytest.mark.parametrize("option", ["--seq", "--batch", "--repeats"])
def test_counts_below_one_are_refused_by_the_parser(option, capsys, argument_type_refused):
    argument_type_refused(["run", "m.onnx", option, "0"], f"argument {option}: expected an integer >= 1; got '0'", capsys)


def test_run_writes_nothing_unless_asked(files, capsys, monkeypatch):
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.iterdir())
    assert main(["run", str(files / "m.onnx")]) == 0
    assert capsys.readouterr().out.startswith("z: shape [2, 8, 8], dtype float32, finite True")
    assert sorted(p.name for p in files.iterdir()) == before
    assert main(["run", str(files / "m.onnx"), "-o", str(files / "z.npy")]) == 0
    assert np.load(files / "z.npy").shape == (2, 8, 8) and "saved to" in capsys.readouterr().out

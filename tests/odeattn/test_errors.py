"""Bad input on the command line: one line naming the field, exit 2, nothing written, before any
work starts, for export, run, bench, diagnose and demo train (the conformance command's are in tests/conformance)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ode_ref as R
from odeattn.cli import main
from odeattn.export.block import export_model

CFG = R.ODEConfig(hidden_size=8, num_heads=2)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(CFG.to_dict()))
    R.save_params(R.init_params(CFG), tmp_path / "w.safetensors")
    (tmp_path / "m.onnx").write_bytes(export_model(CFG, R.init_params(CFG)).SerializeToString())
    nan = R.init_params(CFG)
    nan["ode_func.out_proj.weight"][1, 2] = np.nan
    R.save_params(nan, tmp_path / "nan.safetensors")
    (tmp_path / "bad.json").write_text("{hidden_size: 8")

    def model(inputs, outputs, name):
        graph = helper.make_graph([helper.make_node("Identity", [inputs[0].name], [outputs[0].name])], "g", inputs, outputs)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / name)

    vi = helper.make_tensor_value_info
    model([vi("x", TensorProto.FLOAT, ["b", "t", 8])], [vi("y", TensorProto.FLOAT, ["b", "t", 8])], "no_z.onnx")
    model([vi("a", TensorProto.FLOAT, ["b", "t", 8])], [vi("z", TensorProto.FLOAT, ["b", "t", 8])], "no_x.onnx")
    model([vi("x", TensorProto.FLOAT, [])], [vi("z", TensorProto.FLOAT, [])], "scalar.onnx")
    np.save(tmp_path / "empty.npy", np.zeros((1, 0, 8), np.float32))
    np.save(tmp_path / "ints.npy", np.zeros((1, 2, 8), np.int64))
    np.save(tmp_path / "nan_x.npy", np.full((1, 2, 8), np.nan))
    (tmp_path / "wide.json").write_text(json.dumps({**CFG.to_dict(), "hidden_size": 12}))
    (tmp_path / "typo.json").write_text(json.dumps({**CFG.to_dict(), "ode_solvr": "rk4"}))
    return tmp_path


EXPORT = ["export", "--config", "{d}/c.json", "--weights", "{d}/w.safetensors"]
DIAGNOSE = ["diagnose", "--config", "{d}/c.json", "--plot", "{d}/d.png"]
DEMO = ["demo", "train", "--plot", "{d}/d.png"]


@pytest.mark.parametrize("argv, message", [
    (EXPORT + ["-o", "{d}/missing/m.onnx"], "-o: the folder '{d}/missing' does not exist"),
    (EXPORT + ["-o", "{d}"], "-o: expected a file path; got the folder '{d}'"),
    (EXPORT + ["-o", "/proc/m.onnx"], "-o: '/proc/m.onnx' is not writable"),
    (EXPORT + ["-o", "{d}/x.json"], "-o: expected a file ending in .onnx; got '{d}/x.json'"),
    (["export", "--config", "{d}/c.json", "--weights", "{d}/nan.safetensors", "-o", "{d}/n.onnx"],
     "--weights: params['ode_func.out_proj.weight'] holds NaN or Inf"),
    (["export", "--config", "{d}/bad.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
     "--config '{d}/bad.json': not valid JSON"),
    (["run", "{d}/no_z.onnx"], "model: expected an output 'z'; it has outputs ['y']"),
    (["run", "{d}/no_x.onnx"], "model: expected an input 'x' [batch, seq, d_model]; it has inputs ['a']"),
    (["run", "{d}/scalar.onnx"], "model: input 'x' must be [batch, seq, d_model] with d_model fixed; it has rank 0"),
    (["run", "{d}/m.onnx", "--x", "{d}/empty.npy"], "x: expected shape [batch, seq, 8] with batch, seq >= 1; got [1, 0, 8]"),
    (["run", "{d}/m.onnx", "-o", "{d}/z.txt"], "-o: expected a file ending in .npy; got '{d}/z.txt'"),
    (["run", "{d}/m.onnx", "-o", "{d}/missing/z.npy"], "-o: the folder '{d}/missing' does not exist"),
    (["bench", "--shape", "1,8,15,2"], "--shape: expected four positive integers with d_model a multiple of heads"),
    (["bench", "--plot", "{d}/p.png", "--no-scaling"], "--plot: the plot shows the scaling tables, which --no-scaling skips"),
    (["bench", "--json", "{d}/missing/b.json"], "--json: the folder '{d}/missing' does not exist"),
    (["bench", "--json", "{d}"], "--json: expected a file path; got the folder '{d}'"),
    (["bench", "--memory", "--memory-steps", "1,x"], "--memory-steps: expected comma-separated integers >= 1; got '1,x'"),
    (["bench", "--memory", "--shape", "1,8,16,2", "--shape", "1,4,8,2"], "--shape: --memory takes one shape; got 2"),
    (["bench", "--memory", "--plot", "{d}/m.svg"], "--plot: expected a file ending in .png; got '{d}/m.svg'"),
    (["bench", "--decode", "--long-context"], "--long-context: an option of the main table, which --decode replaces"),
    (["bench", "--memory", "--paths", "torch-eager"], "--paths: an option of the main table, which --memory replaces"),
    (DIAGNOSE + ["--plot", "{d}/missing/d.png"], "--plot: the folder '{d}/missing' does not exist"),
    (DIAGNOSE + ["--plot", "{d}/d.svg"], "--plot: expected a file ending in .png; got '{d}/d.svg'"),
    (DIAGNOSE + ["--max-steps", "64", "--ref-steps", "100"],
     "--ref-steps: expected an even integer >= 2 x --max-steps (128); got 100"),
    (DIAGNOSE + ["--weights", "{d}/nan.safetensors"], "--weights: params['ode_func.out_proj.weight'] holds NaN or Inf"),
    (["diagnose", "--config", "{d}/wide.json", "--weights", "{d}/w.safetensors", "--plot", "{d}/d.png"],
     "--weights: params['ode_func.qkv.weight']: expected shape (36, 12); got (24, 8)"),
    (["diagnose", "--config", "{d}/bad.json", "--plot", "{d}/d.png"], "--config '{d}/bad.json': not valid JSON"),
    (["diagnose", "--config", "{d}/typo.json", "--plot", "{d}/d.png"], "--config: config: unknown key(s) ['ode_solvr']"),
    (DIAGNOSE + ["--weights", "{d}/none.safetensors"], "params file: no such file '{d}/none.safetensors'"),
    (DIAGNOSE + ["--x", "{d}/empty.npy"], "--x: expected shape (batch, seq, 8) with batch, seq >= 1; got (1, 0, 8)"),
    (DIAGNOSE + ["--x", "{d}/ints.npy"], "--x: expected dtype float32 or float64; got int64"),
    (DIAGNOSE + ["--x", "{d}/nan_x.npy"], "--x: holds NaN or Inf"),
    (DIAGNOSE + ["--x", "{d}"], "--x: Is a directory: '{d}'"),
    (DIAGNOSE + ["--x", "{d}/c.json"], "--x: expected a .npy array of floats; '{d}/c.json' is not one NumPy reads"),
    (DEMO + ["--plot", "{d}/missing/d.png"], "--plot: the folder '{d}/missing' does not exist"),
    (DEMO + ["--plot", "{d}/d.svg"], "--plot: expected a file ending in .png; got '{d}/d.svg'"),
    (DEMO + ["--json", "{d}"], "--json: expected a file path; got the folder '{d}'"),
    (DEMO + ["--json", "{d}/d.txt"], "--json: expected a file ending in .json; got '{d}/d.txt'"),
])
def test_one_line_exit_2_and_nothing_written(files, argv, message, capsys):
    before = sorted(p.name for p in files.iterdir())
    assert main([a.format(d=files) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(d=files) in err[0], err
    assert sorted(p.name for p in files.iterdir()) == before


@pytest.mark.parametrize("argv, option", [
    (["run", "m.onnx", "--seq", "0"], "--seq"), (["run", "m.onnx", "--batch", "0"], "--batch"),
    (["run", "m.onnx", "--repeats", "0"], "--repeats"),
    (["bench", "--steps", "0"], "--steps"), (["bench", "--repeats", "0"], "--repeats"),
    (["diagnose", "--config", "c.json", "--max-steps", "0"], "--max-steps"),
    (["diagnose", "--config", "c.json", "--seq", "0"], "--seq"),
    (["demo", "train", "--steps", "0"], "--steps"), (["demo", "train", "--threads", "0"], "--threads"),
])
def test_argument_types_exit_2(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and f"argument {option}: expected an integer >= 1; got '0'" in err[0]


def test_run_writes_nothing_unless_asked(files, capsys, monkeypatch):
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.iterdir())
    assert main(["run", str(files / "m.onnx")]) == 0
    assert capsys.readouterr().out.startswith("z: shape [2, 8, 8], dtype float32, finite True")
    assert sorted(p.name for p in files.iterdir()) == before
    assert main(["run", str(files / "m.onnx"), "-o", str(files / "z.npy")]) == 0
    assert np.load(files / "z.npy").shape == (2, 8, 8) and "saved to" in capsys.readouterr().out


def test_folders_given_as_files_and_negative_counts(files, capsys):
    assert main(["export", "--config", str(files), "--weights", str(files / "w.safetensors"), "-o", str(files / "n.onnx")]) == 2
    assert capsys.readouterr().err.startswith("odeattn: --config/--weights: Is a directory")
    assert main(["run", str(files / "m.onnx"), "--x", str(files)]) == 2
    assert capsys.readouterr().err.startswith("odeattn: --x/--padding-mask: Is a directory")
    for option in ("--threads", "--warmup"):
        with pytest.raises(SystemExit):
            main(["bench", option, "-1"])
        assert f"argument {option}: expected an integer >= 0; got '-1'" in capsys.readouterr().err


@pytest.mark.parametrize("tol", ["0", "1", "1.5", "nan", "x"])
def test_diagnose_tolerance_is_a_fraction(tol, capsys):
    with pytest.raises(SystemExit) as info:
        main(["diagnose", "--config", "c.json", "--tol", tol])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and f"argument --tol: expected a number in (0, 1); got '{tol}'" in err[0]

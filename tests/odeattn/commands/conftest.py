"""What the command tests share: folders of good and bad inputs, and the checks of a refusal."""

import json

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main

CFG = R.ODEConfig(hidden_size=8, num_heads=2)


@pytest.fixture
def files(tmp_path):
    """tmp_path with a config, weights and an exported model that work, and inputs that do not
    (NaN weights, bad JSON, models without x or z, empty, integer or NaN x, a typo in a config)."""
    import onnx
    from onnx import TensorProto, helper

    from odeattn.export.block import export_model

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
    np.save(tmp_path / "narrow.npy", np.zeros((1, 4, 5), np.float32))
    return tmp_path


EXPORT_CONFIGS = {
    "c": R.ODEConfig(hidden_size=16, num_heads=2, ode_steps=2),
    "b": R.ODEConfig(hidden_size=16, num_heads=2, use_bitnet=True, ode_steps=2),
    "d": R.ODEConfig(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2, ode_use_pe=True,
                     positional_encoding="alibi"),
}


@pytest.fixture
def export_files(tmp_path):
    """tmp_path with NAME.json and NAME.safetensors (init_params) for each of EXPORT_CONFIGS: c, a
    float block and b, its BitLinear twin (D 16, 2 heads, 2 steps); d, a decoder block with ALiBi
    (D 14, rk4, 2 steps); and rk5.json, c's config with a solver that does not exist."""
    for name, c in EXPORT_CONFIGS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(c.to_dict()))
        R.save_params(R.init_params(c), tmp_path / f"{name}.safetensors")
    (tmp_path / "rk5.json").write_text(json.dumps({**EXPORT_CONFIGS["c"].to_dict(), "ode_solver": "rk5"}))
    return tmp_path


def _refused_in_one_line(files, argv, message, capsys, command=None):
    """`odeattn argv` ({d}: the files folder) exits 2 with one line on stderr, `odeattn COMMAND: `
    (default argv[0]) then a text holding message, and writes nothing."""
    before = sorted(p.name for p in files.iterdir())
    assert main([a.format(d=files) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(d=files) in err[0], err
    assert err[0].startswith(f"odeattn {command or argv[0]}: "), err
    assert sorted(p.name for p in files.iterdir()) == before


@pytest.fixture
def refused_in_one_line():
    return _refused_in_one_line


def _argument_type_refused(argv, message, capsys):
    """argparse refuses a value of argv: exit 2, one line holding message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and message in err[0], err


@pytest.fixture
def argument_type_refused():
    return _argument_type_refused

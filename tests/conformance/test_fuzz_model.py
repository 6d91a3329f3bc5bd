"""fuzz --model's checks of the file against what it is judged with: its own config, and a Loop
form's steps in the runtime that runs it."""

import importlib.util
import json

import pytest

import ode_ref as R
from odeattn.cli import main


def test_a_config_other_than_the_file_s_and_a_folded_loop_form_are_refused_before_any_draw(tmp_path, capsys):
    """--config other than the one the file was exported with (its metadata holds it) would read as a
    divergence of the runtime: refused, naming the fields. A Loop form with a stored steps default
    run by OpenVINO or IREE, which fold it (the steps input dropped), is refused too; fuzz judges a Loop
    form at the config's step count, which the --json report's artifact names (steps_fed)."""
    pytest.importorskip("onnxruntime")
    from safetensors.numpy import save_file

    from odeattn.export.block import export_model

    config = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=3)
    params = R.init_params(config, seed=3)
    (tmp_path / "c.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "other.json").write_text(json.dumps({**config.to_dict(), "ode_steps": 2, "ode_solver": "euler"}))
    save_file(params, str(tmp_path / "w.safetensors"))
    (tmp_path / "loop.onnx").write_bytes(export_model(config, params, steps_input=True).SerializeToString())
    model, weights = str(tmp_path / "loop.onnx"), str(tmp_path / "w.safetensors")
    argv = ["conformance", "fuzz", "--model", model, "--weights", weights, "--examples", "2", "--repro",
            str(tmp_path / "repro")]
    assert main([*argv, "--config", str(tmp_path / "other.json")]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert not (tmp_path / "repro").exists()
    assert line == ("odeattn conformance fuzz: --config: expected the config the file was exported with; differs at "
                    "ode_solver='euler' (the file's 'rk4'), ode_steps=2 (the file's 3)"), line
    argv += ["--config", str(tmp_path / "c.json")]
    if importlib.util.find_spec("openvino") is not None:
        assert main([*argv, "--runtime", "openvino"]) == 2
        assert "--model: a Loop form with a stored steps default, which OpenVINO folds" in capsys.readouterr().err
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["artifact"]["steps_fed"] == 3

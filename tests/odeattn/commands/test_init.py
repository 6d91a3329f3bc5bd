"""`odeattn init DIR`: a config, seeded weights and an input that load back and that export, run
and diagnose take; nothing overwritten without --force."""

import json

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main

SMALL = ["--hidden-size", "8", "--num-heads", "2", "--steps", "2", "--batch", "3", "--seq", "5"]


def test_the_three_files_load_back(tmp_path, capsys):
    folder = tmp_path / "new" / "block"  # made, parents too
    assert main(["init", str(folder), *SMALL, "--solver", "rk2_gated", "--mode", "decoder", "--norm-type", "rms_norm",
                 "--bitnet", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    config = R.ODEConfig.from_any(json.loads((folder / "config.json").read_text()))
    assert config == R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, ode_solver="rk2_gated", mode="decoder",
                                 norm_type="rms_norm", use_bitnet=True)
    params = R.load_params(folder / "weights.safetensors")
    R.check_params(params, config)
    want = R.init_params(config, seed=3)
    assert all(v.dtype == np.float32 and np.array_equal(v, want[k].astype(np.float32)) for k, v in params.items())
    x = np.load(folder / "x.npy")
    assert x.dtype == np.float32 and x.shape == (3, 5, 8)
    for name in ("config.json", "weights.safetensors", "x.npy"):
        assert f"wrote {folder / name}" in out
    assert f"odeattn run {folder / 'block.onnx'} --x {folder / 'x.npy'}" in out


def test_the_defaults_are_the_documented_block(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    config = R.ODEConfig.from_any(json.loads((tmp_path / "config.json").read_text()))
    assert (config.hidden_size, config.num_heads, config.ode_solver, config.ode_steps, config.mode, config.norm_type,
            config.use_bitnet) == (64, 4, "rk4", 4, "encoder", "layer_norm", False)
    assert np.load(tmp_path / "x.npy").shape == (2, 8, 64)


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    assert main(["init", str(tmp_path), *SMALL]) == 0
    (tmp_path / "x.npy").write_bytes(b"mine")
    capsys.readouterr()
    assert main(["init", str(tmp_path), *SMALL, "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("odeattn init: ") and str(tmp_path / "config.json") in err[0], err
    assert "--force" in err[0] and (tmp_path / "x.npy").read_bytes() == b"mine"
    assert main(["init", str(tmp_path), *SMALL, "--seed", "1", "--force"]) == 0
    assert np.load(tmp_path / "x.npy").shape == (3, 5, 8)


@pytest.mark.parametrize("argv, message", [
    pytest.param(["init", "{d}/c.json"], "DIR: expected a folder; got the file '{d}/c.json'", id="dir-is-a-file"),
    pytest.param(["init", "{d}/new", "--hidden-size", "10", "--num-heads", "4"],
                 "hidden_size: expected a multiple of num_heads=4; got 10", id="width-not-a-multiple-of-heads"),
    pytest.param(["init", "{d}/new", "--seq", str(10**9)], "odeattn init: --hidden-size 64, --batch 2, --seq 1000000000: needs "
                 "an estimated 1.4 TiB (x drawn, (2, 1000000000, 64) float64: 953.7 GiB; x in float32", id="a-long-x"),
    pytest.param(["init", "{d}/new", "--hidden-size", str(10**6), "--num-heads", "1"], "odeattn init: --hidden-size 1000000, "
                 "--batch 2, --seq 8: needs an estimated 58.2 TiB (the parameters drawn, (", id="a-wide-block"),
    pytest.param(["init", "{d}/new", "--lm", "--vocab-size", str(10**11)], "odeattn init: --vocab-size 100000000000, "
                 "--num-layers 2, --hidden-size 64: needs an estimated 186.3 TiB (the parameters drawn, (", id="lm-a-vast-vocabulary"),
    pytest.param(["init", "{d}/new", "--lm", "--num-layers", str(10**9)], "odeattn init: --vocab-size 64, --num-layers "
                 "1000000000, --hidden-size 64: needs an estimated 240.3 TiB", id="lm-a-billion-layers"),
    pytest.param(["init", "{d}/new", "--lm", "--hidden-size", str(10**6), "--num-heads", "1"], "odeattn init: --vocab-size 64, "
                 "--num-layers 2, --hidden-size 1000000: needs an estimated 116.4 TiB", id="lm-a-wide-block"),
    pytest.param(["init", "{d}/new", "--lm", "--mode", "encoder", "--seq", "5"],
                 "--mode, --seq: --lm writes a decoder language model (always mode decoder) and no x.npy", id="lm-with-mode-seq"),
    pytest.param(["init", "{d}/new", "--lm", "--batch", "3"], "--batch: --lm writes", id="lm-with-batch"),
    pytest.param(["init", "{d}/new", "--vocab-size", "32", "--num-layers", "3"],
                 "--vocab-size, --num-layers: apply to --lm only", id="lm-options-without-lm"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


def test_a_negative_seed_is_refused_by_the_parser(capsys, argument_type_refused):
    argument_type_refused(["init", "new", "--seed", "-1"], "argument --seed: expected an integer >= 0; got '-1'", capsys)


def test_export_and_run_take_what_init_writes(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["init", str(tmp_path), *SMALL]) == 0
    assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "weights.safetensors"),
                 "-o", str(tmp_path / "block.onnx")]) == 0
    assert main(["run", str(tmp_path / "block.onnx"), "--x", str(tmp_path / "x.npy")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("z: shape [3, 5, 8], dtype float32, finite True")

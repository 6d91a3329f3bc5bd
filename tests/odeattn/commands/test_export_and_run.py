"""`odeattn export` and `odeattn run` on the export's files: what they write and print, and their
one-line refusals (exit 2, nothing written)."""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.cli import main  # noqa: E402
from odeattn.conformance.tolerance import relative_error  # noqa: E402


@pytest.fixture
def files(tmp_path):
    """tmp_path with c.json / c.safetensors (a float block) and b.json / b.safetensors (BitLinear),
    D 16, 2 heads, 2 steps."""
    for name, c in (("c", R.ODEConfig(hidden_size=16, num_heads=2, ode_steps=2)),
                    ("b", R.ODEConfig(hidden_size=16, num_heads=2, use_bitnet=True, ode_steps=2))):
        (tmp_path / f"{name}.json").write_text(json.dumps(c.to_dict()))
        R.save_params(R.init_params(c), tmp_path / f"{name}.safetensors")
    return tmp_path


def _export_cli(d, *extra, name="c"):
    """`odeattn export` on d's config and weights `name`; its exit code."""
    return main(["export", "--config", str(d / f"{name}.json"), "--weights", str(d / f"{name}.safetensors"), *extra])


def _assert_refused(files, capsys, extra, name, message):
    """`odeattn export ... extra` exits 2 with one line holding message, and writes nothing."""
    before = sorted(p.name for p in files.iterdir())
    assert _export_cli(files, "-o", str(files / "m.onnx"), *extra, name=name) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in files.iterdir()) == before


@pytest.fixture
def export_cli():
    return _export_cli


@pytest.fixture
def assert_refused():
    return _assert_refused


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", norm_type="dynamic_tanh", ode_steps=3), **kw})


def decode_cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2,
                                 ode_use_pe=True, positional_encoding="rope"), **kw})


def test_cli_exports_and_runs_the_block_and_refuses_bad_input_with_exit_2(tmp_path, capsys):
    c = cfg(use_bitnet=True)
    (tmp_path / "c.json").write_text(json.dumps(c.to_dict()))
    R.save_params(R.init_params(c, perturb_norms=True), tmp_path / "w.safetensors")
    assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "m.onnx"), "--opset", "23"]) == 0
    out = capsys.readouterr().out
    assert "nodes stored" in out and "max relative error vs ode_ref" in out
    x = np.random.default_rng(0).normal(size=(1, 4, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "m.onnx"), "--x", str(tmp_path / "x.npy"), "-o", str(tmp_path / "z.npy")]) == 0
    assert np.load(tmp_path / "z.npy").shape == (1, 4, 12)
    assert main(["run", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "r.npy"), "--batch", "5", "--seq", "3"]) == 0
    assert np.load(tmp_path / "r.npy").shape == (5, 3, 12)
    np.save(tmp_path / "bad.npy", x[..., :5])
    assert main(["run", str(tmp_path / "m.onnx"), "--x", str(tmp_path / "bad.npy")]) == 2
    assert "x: expected shape [batch, seq, 12] with batch, seq >= 1; got [1, 4, 5]" in capsys.readouterr().err
    assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "n.onnx"), "--opset", "18"]) == 2
    assert "--opset: the direct route exports opset 17 or 23; got 18" in capsys.readouterr().err
    assert main(["export", "--config", str(tmp_path / "none.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "n.onnx")]) == 2
    assert "none.json" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({**c.to_dict(), "ode_solver": "rk5"}))
    assert main(["export", "--config", str(tmp_path / "bad.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "n.onnx")]) == 2
    assert "ode_solver: expected one of" in capsys.readouterr().err


def test_cli_exports_and_runs_the_cached_models(tmp_path, capsys):
    """`odeattn export --prefill/--decode`, then `odeattn run`: the prefill model on x, and the
    decode-step model generating x's tokens from an empty cache, both give ode_block's z."""
    c = decode_cfg(positional_encoding="alibi")
    params = R.init_params(c, seed=2)
    (tmp_path / "c.json").write_text(json.dumps(c.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    x = np.random.default_rng(0).normal(size=(2, 6, 14)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = R.ode_block(params, x.astype(np.float64), c)
    for flag in ("--prefill", "--decode"):
        model, z = tmp_path / f"{flag[2:]}.onnx", tmp_path / f"{flag[2:]}.npy"
        assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                     "-o", str(model), flag]) == 0
        assert main(["run", str(model), "--x", str(tmp_path / "x.npy"), "-o", str(z)]) == 0
        assert relative_error(np.load(z), want) < 1e-5  # float32 against float64: a few roundings
    capsys.readouterr()
    (tmp_path / "e.json").write_text(json.dumps(decode_cfg(mode="encoder").to_dict()))
    for argv, message in [
        (["--config", str(tmp_path / "e.json"), "--decode"], "odeattn export: mode: cached decoding needs mode='decoder'"),
        (["--config", str(tmp_path / "c.json"), "--prefill", "--opset", "23"], "odeattn export: opset: the prefill and decode-step"),
        (["--config", str(tmp_path / "c.json"), "--prefill", "--route", "torch"], "odeattn export: --prefill: the direct route only"),
    ]:
        assert main(["export", "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "m.onnx"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(message), err


@pytest.mark.parametrize("flag, inputs", [
    pytest.param("--prefill", ["x", "max_len"], id="prefill-without-a-padding-mask-input"),
    pytest.param(None, ["x"], id="block-without-a-padding-mask-input"),
])
def test_no_padding_mask_is_honoured_for_the_block_and_prefill_models(tmp_path, capsys, flag, inputs):
    """`--no-padding-mask` writes a model without the padding_mask input (every token real), which
    `odeattn run` runs to ode_block's z and refuses a mask for by name."""
    c = decode_cfg()
    params = R.init_params(c, seed=1)
    (tmp_path / "c.json").write_text(json.dumps(c.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    x = np.random.default_rng(1).normal(size=(2, 5, 14)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "mask.npy", np.ones((2, 5), bool))
    model = tmp_path / "m.onnx"
    assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"), "-o", str(model),
                 "--no-padding-mask", *([flag] if flag else [])]) == 0
    assert [i.name for i in onnx.load(model).graph.input] == inputs
    assert main(["run", str(model), "--x", str(tmp_path / "x.npy"), "-o", str(tmp_path / "z.npy")]) == 0
    assert relative_error(np.load(tmp_path / "z.npy"), R.ode_block(params, x.astype(np.float64), c)) < 1e-5
    capsys.readouterr()
    assert main(["run", str(model), "--x", str(tmp_path / "x.npy"), "--padding-mask", str(tmp_path / "mask.npy")]) == 2
    assert capsys.readouterr().err.strip() == (
        "odeattn run: padding_mask: this model was exported without a padding_mask input; got one")


def test_cli_writes_the_integer_form(files, capsys, export_cli):
    assert export_cli(files, "-o", str(files / "i.onnx"), "--bitlinear", "integer", name="b") == 0
    out = capsys.readouterr().out
    err = float(out.split("random batch (2 x 8): ")[1].split()[0])
    assert err < 1e-3, out  # a random batch is not a fair test: a level flipped by float32 rounding costs ~1/127
    assert "integer BitLinear: 4 projections x 8 evaluations as exact MatMulInteger" in out  # rk4, 2 steps
    model = onnx.load(files / "i.onnx")
    assert {p.key: p.value for p in model.metadata_props}["bitlinear"] == "integer"
    assert "MatMulInteger" in {n.op_type for f in model.functions for n in f.node}


@pytest.mark.parametrize("extra, name, message", [
    (["--bitlinear", "integer"], "c", "odeattn export: --bitlinear: 'integer' runs BitLinear's projections as integer kernels; expected a "
                                      "config with use_bitnet=true; got use_bitnet=false"),
    (["--bitlinear", "integer", "--decode"], "b", "--bitlinear integer: expected the block model of the direct route; got --decode"),
    (["--bitlinear", "integer", "--route", "torch"], "b",
     "--bitlinear integer: expected the block model of the direct route; got --route torch"),
])
def test_cli_refuses_the_integer_form_where_it_does_not_apply(files, capsys, extra, name, message, assert_refused):
    assert_refused(files, capsys, extra, name, message)


def test_cli_refuses_an_unknown_form_in_one_line(files, capsys, export_cli):
    with pytest.raises(SystemExit) as exit_:
        export_cli(files, "-o", str(files / "m.onnx"), "--bitlinear", "int8", name="b")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "argument --bitlinear: invalid choice: 'int8'" in err[0], err


def test_cli_inline_quantize_optimize_and_run_repeats(files, capsys, export_cli):
    d = files
    assert export_cli(d, "-o", str(d / "i.onnx"), "--inline") == 0
    assert "inlined: no model-local functions" in capsys.readouterr().out
    assert not onnx.load(d / "i.onnx").functions
    assert export_cli(d, "-o", str(d / "q.onnx"), "--quantize", "int8", "--optimize") == 0
    out = capsys.readouterr().out
    assert "int8 dynamic quantisation (lossy, not a conformance backend): 4 projections x 8 evaluations" in out
    assert "max relative error vs ode_ref (float64)" in out and f"optimised model: {d / 'q.optimized.onnx'}" in out
    assert {p.key: p.value for p in onnx.load(d / "q.onnx").metadata_props}["quantization"] == "int8 dynamic (lossy)"
    assert main(["run", str(d / "q.optimized.onnx"), "--repeats", "3", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("z: shape [2, 8, 16]")
    assert lines[1].startswith("latency of a forward (batch 2, seq 8), 3 runs after 1 warm-up, threads 1: median ")
    assert "min..max" in lines[1] and "session created in" in lines[1]


@pytest.mark.parametrize("extra, name, message", [
    (["--quantize", "int8"], "b", "--quantize int8: expected a float block; got use_bitnet=true"),
    (["--inline", "--prefill"], "c", "--inline: expected the block model of the direct route; got --prefill"),
    (["--quantize", "int8", "--optimize", "--route", "torch"], "c",
     "--quantize/--optimize: expected the block model of the direct route; got --route torch"),
])
def test_cli_refuses_deploy_options_that_do_not_apply(files, capsys, extra, name, message, assert_refused):
    assert_refused(files, capsys, extra, name, message)


def test_cli_optimize_path_is_checked_first(files, capsys, export_cli):
    (files / "m.optimized.onnx").mkdir()
    assert export_cli(files, "-o", str(files / "m.onnx"), "--optimize") == 2
    assert f"--optimize: expected a file path; got the folder '{files / 'm.optimized.onnx'}'" in capsys.readouterr().err
    assert not (files / "m.onnx").exists()

"""`odeattn export`: what it writes and prints (the block, its integer and deployment forms, the
cached models), and bad input refused in one line, exit 2, nothing written, before any work."""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.cli import main  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402

EXPORT = ["export", "--config", "{d}/c.json", "--weights", "{d}/w.safetensors"]


def export_argv(name, *extra, output="{d}/m.onnx"):
    """`odeattn export` of export_files' config and weights `name` to output ({d}: the folder)."""
    return ["export", "--config", f"{{d}}/{name}.json", "--weights", f"{{d}}/{name}.safetensors", "-o", output, *extra]


def export_cli(d, name, *extra, output):
    """`odeattn export` of d's config and weights `name` to d/output; its exit code."""
    return main([a.format(d=d) for a in export_argv(name, *extra, output=f"{{d}}/{output}")])


@pytest.mark.parametrize("argv, message", [
    pytest.param(EXPORT + ["-o", "{d}/missing/m.onnx"], "-o: the folder '{d}/missing' does not exist", id="output-in-a-missing-folder"),
    pytest.param(EXPORT + ["-o", "{d}"], "-o: expected a file path; got the folder '{d}'", id="output-is-a-folder"),
    pytest.param(EXPORT + ["-o", "/proc/m.onnx"], "-o: '/proc/m.onnx' is not writable", id="output-not-writable"),
    pytest.param(EXPORT + ["-o", "{d}/x.json"], "-o: expected a file ending in .onnx; got '{d}/x.json'", id="output-not-onnx"),
    pytest.param(["export", "--config", "{d}/c.json", "--weights", "{d}/nan.safetensors", "-o", "{d}/n.onnx"],
                 "--weights: params['ode_func.out_proj.weight'] holds NaN or Inf", id="weights-with-nan"),
    pytest.param(["export", "--config", "{d}/bad.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
                 "--config '{d}/bad.json': not valid JSON", id="config-not-json"),
    pytest.param(["export", "--config", "{d}", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
                 "--config: Is a directory: '{d}'", id="config-is-a-folder"),
    pytest.param(["export", "--config", "{d}/none.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
                 "--config: No such file or directory: '{d}/none.json'", id="config-missing"),
    pytest.param(["export", "--config", "{d}/dec.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx", "--decode",
                  "--no-padding-mask"], "--no-padding-mask: expected the block or prefill model; the decode-step model's "
                 "padding_mask is the cache's record of which slots hold real tokens", id="no-padding-mask-for-the-decode-step-model"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    (files / "dec.json").write_text(json.dumps({**json.loads((files / "c.json").read_text()), "mode": "decoder"}))
    refused_in_one_line(files, argv, message, capsys)


@pytest.mark.parametrize("argv, message", [
    pytest.param(export_argv("c", "--opset", "18"), "--opset: the direct route exports opset 17 or 23; got 18",
                 id="opset-of-the-other-route"),
    pytest.param(export_argv("c", "--route", "torch", "--opset", "17"), "--opset: the torch route exports opset 18 or 23; got 17",
                 id="opset-of-the-direct-route-for-the-torch-route"),
    pytest.param(["export", "--config", "{d}/rk5.json", "--weights", "{d}/c.safetensors", "-o", "{d}/m.onnx"],
                 "ode_solver: expected one of", id="config-with-an-unknown-solver"),
    pytest.param(export_argv("c", "--decode"), "odeattn export: mode: cached decoding needs mode='decoder'",
                 id="decode-step-model-of-an-encoder"),
    pytest.param(export_argv("d", "--prefill", "--opset", "23"), "odeattn export: --opset: the prefill and decode-step",
                 id="prefill-model-at-opset-23"),
    pytest.param(export_argv("d", "--prefill", "--route", "torch"), "odeattn export: --prefill: the direct route only",
                 id="prefill-model-by-the-torch-route"),
    pytest.param(export_argv("c", "--bitlinear", "integer"),
                 "odeattn export: --bitlinear: 'integer' runs BitLinear's projections as integer kernels; expected a "
                 "config with use_bitnet=true; got use_bitnet=false", id="integer-form-of-a-float-block"),
    pytest.param(export_argv("b", "--bitlinear", "integer", "--decode"),
                 "--bitlinear: the decode_step model has the float form only; got 'integer'",
                 id="integer-form-of-the-decode-step-model"),
    pytest.param(export_argv("b", "--bitlinear", "integer", "--route", "torch"),
                 "--bitlinear integer: expected the block model of the direct route; got --route torch",
                 id="integer-form-by-the-torch-route"),
    pytest.param(export_argv("b", "--quantize", "int8"), "--quantize int8: expected a float block; got use_bitnet=true",
                 id="int8-of-a-bitlinear-block"),
    pytest.param(export_argv("c", "--functions", "--prefill"), "--functions: expected the block model of the direct route; got --prefill",
                 id="functions-prefill-model"),
    pytest.param(export_argv("c", "--functions", "--quantize", "int8"), "--functions: --quantize int8 quantises the written-out "
                 "graph, which has no local functions; got --functions --quantize int8", id="functions-quantised"),
    pytest.param(export_argv("d", "--steps-input", "--decode"),
                 "--steps-input: the decode_step model keeps a fixed step count (its cache holds one slot per evaluation, "
                 "ode_steps x stages)", id="loop-form-of-the-decode-step-model"),
    pytest.param(export_argv("c", "--steps-input", "--route", "torch"),
                 "--steps-input: expected the block model of the direct route; got --route torch", id="loop-form-by-the-torch-route"),
    pytest.param(export_argv("c", "--steps-input", "--functions"), "--functions: the Loop form has no local functions; its "
                 "step is written out once, in the Loop's body; got --steps-input", id="loop-form-with-functions"),
    pytest.param(export_argv("c", "--quantize", "int8", "--optimize", "--route", "torch"),
                 "--quantize/--optimize: expected the block model of the direct route; got --route torch",
                 id="deploy-options-by-the-torch-route"),
    pytest.param(export_argv("c", "--keep-io-types"),
                 "--keep-io-types: applies to a half dtype (float16, bfloat16); got --dtype float32",
                 id="keep-io-types-in-float32"),
    pytest.param(export_argv("c", "--dtype", "float16", "--route", "torch"),
                 "--dtype float16: expected the block model of the direct route (the prefill and decode-step models, "
                 "and the torch route, export float32 only); got --route torch", id="half-by-the-torch-route"),
    pytest.param(export_argv("d", "--dtype", "bfloat16", "--prefill"),
                 "--dtype: the prefill model is exported in float32 only", id="half-prefill-model"),
    pytest.param(export_argv("d", "--dtype", "float16", "--decode"),
                 "--dtype: the decode_step model is exported in float32 only", id="half-decode-step-model"),
    pytest.param(export_argv("c", "--dtype", "float16", "--quantize", "int8"),
                 "--quantize int8: expected --dtype float32 (it quantises float32 MatMul weights); got --dtype float16",
                 id="half-quantised-to-int8"),
])
def test_what_the_export_cannot_make_is_refused_in_one_line(export_files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(export_files, argv, message, capsys)


def test_an_unknown_bitlinear_form_is_refused_by_the_parser(export_files, capsys, argument_type_refused):
    argument_type_refused([a.format(d=export_files) for a in export_argv("b", "--bitlinear", "int8")],
                          "argument --bitlinear: invalid choice: 'int8'", capsys)


@pytest.mark.parametrize("dtype", ["float8", "int8", "float64"])
def test_an_unsupported_dtype_is_refused_by_the_parser(export_files, capsys, argument_type_refused, dtype):
    argument_type_refused([a.format(d=export_files) for a in export_argv("c", "--dtype", dtype)],
                          f"argument --dtype: invalid choice: '{dtype}' (choose from 'float32', 'float16', 'bfloat16')", capsys)
    assert not (export_files / "m.onnx").exists()


@pytest.mark.parametrize("dtype, keep, io", [
    ("float16", False, "float16"), ("bfloat16", False, "bfloat16"), ("bfloat16", True, "float32")])
def test_a_half_export_is_checked_against_the_policy_and_runs(export_files, capsys, dtype, keep, io):
    """`odeattn export --dtype` writes the half model, checked against half_block (one storage ulp
    at most, export.half's bound: 2 u); `odeattn run` feeds it and saves z (bfloat16 as float32)."""
    from ode_ref.precision import half_block

    d = export_files
    assert export_cli(d, "d", "--dtype", dtype, *(["--keep-io-types"] if keep else []), output="h.onnx") == 0
    out = capsys.readouterr().out
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    err = float(out.split(f"half_block ({dtype}) on a random batch (2 x 8): ")[1].split()[0])
    assert err <= 2 * u, out
    assert f"{dtype}: weights stored in {dtype}, x and z typed {io}" in out
    x = np.random.default_rng(0).normal(size=(2, 5, 14))
    np.save(d / "x.npy", x.astype(np.float32))
    assert main(["run", str(d / "h.onnx"), "--x", str(d / "x.npy"), "-o", str(d / "z.npy")]) == 0
    assert f"dtype {io}" in capsys.readouterr().out
    cfg, params = R.ODEConfig.from_any(json.loads((d / "d.json").read_text())), R.load_params(d / "d.safetensors")
    want = half_block(params, x, cfg, dtype=dtype)
    assert np.abs(np.load(d / "z.npy").astype(np.float32) - want).max() <= 2 * u * np.abs(want).max()


def test_the_optimised_model_s_path_is_checked_before_any_work(export_files, capsys):
    (export_files / "m.optimized.onnx").mkdir()
    assert export_cli(export_files, "c", "--optimize", output="m.onnx") == 2
    assert f"--optimize: expected a file path; got the folder '{export_files / 'm.optimized.onnx'}'" in capsys.readouterr().err
    assert not (export_files / "m.onnx").exists()


def test_the_integer_form_holds_integer_products_and_meets_the_spec(export_files, capsys):
    assert export_cli(export_files, "b", "--bitlinear", "integer", output="i.onnx") == 0
    out = capsys.readouterr().out
    err = float(out.split("random batch (2 x 8): ")[1].split()[0])
    assert err < 1e-3, out  # a random batch is not a fair test: a level flipped by float32 rounding costs ~1/127
    assert "integer BitLinear: 4 projections x 8 evaluations as exact MatMulInteger" in out  # rk4, 2 steps
    model = onnx.load(export_files / "i.onnx")
    assert {p.key: p.value for p in model.metadata_props}["bitlinear"] == "integer"
    assert not model.functions and "MatMulInteger" in {n.op_type for n in model.graph.node}


def test_the_deploy_options_write_their_forms_and_run_times_the_optimised_model(export_files, capsys):
    d = export_files
    assert export_cli(d, "c", output="i.onnx") == 0  # the default: every step written out
    assert "local functions" not in capsys.readouterr().out and not onnx.load(d / "i.onnx").functions
    assert export_cli(d, "c", "--functions", output="f.onnx") == 0
    assert "local functions: onnxruntime's quantize_dynamic" in capsys.readouterr().out
    assert {f.name for f in onnx.load(d / "f.onnx").functions} == {"ode_func", "ode_step"}
    assert export_cli(d, "c", "--quantize", "int8", "--optimize", output="q.onnx") == 0
    out = capsys.readouterr().out
    assert "int8 dynamic quantisation (lossy, not a conformance backend): 4 projections x 8 evaluations" in out
    assert "max relative error vs ode_ref (float64)" in out and f"optimised model: {d / 'q.optimized.onnx'}" in out
    assert {p.key: p.value for p in onnx.load(d / "q.onnx").metadata_props}["quantization"] == "int8 dynamic (lossy)"
    assert main(["run", str(d / "q.optimized.onnx"), "--repeats", "3", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("z: shape [2, 8, 16]")
    assert lines[1].startswith("latency of a forward (batch 2, seq 8), 3 runs after 1 warm-up, threads 1: median ")
    assert "min..max" in lines[1] and "session created in" in lines[1]


def test_the_loop_form_is_written_and_runs_at_any_step_count(export_files, capsys):
    """`odeattn export --steps-input`, then `odeattn run --steps N`: one file, the spec's z at each N
    (within the suite's float32 rule), and the default (ode_steps) without --steps."""
    from odeattn.conformance.cases.tolerance import tolerance

    d, cfg = export_files, R.ODEConfig.from_any(json.loads((export_files / "d.json").read_text()))
    assert export_cli(d, "d", "--steps-input", output="loop.onnx") == 0
    out = capsys.readouterr().out
    assert "Loop form: input 'steps' (int64, default 2)" in out and "max relative error vs ode_ref" in out
    assert {p.key: p.value for p in onnx.load(d / "loop.onnx").metadata_props}["form"] == "loop"
    params = R.load_params(d / "d.safetensors")
    x = np.random.default_rng(0).normal(size=(2, 5, 14))
    np.save(d / "x.npy", x.astype(np.float32))
    for steps in (None, 1, 3, 16):
        assert main(["run", str(d / "loop.onnx"), "--x", str(d / "x.npy"), "-o", str(d / "z.npy"), "--force"]
                    + ([] if steps is None else ["--steps", str(steps)])) == 0
        at = R.ODEConfig(**{**cfg.to_dict(), "ode_steps": steps or cfg.ode_steps})
        want = R.ode_block(params, x, at)
        e32 = relative_error(R.ode_block(params, x.astype(np.float32), at), want)
        assert relative_error(np.load(d / "z.npy"), want) <= tolerance(e32, "float32"), steps


def test_a_projection_the_quantiser_left_in_float_fails_the_export_in_one_line(export_files, capsys, monkeypatch):
    """No file rather than a wrong one: exit 1, through the one error exit."""
    import onnxruntime.quantization as Q

    monkeypatch.setattr(Q, "quantize_dynamic", lambda model, path, **kw: onnx.save(model, path))
    assert export_cli(export_files, "c", "--quantize", "int8", output="q.onnx") == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["odeattn export: int8 quantisation: expected 32 MatMulInteger nodes "
                                         "(4 projections x 8 evaluations); onnxruntime's quantiser made 0"], captured.err
    assert not (export_files / "q.onnx").exists()


@pytest.mark.parametrize("flag, inputs", [
    pytest.param("--prefill", ["x", "max_len"], id="prefill-without-a-padding-mask-input"),
    pytest.param(None, ["x"], id="block-without-a-padding-mask-input"),
])
def test_no_padding_mask_is_honoured_for_the_block_and_prefill_models(tmp_path, capsys, flag, inputs):
    """`--no-padding-mask` writes a model without the padding_mask input (every token real), which
    `odeattn run` runs to ode_block's z and refuses a mask for by name."""
    c = R.ODEConfig(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2, ode_use_pe=True,
                    positional_encoding="rope")
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


def test_run_names_an_operator_the_cpu_provider_has_no_kernel_for(tmp_path, capsys, refused_in_one_line, bfloat16_tanh):
    """A bfloat16 graph that computes in bfloat16 (not an odeattn export): `odeattn run` refuses it
    in one line, exit 2, naming the operator, when the session is created."""
    bfloat16_tanh(tmp_path / "t.onnx")
    refused_in_one_line(tmp_path, ["run", "{d}/t.onnx"], "CPU provider has no kernel for Tanh (opset 13)", capsys)


@pytest.mark.parametrize("fields, warned", [
    ({"ode_use_pe": False, "positional_encoding": "alibi"}, True),
    ({"ode_use_pe": True, "positional_encoding": "alibi"}, False),
    ({"ode_use_pe": False}, False),  # the default encoding, as init writes it
    ({"ode_use_pe": False, "positional_encoding": "none"}, False),
])
def test_an_encoding_that_ode_use_pe_turns_off_is_exported_with_a_warning(export_files, fields, warned, capsys):
    """Valid, the seed's own semantics (the encoding is read only with ode_use_pe on), but said:
    one warning line on stderr, and the file is written."""
    d = export_files
    (d / "pe.json").write_text(json.dumps({**R.ODEConfig(hidden_size=16, num_heads=2, ode_steps=2).to_dict(), **fields}))
    assert main(["export", "--config", str(d / "pe.json"), "--weights", str(d / "c.safetensors"), "-o", str(d / "pe.onnx")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == (["odeattn export: warning: positional_encoding 'alibi' is not used: ode_use_pe is false, and the seed "
                    "reads the encoding only with it on; the block has no positions (set ode_use_pe true to use it)"]
                   if warned else [])
    assert (d / "pe.onnx").exists()


def test_float16_refuses_weights_beyond_its_range_and_an_export_whose_check_is_not_finite(export_files, capsys,
                                                                                            monkeypatch):
    """A weight beyond 65504 would round to Inf: refused in one line, exit 2, nothing written. An
    export whose own check against the policy is NaN fails (exit 1) and leaves no file."""
    d = export_files
    params = R.load_params(d / "c.safetensors")
    params["ode_func.out_proj.weight"][0, 0] = 1e5
    R.save_params(params, d / "big.safetensors")
    (d / "big.json").write_text((d / "c.json").read_text())
    assert export_cli(d, "big", "--dtype", "float16", output="big.onnx") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["odeattn export: params['ode_func.out_proj.weight']: float16 holds magnitudes up to 65504; got a "
                   "finite value of magnitude 1e+05 (it would round to Inf); scale it down, or use bfloat16 or float32"]
    assert not (d / "big.onnx").exists()
    assert export_cli(d, "big", "--dtype", "bfloat16", output="big.onnx") == 0  # bfloat16 has float32's range
    monkeypatch.setattr("odeattn.export.deploy.check_against_spec", lambda *args: float("nan"))
    assert export_cli(d, "c", "--dtype", "float16", output="nan.onnx") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("odeattn export: --dtype float16: the model's own check against "
                                               "ode_ref.precision.half_block (float16) gives a relative error of nan")
    assert not (d / "nan.onnx").exists()

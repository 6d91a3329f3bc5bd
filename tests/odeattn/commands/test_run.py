"""`odeattn run`: exported models run on x from a file or a random batch, bad input refused in one
line with exit 2, and nothing written unless asked."""

import json

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.cases.tolerance import relative_error


def test_an_exported_block_runs_on_x_from_a_file_or_a_random_batch(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    c = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", norm_type="dynamic_tanh", ode_steps=3, use_bitnet=True)
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


@pytest.mark.parametrize("flag", ["--prefill", "--decode"])
def test_the_exported_cached_models_give_ode_block_s_z(tmp_path, flag):
    """`odeattn export --prefill/--decode`, then `odeattn run`: the prefill model on x, and the
    decode-step model generating x's tokens from an empty cache, both give ode_block's z."""
    pytest.importorskip("onnxruntime")
    c = R.ODEConfig(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2, ode_use_pe=True,
                    positional_encoding="alibi")
    params = R.init_params(c, seed=2)
    (tmp_path / "c.json").write_text(json.dumps(c.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    x = np.random.default_rng(0).normal(size=(2, 6, 14)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model, z = tmp_path / f"{flag[2:]}.onnx", tmp_path / f"{flag[2:]}.npy"
    assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(model), flag]) == 0
    assert main(["run", str(model), "--x", str(tmp_path / "x.npy"), "-o", str(z)]) == 0
    assert relative_error(np.load(z), R.ode_block(params, x.astype(np.float64), c)) < 1e-5  # float32 against float64


@pytest.mark.parametrize("argv, message", [
    pytest.param(["run", "{d}/no_z.onnx"], "model: expected an output 'z'; it has outputs ['y']", id="model-without-z"),
    pytest.param(["run", "{d}/no_x.onnx"], "model: expected an input 'x' [batch, seq, d_model]; it has inputs ['a']",
                 id="model-without-x"),
    pytest.param(["run", "{d}/scalar.onnx"], "model: input 'x' must be [batch, seq, d_model] with d_model fixed; it has rank 0",
                 id="model-x-of-rank-0"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}/empty.npy"],
                 "x: expected shape [batch, seq, 8] with batch, seq >= 1; got [1, 0, 8]", id="x-empty"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}/narrow.npy"],
                 "x: expected shape [batch, seq, 8] with batch, seq >= 1; got [1, 4, 5]", id="x-of-another-width"),
    pytest.param(["run", "{d}/m.onnx", "-o", "{d}/z.txt"], "-o: expected a file ending in .npy; got '{d}/z.txt'",
                 id="output-not-npy"),
    pytest.param(["run", "{d}/m.onnx", "-o", "{d}/missing/z.npy"], "-o: the folder '{d}/missing' does not exist",
                 id="output-in-a-missing-folder"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}"], "--x: Is a directory: '{d}'", id="x-is-a-folder"),
    pytest.param(["run", "{d}/m.onnx", "--x", "{d}/none.npy"], "--x: no such file '{d}/none.npy'", id="x-missing"),
    pytest.param(["run", "{d}/c.json"], "model '{d}/c.json': not an ONNX model", id="model-is-a-json-config"),
    pytest.param(["run", "{d}/w.safetensors"], "model '{d}/w.safetensors': not an ONNX model", id="model-is-weights"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    refused_in_one_line(files, argv, message, capsys)


@pytest.fixture
def arrays(files):
    """files, with .npy files that are not arrays of numbers: a pickle, an object array, a .npz."""
    import pickle

    (files / "pickled.npy").write_bytes(pickle.dumps({"x": [1.0]}))
    np.save(files / "objects.npy", np.array([{"x": 1.0}], dtype=object), allow_pickle=True)
    np.savez(files / "two.npz", x=np.zeros((1, 2, 8), np.float32))
    np.save(files / "x.npy", np.zeros((1, 2, 8), np.float32))
    (files / "cut.npy").write_bytes((files / "x.npy").read_bytes()[:-8])
    return files


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--x", "{d}/c.json"], "--x: expected a .npy array; '{d}/c.json' is not one", id="x-is-a-json-config"),
    pytest.param(["--x", "{d}/pickled.npy"], "--x: expected a .npy array; '{d}/pickled.npy' is not one", id="x-is-a-pickle"),
    pytest.param(["--x", "{d}/objects.npy"], "--x: expected a .npy array of numbers; '{d}/objects.npy' holds Python objects",
                 id="x-is-an-object-array"),
    pytest.param(["--x", "{d}/two.npz"], "--x: expected a .npy array; '{d}/two.npz' is a .npz archive", id="x-is-an-npz"),
    pytest.param(["--x", "{d}/cut.npy"], "--x: expected a .npy array; '{d}/cut.npy' is a damaged .npy file", id="x-cut-short"),
    pytest.param(["--x", "{d}/x.npy", "--padding-mask", "{d}/c.json"],
                 "--padding-mask: expected a .npy array; '{d}/c.json' is not one", id="mask-is-a-json-config"),
    pytest.param(["--x", "{d}/x.npy", "--padding-mask", "{d}/objects.npy"],
                 "--padding-mask: expected a .npy array of numbers; '{d}/objects.npy' holds Python objects",
                 id="mask-is-an-object-array"),
])
def test_an_input_that_is_not_a_npy_array_is_named_and_never_unpickled(arrays, argv, message, capsys, refused_in_one_line):
    """NumPy's advice to load the file unpickled never reaches the user."""
    refused_in_one_line(arrays, ["run", "{d}/m.onnx", *argv], message, capsys)


def test_diagnose_reads_x_the_same_way(arrays, capsys, refused_in_one_line):
    refused_in_one_line(arrays, ["diagnose", "--config", "{d}/c.json", "--x", "{d}/objects.npy", "--no-plot"],
                        "--x: expected a .npy array of numbers; '{d}/objects.npy' holds Python objects", capsys)


@pytest.fixture
def cached(files):
    """files, with a decoder block's prefill model (p.onnx), the same without a padding_mask input
    (pn.onnx), its decode-step model (d.onnx), and inputs of the wrong width, dtype or shape."""
    import ode_ref as R
    from odeattn.export.block import export_decode_model, export_prefill_model

    c = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_steps=1)
    params = R.init_params(c)
    (files / "p.onnx").write_bytes(export_prefill_model(c, params).SerializeToString())
    (files / "pn.onnx").write_bytes(export_prefill_model(c, params, padding_mask=False).SerializeToString())
    (files / "d.onnx").write_bytes(export_decode_model(c, params).SerializeToString())
    np.save(files / "x.npy", np.zeros((2, 4, 8), np.float32))
    np.save(files / "wide.npy", np.zeros((2, 4, 12), np.float32))
    np.save(files / "x64.npy", np.zeros((2, 4, 8)))
    np.save(files / "scalar.npy", np.float32(1.0))
    np.save(files / "mask.npy", np.ones((2, 4), bool))
    np.save(files / "long_mask.npy", np.ones((2, 5), bool))
    np.save(files / "int_mask.npy", np.ones((2, 4), np.int64))
    return files


WIDE = "x: expected shape [batch, seq, 8] with batch, seq >= 1; got [2, 4, 12]"


@pytest.mark.parametrize("model, argv, message", [
    pytest.param("p", ["--x", "{d}/wide.npy"], WIDE, id="prefill-x-of-another-width"),
    pytest.param("p", ["--x", "{d}/x64.npy"], "x: expected dtype float32; got float64", id="prefill-float64-x"),
    pytest.param("p", ["--x", "{d}/x.npy", "--padding-mask", "{d}/long_mask.npy"],
                 "padding_mask: expected shape [2, 4] (batch, seq); got [2, 5]", id="prefill-mask-of-another-shape"),
    pytest.param("p", ["--x", "{d}/x.npy", "--padding-mask", "{d}/int_mask.npy"],
                 "padding_mask: expected dtype bool; got int64", id="prefill-integer-mask"),
    pytest.param("p", ["--padding-mask", "{d}/mask.npy"], "padding_mask: expected shape [2, 8] (batch, seq); got [2, 4]",
                 id="prefill-mask-for-the-random-batch"),
    pytest.param("pn", ["--x", "{d}/x.npy", "--padding-mask", "{d}/mask.npy"],
                 "padding_mask: this model was exported without a padding_mask input; got one", id="prefill-mask-for-a-model-without-one"),
    pytest.param("p", ["--x", "{d}/scalar.npy"], "x: expected shape [batch, seq, 8] with batch, seq >= 1; got []",
                 id="prefill-x-a-scalar"),
    pytest.param("d", ["--x", "{d}/scalar.npy"], "x: expected shape [batch, seq, 8] with batch, seq >= 1; got []",
                 id="decode-step-x-a-scalar"),
    pytest.param("d", ["--x", "{d}/wide.npy"], WIDE, id="decode-step-x-of-another-width"),
    pytest.param("d", ["--x", "{d}/x64.npy"], "x: expected dtype float32; got float64", id="decode-step-float64-x"),
    pytest.param("p", ["--x", "{d}/x64.npy"], "--x: expected dtype float32; got float64 (save it as float32: "
                 "np.save('{d}/x64.npy', x.astype(np.float32)))", id="float64-x-with-its-fix"),
    pytest.param("d", ["--x", "{d}/x.npy", "--padding-mask", "{d}/mask.npy"],
                 "--padding-mask: a decode-step model decodes real tokens only; got a mask", id="decode-step-given-a-mask"),
    pytest.param("d", ["--x", "{d}/x.npy", "--padding-mask", "{d}/int_mask.npy"],
                 "--padding-mask: a decode-step model decodes real tokens only; got a mask", id="decode-step-given-an-integer-mask"),
])
def test_the_cached_models_inputs_are_refused_by_name(cached, model, argv, message, capsys, refused_in_one_line):
    """The prefill and decode-step models' feeds are checked as the block model's are, before the
    session is built: one line naming the input, never ONNX Runtime's error."""
    refused_in_one_line(cached, ["run", f"{{d}}/{model}.onnx", *argv], message, capsys)


@pytest.mark.parametrize("model", ["p", "pn", "d"])
def test_the_cached_models_run_on_good_inputs(cached, model, capsys):
    assert main(["run", str(cached / f"{model}.onnx"), "--x", str(cached / "x.npy")]) == 0
    assert capsys.readouterr().out.startswith("z: shape [2, 4, 8], dtype float32, finite True")
    if model == "p":
        assert main(["run", str(cached / "p.onnx"), "--x", str(cached / "x.npy"), "--padding-mask", str(cached / "mask.npy")]) == 0


@pytest.fixture
def looped(files):
    """files, with the Loop form of the block of m.onnx (loop.onnx: an input steps, default 2)."""
    from odeattn.export.block import export_model

    c = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2)
    (files / "loop.onnx").write_bytes(export_model(c, R.init_params(c), steps_input=True).SerializeToString())
    return files


@pytest.mark.parametrize("model, steps, message", [
    pytest.param("loop", "0", "--steps: expected an integer in [1, 65536]; got 0", id="zero-steps"),
    pytest.param("loop", "-2", "--steps: expected an integer in [1, 65536]; got -2", id="negative-steps"),
    pytest.param("loop", "65537", "--steps: expected an integer in [1, 65536]; got 65537", id="past-the-config-s-maximum"),
    pytest.param("loop", str(2**63 - 1), f"--steps: expected an integer in [1, 65536]; got {2**63 - 1}", id="int64-max"),
    pytest.param("loop", str(2**63), f"--steps: expected an integer in [1, 65536]; got {2**63}", id="past-int64"),
    pytest.param("m", "3", "--steps: this model runs a fixed step count (ode_steps=2, unrolled in the graph); export it "
                 "with steps_input=True (odeattn export --steps-input) to choose the steps at run time; got --steps 3",
                 id="steps-for-a-model-without-a-steps-input"),
])
def test_a_step_count_the_model_cannot_take_is_refused_in_one_line(looped, model, steps, message, capsys, refused_in_one_line):
    pytest.importorskip("onnxruntime")
    refused_in_one_line(looped, ["run", f"{{d}}/{model}.onnx", "--steps", steps], message, capsys)


@pytest.mark.parametrize("model, kind", [("p", "prefill"), ("d", "decode_step")])
def test_the_cached_models_refuse_steps(cached, model, kind, capsys, refused_in_one_line):
    refused_in_one_line(cached, ["run", f"{{d}}/{model}.onnx", "--x", "{d}/x.npy", "--steps", "2"],
                        f"--steps: the {kind} model keeps a fixed step count (ode_steps=1: its cache layout depends on it)",
                        capsys)


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


def test_a_bad_stored_step_count_is_refused_in_one_line_before_the_session(looped, capsys, refused_in_one_line):
    """A Loop-form file whose stored steps is int32: named, not ONNX Runtime's session error."""
    import onnx

    model = onnx.load(looped / "loop.onnx")
    stored = next(t for t in model.graph.initializer if t.name == "steps")
    stored.CopyFrom(onnx.numpy_helper.from_array(np.array(2, np.int32), "steps"))
    onnx.save(model, looped / "loop.onnx")
    refused_in_one_line(looped, ["run", "{d}/loop.onnx"], "the model's stored steps: expected an int64 scalar; got int32 "
                        "of shape []", capsys)


def test_help_describes_every_argument(capsys):
    """Each of run's arguments has its help: the model, and the random batch's options."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for described in ("model an .onnx file written by odeattn export", "--batch BATCH without --x: the random batch's batch size",
                      "--seq SEQ without --x: the random batch's length", "--seed SEED without --x: the random batch's seed"):
        assert described in out


def test_a_float16_model_refuses_x_beyond_its_range_and_fails_on_its_own_overflow(tmp_path, capsys):
    """x beyond 65504 would round to Inf: refused, exit 2. hope over 16 tokens overflows float16
    (its factor r cosh(a) passes 65504 at position 12): refused as the ports refuse it, in their
    words, exit 2. Weights within float16 whose q overflows it inside the model on a finite x:
    exit 1, one line, where `run` said `finite False` and exited 0."""
    pytest.importorskip("onnxruntime")
    c = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, positional_encoding="hope")
    (tmp_path / "c.json").write_text(json.dumps(c.to_dict()))
    R.save_params(R.init_params(c), tmp_path / "w.safetensors")
    assert main(["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "h.onnx"), "--dtype", "float16"]) == 0
    x = np.random.default_rng(0).normal(size=(1, 16, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "h.onnx"), "--x", str(tmp_path / "x.npy")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "odeattn run: positional_encoding: hope in float16 multiplies q and k by r cosh(a) = 7e+04 at position 15, "
        "beyond float16's 65504, so they overflow to NaN; float16 runs hope on sequences (and caches) of at most 12 "
        "tokens here (layer_idx 0); got 16; use bfloat16 or float32"]
    from odeattn.export.block import export_model

    plain = R.ODEConfig(hidden_size=8, num_heads=2)  # weights within float16, but q = h W passes 65504
    loud = {k: v * 6e4 / np.abs(v).max() if k == "ode_func.qkv.weight" else v for k, v in R.init_params(plain).items()}
    (tmp_path / "loud.onnx").write_bytes(export_model(plain, loud, dtype="float16").SerializeToString())
    np.save(tmp_path / "x4.npy", x[:, :4])
    capsys.readouterr()
    assert main(["run", str(tmp_path / "loud.onnx"), "--x", str(tmp_path / "x4.npy")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "odeattn run: z: the float16 model gave NaN or Inf on a finite x: float16 overflowed (float16 holds magnitudes "
        "up to 65504); run the float32 or bfloat16 export"]
    x[0, 3, 1] = -7e4
    np.save(tmp_path / "x.npy", x[:, :4])
    assert main(["run", str(tmp_path / "h.onnx"), "--x", str(tmp_path / "x.npy")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "odeattn run: --x: float16 holds magnitudes up to 65504; got a finite value of magnitude 7e+04 (it would round "
        "to Inf); scale it down, or use bfloat16 or float32"]

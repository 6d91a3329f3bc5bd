"""The decode-step ONNX model: a generation loop in ONNX Runtime equals the spec; and the
positional encodings pass the checker in both the block and the decode-step model.
(The block's agreement with the spec on the positional golden cases runs in the main job.)"""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.fair import make_inputs  # noqa: E402
from odeattn.conformance.tolerance import relative_error, tolerance  # noqa: E402
from odeattn.export.block import check, decode_names, export_decode_model, export_model, export_prefill_model  # noqa: E402
from odeattn.export.runtime import session  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2,
                                 ode_use_pe=True, positional_encoding="rope"), **kw})


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_generation_loop_in_onnxruntime_equals_the_spec(encoding):
    """A padded 4-token prompt through the prefill model, then 32 tokens decoded by the decode-step
    model, feeding each step's present cache back as the next past, all in ONNX Runtime: every
    token's z equals ode_block on the whole sequence within the suite's float32 tolerance (derived
    from the spec's own float32 error on that sequence). head_dim 7 is odd: its last channel is
    not rotated."""
    c = cfg(positional_encoding=encoding)  # BitLinear: in the decode golden cases (36 tokens leave no fair draw)
    params = R.init_params(c, seed=5, perturb_norms=True)
    prompt, steps = 4, 32
    x, mask, _ = make_inputs(c, params, 3, prompt + steps, seed=5, padding=True, decoded=steps)
    want = R.ode_block(params, x, c, mask)
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), c, mask), want)

    prefill, decode = export_prefill_model(c, params), export_decode_model(c, params)
    check(prefill)
    check(decode)
    past, present = decode_names(c)
    z, *state = session(prefill).run(["z", *present], {"x": x[:, :prompt].astype(np.float32), "padding_mask": mask[:, :prompt],
                                                       "max_len": np.array(prompt + steps)})
    feeds = dict(zip(past, state))
    got = [z]
    sess = session(decode)
    for i in range(prompt, prompt + steps):
        z, *state = sess.run(["z", *present], {"x_t": x[:, i:i + 1].astype(np.float32), "index": np.array(i), **feeds})
        got.append(z)
        feeds = dict(zip(past, state))
    assert relative_error(np.concatenate(got, axis=1), want) <= tolerance(e32, "float32")
    np.testing.assert_array_equal(feeds["padding_mask"], mask)


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_positions_pass_the_checker(opset, encoding):
    c = cfg(positional_encoding=encoding)
    model = export_model(c, R.init_params(c), opset=opset)
    check(model)
    ops = {n.op_type for n in model.graph.node}
    assert ({"Cos", "Sin"} <= ops) == (encoding == "rope") and ("Abs" in ops) == (encoding == "alibi")


def test_decode_model_refuses_what_it_cannot_do():
    for export in (export_prefill_model, export_decode_model):
        with pytest.raises(ValueError, match="^mode: cached decoding needs mode='decoder'"):
            export(cfg(mode="encoder"), R.init_params(cfg(mode="encoder")))
    with pytest.raises(ValueError, match="^opset: the prefill and decode-step models are exported at opset 17"):
        export_decode_model(cfg(), R.init_params(cfg()), opset=23)


def test_cli_exports_and_runs_the_cached_models(tmp_path, capsys):
    """`odeattn export --prefill/--decode`, then `odeattn run`: the prefill model on x, and the
    decode-step model generating x's tokens from an empty cache, both give ode_block's z."""
    import json

    from odeattn.cli import main

    c = cfg(positional_encoding="alibi")
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
    (tmp_path / "e.json").write_text(json.dumps(cfg(mode="encoder").to_dict()))
    for argv, message in [
        (["--config", str(tmp_path / "e.json"), "--decode"], "odeattn export: mode: cached decoding needs mode='decoder'"),
        (["--config", str(tmp_path / "c.json"), "--prefill", "--opset", "23"], "odeattn export: opset: the prefill and decode-step"),
        (["--config", str(tmp_path / "c.json"), "--prefill", "--route", "torch"], "odeattn export: --prefill: the direct route only"),
    ]:
        assert main(["export", "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "m.onnx"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(message), err

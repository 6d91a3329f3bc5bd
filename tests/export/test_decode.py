"""The decode-step ONNX model: a generation loop in ONNX Runtime equals the spec; and the
positional encodings pass the checker in both the block and the decode-step model.
(The block's agreement with the spec on the positional golden cases runs in the main job;
`odeattn export --prefill/--decode`: test_cli.py.)"""

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


@pytest.mark.parametrize("export, fields, kwargs, message", [
    pytest.param(export_prefill_model, dict(mode="encoder"), {}, "^mode: cached decoding needs mode='decoder'",
                 id="prefill-of-an-encoder"),
    pytest.param(export_decode_model, dict(mode="encoder"), {}, "^mode: cached decoding needs mode='decoder'",
                 id="decode-step-of-an-encoder"),
    pytest.param(export_decode_model, {}, dict(opset=23),
                 "^opset: the prefill and decode-step models are exported at opset 17", id="decode-step-at-opset-23"),
])
def test_decode_model_refuses_what_it_cannot_do(export, fields, kwargs, message):
    with pytest.raises(ValueError, match=message):
        export(cfg(**fields), R.init_params(cfg(**fields)), **kwargs)



"""The decode-step ONNX model: a generation loop in ONNX Runtime equals the spec; and the
positional encodings pass the checker in both the block and the decode-step model.
The prefill model without a padding_mask input, and the feeds of both models refused by name.
(The block's agreement with the spec on the positional golden cases runs in the main job;
`odeattn export --prefill/--decode`: tests/odeattn/commands.)"""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.fair import make_inputs  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402
from odeattn.export.block import check, decode_names, export_decode_model, export_model, export_prefill_model  # noqa: E402
from odeattn.export.runtime import session  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=14, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=2,
                                 ode_use_pe=True, positional_encoding="rope"), **kw})


# The encodings, the seed's positional family included; "+ssmax" adds SSMax
ENCODINGS = ["rope", "alibi", "sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam", "pape_ri+ssmax",
             "bam+ssmax"]


def encoded(encoding, **kw):
    name, _, ssmax = encoding.partition("+")
    return cfg(positional_encoding=name, use_ssmax=bool(ssmax), **kw)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_generation_loop_in_onnxruntime_equals_the_spec(encoding):
    """A padded 4-token prompt through the prefill model, then 32 tokens decoded by the decode-step
    model, feeding each step's present cache back as the next past, all in ONNX Runtime: every
    token's z equals ode_block on the whole sequence within the suite's float32 tolerance (derived
    from the spec's own float32 error on that sequence). head_dim 7 is odd: its last channel is
    not rotated."""
    c = encoded(encoding)  # BitLinear: in the decode golden cases (36 tokens leave no fair draw)
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


# What each encoding adds to the main graph (prepare), once: the rotary tables' Cos and Sin, ALiBi's
# and BAM's distance (Abs), BAM's Pow, hope's and BAM's Exp (BAM's alpha), SSMax's Log. PaPE's term
# is in the function ode_func, once per evaluation: one MatMul more than rope's (the state by ab)
MAIN_OPS = {"Cos": ("rope", "sinusoidal_rotary"), "Abs": ("alibi", "bam"), "Pow": ("bam",), "Exp": ("hope", "bam"),
            "Log": ("ssmax",)}


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_positions_pass_the_checker(opset, encoding):
    c = encoded(encoding)
    model = export_model(c, R.init_params(c), opset=opset, functions=True)
    check(model)
    ops = {n.op_type for n in model.graph.node}
    for op, owners in MAIN_OPS.items():
        assert (op in ops) == any(o in encoding.split("+") for o in owners), op
    def matmuls(m):
        return sum(n.op_type == "MatMul" for f in m.functions if f.name == "ode_func" for n in f.node)

    rope = encoded("rope")
    assert matmuls(model) == matmuls(export_model(rope, R.init_params(rope), opset=opset, functions=True)) + encoding.startswith("pape")


@pytest.mark.parametrize("export, fields, kwargs, message", [
    pytest.param(export_prefill_model, dict(mode="encoder"), {}, "^mode: cached decoding needs mode='decoder'",
                 id="prefill-of-an-encoder"),
    pytest.param(export_decode_model, dict(mode="encoder"), {}, "^mode: cached decoding needs mode='decoder'",
                 id="decode-step-of-an-encoder"),
    pytest.param(export_decode_model, {}, dict(opset=23),
                 "^opset: the prefill and decode-step models are exported at opset 17", id="decode-step-at-opset-23"),
    *(pytest.param(export, dict(positional_encoding="bam", use_ssmax=True, ssmax_length="padded"), {},
                   "^ssmax_length: cached decoding needs ssmax_length='visible'", id=f"{name}-of-the-seed-s-ssmax-rule")
      for name, export in (("prefill", export_prefill_model), ("decode-step", export_decode_model))),
])
def test_decode_model_refuses_what_it_cannot_do(export, fields, kwargs, message):
    with pytest.raises(ValueError, match=message):
        export(cfg(**fields), R.init_params(cfg(**fields)), **kwargs)




def test_a_prefill_model_without_a_padding_mask_input_is_the_one_with_an_all_real_mask():
    """export_prefill_model(padding_mask=False): no padding_mask input; z and the cache equal, bit
    for bit, those of the model with one fed an all-True mask, and the spec's prefill within
    float32 rounding; OnnxDecoder feeds it no mask and refuses one by name."""
    from odeattn.export.decode import OnnxDecoder, session_runner

    c = cfg()
    params = R.init_params(c, seed=3)
    without = export_prefill_model(c, params, padding_mask=False)
    check(without)
    assert [i.name for i in without.graph.input] == ["x", "max_len"]
    x = np.random.default_rng(3).normal(size=(2, 5, 14))
    x32 = x.astype(np.float32)
    z, cache = OnnxDecoder(c, prefill_run=session_runner(without)).prefill(x32, None, 7)
    z_mask, cache_mask = OnnxDecoder(c, prefill_run=session_runner(export_prefill_model(c, params))).prefill(
        x32, np.ones((2, 5), bool), 7)
    np.testing.assert_array_equal(z, z_mask)
    for a, b in zip(cache.arrays, cache_mask.arrays):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(cache.arrays[-1], np.broadcast_to(np.arange(7) < 5, (2, 7)))
    want, _ = R.prefill(params, x, c, max_len=7)
    assert relative_error(z, want) < 1e-5
    with pytest.raises(ValueError, match="^padding_mask: this model was exported without a padding_mask input; got one"):
        OnnxDecoder(c, prefill_run=session_runner(without)).prefill(x32, np.ones((2, 5), bool))


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("export/test_decode")


@pytest.fixture(scope="session")
def decoders():
    """(a prefill decoder, a decode-step decoder) over ONNX Runtime sessions of cfg()'s models."""
    from odeattn.export.decode import OnnxDecoder, session_runner

    c = cfg()
    params = R.init_params(c)
    return (OnnxDecoder(c, prefill_run=session_runner(export_prefill_model(c, params))),
            OnnxDecoder(c, decode_run=session_runner(export_decode_model(c, params))))


X14 = np.zeros((2, 4, 14), np.float32)


@pytest.mark.parametrize("call, error, message", [
    pytest.param(lambda p, d: p.prefill(np.zeros((2, 4, 12), np.float32)), ValueError,
                 r"^x: expected shape \[batch, seq, 14\] with batch, seq >= 1; got \[2, 4, 12\]", id="prefill-x-of-another-width"),
    pytest.param(lambda p, d: p.prefill(X14.astype(np.float64)), TypeError, "^x: expected dtype float32; got float64",
                 id="prefill-float64-x"),
    pytest.param(lambda p, d: p.prefill(X14[0]), ValueError, r"^x: expected shape \[batch, seq, 14\].*; got \[4, 14\]",
                 id="prefill-x-of-rank-2"),
    pytest.param(lambda p, d: p.prefill(X14, np.ones((2, 5), bool)), ValueError,
                 r"^padding_mask: expected shape \[2, 4\] \(batch, seq\); got \[2, 5\]", id="prefill-mask-of-another-shape"),
    pytest.param(lambda p, d: p.prefill(X14, np.ones((2, 4), np.int64)), TypeError,
                 "^padding_mask: expected dtype bool; got int64", id="prefill-integer-mask"),
    pytest.param(lambda p, d: p.prefill(X14, None, 3), ValueError,
                 "^max_len: expected an integer >= the prompt's 4 tokens; got 3", id="prefill-max-len-below-the-prompt"),
    pytest.param(lambda p, d: p.prefill(X14, None, 6.0), ValueError, "^max_len: expected an integer", id="prefill-float-max-len"),
    pytest.param(lambda p, d: d.generate(np.zeros((2, 4, 12), np.float32)), ValueError,
                 r"^x: expected shape \[batch, seq, 14\] with batch, seq >= 1; got \[2, 4, 12\]", id="generate-x-of-another-width"),
    pytest.param(lambda p, d: d.generate(X14.astype(np.float64)), TypeError, "^x: expected dtype float32; got float64",
                 id="generate-float64-x"),
    pytest.param(lambda p, d: d.generate(np.zeros((2, 0, 14), np.float32)), ValueError, r"^x: .* got \[2, 0, 14\]",
                 id="generate-empty-x"),
    pytest.param(lambda p, d: d.decode_step(X14, d.empty(2, 4)), ValueError,
                 r"^x_t: expected shape \[batch, 1, 14\] with batch, seq >= 1; got \[2, 4, 14\]", id="decode-step-of-four-tokens"),
    pytest.param(lambda p, d: d.decode_step(X14[:, :1], d.empty(3, 4)), ValueError,
                 r"^past_key_0: expected shape \[batch, max_len, 2, 7\] with batch = 2, as in x_t; got \[3, 4, 2, 7\]",
                 id="decode-step-cache-of-another-batch"),
    pytest.param(lambda p, d: d.decode_run({**d.step_feed(X14[:, :1], d.empty(2, 4)), "index": np.array(0, np.int32)}),
                 TypeError, "^index: expected dtype int64; got int32", id="decode-run-int32-index"),
])
def test_the_cached_models_feeds_are_refused_by_name(decoders, call, error, message):
    """OnnxDecoder's inputs, and (over session_runner) every feed of the two models, are checked
    before ONNX Runtime sees them: one error naming the input, not ONNX Runtime's."""
    with pytest.raises(error, match=message):
        call(*decoders)


@pytest.mark.parametrize("bad", ["negative", "past-the-end", "float", "bool", "spec-cache"])
def test_the_onnx_decoder_refuses_a_bad_cache_as_the_ports_do(bad):
    """OnnxDecoder.decode_step runs the spec's index check before feeding the model (whose
    Where(slot == index) writes no slot for an index out of range), and names a KVCache as not its
    own; the model is never run (no session: decode_run is None)."""
    from odeattn.export.decode import OnnxCache, OnnxDecoder

    c = cfg()
    decoder = OnnxDecoder(c)
    cache = decoder.empty(1, 4)
    x_t = np.zeros((1, 1, c.hidden_size), np.float32)
    if bad == "spec-cache":
        _, spec = R.prefill(R.init_params(c), np.zeros((1, 2, c.hidden_size)), c, max_len=4)
        with pytest.raises(TypeError, match=r"^cache: expected an ONNX Runtime cache from OnnxDecoder.prefill "
                                            r"\(an OnnxCache\); got KVCache$"):
            decoder.decode_step(x_t, spec)
        return
    index = {"negative": -1, "past-the-end": 5, "float": 2.0, "bool": True}[bad]
    with pytest.raises((TypeError, ValueError), match=r"^cache\.index: expected an integer in \[0, 4\) "):
        decoder.decode_step(x_t, OnnxCache(cache.arrays, index))

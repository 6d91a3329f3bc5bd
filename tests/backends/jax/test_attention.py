"""The JAX port's attention over tiles of heads (attention.tiled): every tile form agrees with
the spec within the suite's bound, and small inputs run untiled."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402


def as32(params):
    return {k: v.astype(np.float32) for k, v in params.items()}


# The conformance cases are too small to be tiled (their scores fit one 4 MiB tile), so these tests
# run the tiled forms on small inputs by shrinking the tile: one head a tile, two heads, and three
# of the four heads (a remainder of one). Each head's scores, mask, softmax and values are the same
# formulas on the same numbers either way, but XLA picks its dot kernel by the operands' shapes (a
# tile's one head against all heads at once), so they may sum in another order: last-bit
# differences (seen here, up to 2.4e-7 absolute on values of order 1). So the tiled block is held
# to the conformance suite's own bound for that (conformance/cases/tolerance.py): tolerance(e32,
# "float32"), with e32 the spec's own float32 error (for the gradients, that of the spec's
# hand-written backward pass). A wrong tile (a head's mask or bias swapped with another's, a
# dropped remainder) is an O(1) error. That the tiles never gather an array split by batch rows
# over devices is checked with the sharded runs (test_sharding.py).

BATCH, SEQ, HEADS, D_MODEL = 3, 16, 4, 32
HEAD_SCORES = BATCH * SEQ * SEQ * 4  # bytes of one head's float32 scores over the batch
TILE_CONFIGS = {  # (config, heads a tile, padded): each tile form once; ALiBi's bias (1, heads, ...) unpadded
    "encoder": ({}, 2, False),
    "rope decoder": ({"ode_use_pe": True, "positional_encoding": "rope", "mode": "decoder"}, 3, True),
    "alibi": ({"ode_use_pe": True, "positional_encoding": "alibi"}, 1, False),  # padded: the gradient test
}


def tile_inputs(overrides, solver="rk4"):
    cfg = R.ODEConfig(hidden_size=D_MODEL, num_heads=HEADS, ode_solver=solver, ode_steps=2, **overrides)
    padding = np.ones((BATCH, SEQ), bool)
    padding[1, 10:] = False
    x = np.random.default_rng(0).normal(size=(BATCH, SEQ, D_MODEL))
    return cfg, R.init_params(cfg, seed=1), x, padding


def check_tiled_forward(cfg, params, x, mask, tiled, spec_attention=None):
    """The tiled block in float32 within the suite's bound of the spec's float64 output."""
    params32, x32 = as32(params), x.astype(np.float32)
    want = R.ode_block(params, x, cfg, mask, attention=spec_attention)
    e32 = relative_error(R.ode_block(params32, x32, cfg, mask, attention=spec_attention), want)
    got = J.ode_block_jit(params32, x32, cfg, mask, attention=tiled)
    assert relative_error(np.asarray(got), want) <= tolerance(e32, "float32")


@pytest.mark.parametrize("config", TILE_CONFIGS)
def test_tiled_forward_within_the_suite_bound(config):
    overrides, heads_a_tile, padded = TILE_CONFIGS[config]
    cfg, params, x, padding = tile_inputs(overrides)
    check_tiled_forward(cfg, params, x, padding if padded else None, J.SelfAttention(cfg).with_tiles(heads_a_tile * HEAD_SCORES))


def test_tiled_variant_within_the_suite_bound():
    """A variant's narrowed mask (a sliding window) goes through the tiles too."""
    cfg, params, x, padding = tile_inputs({})
    tiled = J.LocalWindowAttention(cfg, window=3).with_tiles(HEAD_SCORES)
    check_tiled_forward(cfg, params, x, padding, tiled, R.LocalWindowAttention(cfg, window=3))


def test_tiled_decoding_within_the_suite_bound():
    """A decode step's one query against max_len cached keys, one head a tile."""
    cfg, params, x, padding = tile_inputs({"mode": "decoder"})
    tiled = J.SelfAttention(cfg).with_tiles(BATCH * (SEQ + 1) * 4)
    params32, x32 = as32(params), x.astype(np.float32)
    prompt, token = slice(0, SEQ - 1), slice(SEQ - 1, SEQ)
    want = R.decode_step(params, x[:, token], R.prefill(params, x[:, prompt], cfg, padding[:, prompt], max_len=SEQ + 1)[1], cfg)[0]
    spec32 = R.decode_step(params32, x32[:, token], R.prefill(params32, x32[:, prompt], cfg, padding[:, prompt],
                                                              max_len=SEQ + 1)[1], cfg)[0]
    _, cache = J.prefill(params32, x32[:, prompt], cfg, padding[:, prompt], max_len=SEQ + 1, attention=tiled)
    got = J.decode_step(params32, x32[:, token], cache, cfg, attention=tiled)[0]
    assert relative_error(np.asarray(got), want) <= tolerance(relative_error(spec32, want), "float32")


def test_tiled_gradients_within_the_suite_bound():
    """jax.grad through the tiles (float32) against the spec's hand-written backward pass
    (ode_ref.backward, float64), with e32 the spec's own float32 gradient error. At the suite's
    LLVM level 0 too: with the softmax's max differentiated, every entry came out NaN there
    (backends/jax/attention.py's softmax)."""
    cfg, params, x, padding = tile_inputs(TILE_CONFIGS["alibi"][0], solver="euler")
    w = np.random.default_rng(3).normal(size=x.shape)  # loss = sum(w * z(1)): z1_bar = w
    want_x, want_p = R.ode_block_vjp(params, x, cfg, w, padding)
    spec32_x, spec32_p = R.ode_block_vjp(as32(params), x.astype(np.float32), cfg, w.astype(np.float32), padding)
    tiled = J.SelfAttention(cfg).with_tiles(2 * HEAD_SCORES)
    loss = lambda p, x: jnp.sum(w.astype(np.float32) * J.ode_block(p, x, cfg, padding, attention=tiled))  # noqa: E731
    got_p, got_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(as32(params), x.astype(np.float32))
    for name in [None, *params]:
        got, want, spec32 = (got_x, want_x, spec32_x) if name is None else (got_p[name], want_p[name], spec32_p[name])
        assert relative_error(np.asarray(got), want) <= tolerance(relative_error(spec32, want), "float32"), name


def test_small_inputs_are_not_tiled(count_primitive):
    """Scores within one tile run untiled: no loop besides the steps' and the stages' scans; tiled,
    one loop over the heads in the one evaluation of f."""
    cfg, params, x, _ = tile_inputs({})
    params32, x32 = as32(params), x.astype(np.float32)
    scans = [count_primitive(jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg, attention=a))(params32, x32).jaxpr, "scan")
             for a in (J.SelfAttention(cfg), J.SelfAttention(cfg).with_tiles(HEAD_SCORES))]
    assert scans == [2, 3]


def test_the_softmax_s_gradient_does_not_go_through_its_max():
    """The scores' gradient program has no comparison with the row's max (the port's softmax holds
    the max constant; the spec's formula, differentiated, has one): routed there, it needs an entry
    equal to a max XLA may compute in another fusion, rounded otherwise, and was NaN at LLVM's level
    0; scaled_attention, which attn calls, has none either. The value is the spec's softmax, bit for bit."""
    softmax, scaled_attention = J.attention.softmax, J.attention.scaled_attention
    s = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=s.shape).astype(np.float32)
    mask = np.ones((1, 3, 3), bool)  # s as q, k and v: 3 tokens of width 5

    def compares(f):
        return jax.jit(jax.grad(lambda s: jnp.sum(f(s) * w))).lower(s).as_text().count("stablehlo.compare")

    assert compares(softmax) == compares(lambda s: scaled_attention(s, s, s, mask, None, 0.5)) == 0
    assert compares(lambda s: R.softmax(s, xp=jnp)) > 0
    np.testing.assert_array_equal(np.asarray(jax.jit(softmax)(s)), np.asarray(jax.jit(lambda s: R.softmax(s, xp=jnp))(s)))

"""The JAX port's attention over tiles of heads (attention.tiled) computes the untiled values.

The conformance cases are too small to be tiled (their scores fit one 4 MiB tile), so this file
runs the tiled forms on small inputs by shrinking the tile: one head a tile, two heads (tiles
within a batch entry), and two whole batch entries (a batch of three leaves a remainder). Each
head's scores, mask, softmax and values are the same formulas on the same numbers either way, but
XLA picks its dot kernel by the operands' shapes (a tile's (seq, head_dim) dot against the whole
(batch, heads, seq, head_dim) one), so they may sum in another order: last-bit differences (seen
here, up to 2.4e-7 absolute on values of order 1). So the tiled block is held to the conformance
suite's own bound for that (conformance/tolerance.py): tolerance(e32, dtype), with e32 the float32
error of the untiled computation (the spec's, for the forward; for the gradients, the untiled
float32 gradient's against the float64 one). A wrong tile (a head's mask or bias swapped with
another's, a dropped remainder) is an O(1) error."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402
from odeattn.backends.jax.attention import SelfAttention  # noqa: E402
from odeattn.backends.jax.variants import LocalWindowAttention  # noqa: E402
from odeattn.conformance.tolerance import relative_error, tolerance  # noqa: E402

BATCH, SEQ, HEADS, D_MODEL = 3, 16, 4, 32
HEAD_SCORES = SEQ * SEQ * 4  # bytes of one head's float32 scores
TILES = {"one head": HEAD_SCORES, "two heads": 2 * HEAD_SCORES, "two batch entries": 2 * HEADS * HEAD_SCORES}
CONFIGS = {  # (config, tile, padded): each tile form once, the one-head tile with ALiBi's per-head bias
    "encoder": ({}, "two batch entries", False),
    "rope decoder": ({"ode_use_pe": True, "positional_encoding": "rope", "mode": "decoder"}, "two heads", True),
    "alibi": ({"ode_use_pe": True, "positional_encoding": "alibi"}, "one head", True),
}


def attention_class(base, tile_bytes):
    return type(f"Tiled{base.__name__}", (base,), {"score_tile_bytes": tile_bytes})


def inputs(overrides, dtype="float64", solver="rk4"):
    cfg = R.ODEConfig(hidden_size=D_MODEL, num_heads=HEADS, ode_solver=solver, ode_steps=2, **overrides)
    padding = np.ones((BATCH, SEQ), bool)
    padding[1, 10:] = False
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg, seed=1).items()}
    return cfg, params, np.random.default_rng(0).normal(size=(BATCH, SEQ, D_MODEL)).astype(dtype), padding


def as32(*arrays):
    return [{k: v.astype(np.float32) for k, v in a.items()} if isinstance(a, dict) else a.astype(np.float32)
            for a in arrays]


def check_tiled_forward(cfg, params, x, mask, tiled, spec_attention=None):
    """The tiled block in float32 within the suite's bound of the spec's float64 output."""
    params32, x32 = as32(params, x)
    want = R.ode_block(params, x, cfg, mask, attention=spec_attention)
    e32 = relative_error(R.ode_block(params32, x32, cfg, mask, attention=spec_attention), want)
    got = J.ode_block_jit(params32, x32, cfg, mask, attention=tiled)
    assert relative_error(np.asarray(got), want) <= tolerance(e32, "float32")


@pytest.mark.parametrize("config", CONFIGS)
def test_tiled_forward_within_the_suite_bound(config):
    overrides, tile, padded = CONFIGS[config]
    cfg, params, x, padding = inputs(overrides)
    check_tiled_forward(cfg, params, x, padding if padded else None, attention_class(SelfAttention, TILES[tile])(cfg))


def test_tiled_variant_within_the_suite_bound():
    """A variant's narrowed mask (a sliding window) goes through the tiles too."""
    cfg, params, x, padding = inputs({})
    tiled = attention_class(LocalWindowAttention, HEAD_SCORES)(cfg, window=3)
    check_tiled_forward(cfg, params, x, padding, tiled, R.LocalWindowAttention(cfg, window=3))


def test_tiled_gradients_within_the_suite_bound():
    """jax.grad through the tiles (float32) against the spec's hand-written backward pass
    (ode_ref.backward, float64), with e32 the spec's own float32 gradient error."""
    cfg, params, x, padding = inputs(CONFIGS["alibi"][0], solver="euler")
    w = np.random.default_rng(3).normal(size=x.shape)  # loss = sum(w * z(1)): z1_bar = w
    want_x, want_p = R.ode_block_vjp(params, x, cfg, w, padding)
    spec32_x, spec32_p = R.ode_block_vjp(*as32(params, x), cfg, w.astype(np.float32), padding)
    tiled = attention_class(SelfAttention, 2 * HEAD_SCORES)(cfg)
    loss = lambda p, x: jnp.sum(w.astype(np.float32) * J.ode_block(p, x, cfg, padding, attention=tiled))  # noqa: E731
    got_p, got_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(*as32(params, x))
    for name in [None, *params]:
        got, want, spec32 = (got_x, want_x, spec32_x) if name is None else (got_p[name], want_p[name], spec32_p[name])
        assert relative_error(np.asarray(got), want) <= tolerance(relative_error(spec32, want), "float32"), name


def test_small_inputs_are_not_tiled():
    """Scores within one tile run untiled: no loop in the program."""
    cfg, params, x = inputs({}, "float32")[:3]
    text = str(jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(params, x))
    assert text.count("scan") == 1  # the steps' own scan only
    tiled = attention_class(SelfAttention, HEAD_SCORES)(cfg)
    assert str(jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg, attention=tiled))(params, x)).count("scan") > 1

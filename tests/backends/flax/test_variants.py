"""The staged API's example variants written in Flax (odeattn.backends.flax.variants): each equals
the spec's class of the same name in the ODE block, over the full sequence and in cached
decoding; the stages are the API's; and a training step (optax, the dropout rng) and NNX's bridge."""

import inspect

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases import run_decode
from odeattn.conformance.cases.tolerance import relative_error

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402

from odeattn.backends import flax as F  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402

FLOAT64 = 1e-12
CFG = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, ode_solver="midpoint", ode_steps=1)
PROMPT, SEQ = 3, 6


def apply_all(block, variables, x, mask):
    """(the full-sequence z, the prefill's z and each decoded token's, concatenated), eagerly."""
    z = block.apply(variables, x, padding_mask=mask)
    z_p, state = block.apply(variables, x[:, :PROMPT], padding_mask=mask[:, :PROMPT], mutable=["cache"])
    out = [z_p]
    for i in range(PROMPT, SEQ):
        z_t, state = block.apply({**variables, **state}, x[:, i:i + 1], mutable=["cache"])
        out.append(z_t)
    return z, np.concatenate(out, axis=1)


@pytest.mark.parametrize("variant", R.VARIANTS, ids=lambda v: v.__name__)
def test_each_flax_variant_equals_the_spec_s(variant):
    params = R.init_params(CFG, seed=5, perturb_norms=True)
    x = np.random.default_rng(5).normal(size=(2, SEQ, 8))
    mask = np.ones((2, SEQ), bool)
    mask[1, :2] = False
    spec = variant(CFG)
    want = R.ode_block(params, x, CFG, mask, attention=spec)
    want_decode = run_decode(CFG, params, x, mask, PROMPT, attention=spec)
    flax_variant = getattr(F, variant.__name__)
    settings = {k: v for k, v in vars(spec).items() if k != "config"}
    block = F.ODEAttentionBlock(config=CFG, attention=flax_variant(config=CFG, **settings), max_len=SEQ)
    with jax.enable_x64(True):
        z, z_decode = apply_all(block, F.from_state_dict(CFG, params), x, mask)
    assert relative_error(z, want) <= FLOAT64
    assert relative_error(z_decode, want_decode) <= FLOAT64
    assert relative_error(want, R.ode_block(params, x, CFG, mask)) > 1e-3  # the variant changes the block


def test_a_variant_installs_as_a_class_and_checks_its_settings():
    variables = F.from_state_dict(CFG, R.init_params(CFG, dtype=np.float32))
    x = jnp.ones((1, 4, 8), jnp.float32)
    by_class = F.ODEAttentionBlock(config=CFG, attention=F.RecentKeysAttention).apply(variables, x)
    by_instance = F.ODEAttentionBlock(config=CFG, attention=F.RecentKeysAttention(config=CFG)).apply(variables, x)
    assert (by_class == by_instance).all()
    with pytest.raises(ValueError, match=r"^window: expected an integer >= 1; got 0"):
        F.RecentKeysAttention(config=CFG, window=0)
    with pytest.raises(ValueError, match=r"^output_scale: expected a finite number; got nan"):
        F.ScaledOutputAttention(config=CFG, output_scale=float("nan"))


def test_the_stages_have_the_api_s_signatures():
    api = {"_project_inner": ["x"], "project": ["x"], "preprocess_qkv": ["q", "k", "v", "kwargs"],
           "build_mask": ["t", "padding_mask", "kwargs"], "attn": ["q", "k", "v", "mask", "kwargs"],
           "postprocess_attn": ["y", "padding_mask", "deterministic", "kwargs"], "output_proj": ["y"]}
    for cls in (F.SelfAttention, *(getattr(F, v.__name__) for v in R.VARIANTS)):
        for stage, names in api.items():
            assert list(inspect.signature(getattr(cls, stage)).parameters)[1:] == names, (cls.__name__, stage)


def test_a_training_step_with_optax_and_dropout():
    """Gradients through module.apply equal the JAX port's; dropout draws on the `dropout` rng,
    a mask of its own at each evaluation of f, the same for the same key."""
    optax = pytest.importorskip("optax")
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, ode_solver="euler", dropout=0.25)
    params = R.init_params(cfg, seed=6, perturb_norms=True)
    x = np.random.default_rng(6).normal(size=(2, 5, 8))
    block = F.ODEAttentionBlock(config=cfg)

    def loss(variables, x, key=None):
        rngs = {} if key is None else {"dropout": key}
        return jnp.mean(block.apply(variables, x, deterministic=key is None, rngs=rngs) ** 2)

    plain, dropping = jax.jit(jax.value_and_grad(loss)), jax.jit(jax.value_and_grad(loss))
    with jax.enable_x64(True):
        variables = F.from_state_dict(cfg, params)
        before, grads = plain(variables, x)
        want = jax.jit(jax.grad(lambda p, x: jnp.mean(J.ode_block(p, x, cfg) ** 2)))(
            {k: jnp.asarray(v) for k, v in params.items()}, x)
        got = F.to_state_dict(grads)
        assert all(relative_error(got[k], want[k]) <= FLOAT64 for k in want)

        optimizer = optax.adam(1e-2)
        state = optimizer.init(variables)
        value, grads = dropping(variables, x, jax.random.key(1))
        again, _ = dropping(variables, x, jax.random.key(1))
        other, _ = dropping(variables, x, jax.random.key(2))
        assert value == again and value != other and value != before and np.isfinite(value)
        updates, state = optimizer.update(grads, state, variables)
        after, _ = plain(optax.apply_updates(variables, updates), x)
        assert after < before

    # each evaluation (2 steps of one stage: one traced step, run twice) drops its own entries
    seen = []

    class Recording(F.SelfAttention):
        def postprocess_attn(self, y, padding_mask, deterministic, **kwargs):
            out = super().postprocess_attn(y, padding_mask, deterministic, **kwargs)
            jax.debug.callback(lambda a: seen.append(np.asarray(a) == 0), out)
            return out

    params32 = {k: v.astype(np.float32) for k, v in params.items()}
    recording = F.ODEAttentionBlock(config=cfg, attention=Recording)
    jax.jit(lambda v, x: recording.apply(v, x, deterministic=False, rngs={"dropout": jax.random.key(3)}))(
        F.from_state_dict(cfg, params32), jnp.asarray(x, jnp.float32))
    jax.effects_barrier()
    assert len(seen) == 2 and len({a.tobytes() for a in seen}) == 2


def test_nnx_bridge_wraps_the_block():
    from flax import nnx
    from flax.nnx import bridge

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1)
    x = jnp.asarray(np.random.default_rng(7).normal(size=(1, 4, 8)), jnp.float32)
    block = F.ODEAttentionBlock(config=cfg)
    model = bridge.ToNNX(block, rngs=nnx.Rngs(0))
    bridge.lazy_init(model, x)
    variables = {"params": nnx.to_pure_dict(nnx.state(model, nnx.Param))}
    assert F.to_state_dict(variables).keys() == R.param_shapes(cfg).keys()
    assert (model(x) == block.apply(variables, x)).all()


class DocumentedLocal(F.SelfAttention):
    """The staged API documentation's "Restrict the mask" example (its LocalAttention), the same
    computation: the four most recent keys, the cached query at `_cache_index - 1`, the position
    after the single-token cache update."""

    def build_mask(self, t, padding_mask, **kwargs):
        mask = super().build_mask(t, padding_mask, **kwargs)
        if mask is None:
            mask = jnp.tril(jnp.ones((t, t), dtype=jnp.bool_))[None, None]
        index = kwargs.get("_cache_index")
        queries = jnp.arange(t) if index is None else jnp.atleast_1d(index - 1)
        return mask & (jnp.arange(t)[None, :] > queries[:, None] - 4)[None, None]


@pytest.mark.parametrize("solver", ["rk4", "rk2_gated"])
def test_the_api_documentation_s_local_attention_decodes_as_the_full_sequence(solver):
    """Cached decoding passes build_mask the API's _cache_index (the index after the update): the
    documentation's example, cached, equals its full-sequence run, and the window hides a key."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver=solver, ode_steps=2)
    params = R.init_params(cfg, 1, dtype=np.float32)
    x = np.random.default_rng(1).normal(size=(2, SEQ + 2, 8)).astype(np.float32)
    mask, variables = np.ones((2, SEQ + 2), bool), F.from_state_dict(cfg, params)
    block = F.ODEAttentionBlock(config=cfg, attention=DocumentedLocal, max_len=SEQ + 2)
    z = block.apply(variables, x, padding_mask=mask)
    z_p, state = block.apply(variables, x[:, :PROMPT], padding_mask=mask[:, :PROMPT], mutable=["cache"])
    decoded = [z_p]
    for i in range(PROMPT, SEQ + 2):
        z_t, state = block.apply({**variables, **state}, x[:, i:i + 1], mutable=["cache"])
        decoded.append(z_t)
    assert relative_error(np.concatenate(decoded, axis=1), z) < 1e-5  # float32 rounding only
    plain = F.ODEAttentionBlock(config=cfg).apply(variables, x, padding_mask=mask)
    assert relative_error(z, plain) > 1e-3  # 8 tokens: the window of 4 hides keys

"""The ODE attention block in JAX; port of ode_ref/block.py.

    ode_func(params, t, x, config, padding_mask=None)   f once
    ode_block(params, x, config, padding_mask=None)     z(1)
    prefill(params, x, config, padding_mask=None, *, max_len) -> (z(1), cache)
    decode_step(params, x_t, cache, config) -> (z_t, cache)    decoder mode (ode_ref/cache.py)

The step loop is a lax.scan over the step index, so tracing and compiling cost one step whatever
ode_steps is; its body is ode_ref.rk.rk_step itself. Weight quantisation and the mask are built
once, before the scan. ode_block_jit is ode_block under jax.jit with the config, the variant
(hashed by its configuration), return_trajectory and checkpoint static.

ode_block(..., checkpoint=True) wraps the scan body in jax.checkpoint: differentiated, the scan
keeps only each step's input state (batch, seq, d_model) and recomputes the step's activations in
the backward pass, so training memory is flat in ode_steps. The values are unchanged; the gradients
agree within a few roundings, not bit for bit: JAX sums a parameter's cotangent in another order
across a checkpointed step's evaluations, and XLA fuses the recomputed forward otherwise, which on
CPU contracts other multiply-adds into fused multiply-adds (tests/backends/jax/test_block.py).

prefill and decode_step check their inputs in Python, then call one jitted function each: the
cache's arrays are fixed-shape (max_len slots) and the slot index is a traced argument, so the
decode step compiles once for every position. Their steps are unrolled (steps x stages
evaluations of one token), each evaluation reading its own cache slot.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.block import INPUT_DTYPES, attention_for, check_dtype, check_flag, check_input
from ode_ref.cache import KVCache, check_decode_input, check_max_len, check_mode
from ode_ref.config import ODEConfig
from ode_ref.params import check_params
from ode_ref.rk import rk_step
from ode_ref.tableaus import TABLEAUS

from .attention import SelfAttention


def _as_jax(x, name: str, allowed=None):
    """x as a jax.Array, its dtype checked before JAX converts it (JAX would make int64 int32,
    and float64 float32 with x64 off)."""
    if not isinstance(x, np.ndarray):
        return x
    if x.dtype == np.float64 and not jax.config.jax_enable_x64:
        raise TypeError(
            f"{name}: got float64 but JAX's x64 mode is off, so JAX would compute in float32; "
            "pass float32, or run under `with jax.enable_x64(True):`"
        )
    if allowed is not None:
        check_dtype(name, x.dtype, allowed)
    return jnp.asarray(x)


def _float_dtypes():
    """INPUT_DTYPES, less float64 while JAX's x64 mode is off."""
    return tuple(d for d in INPUT_DTYPES if d != "float64" or jax.config.jax_enable_x64)


def _checked(params, x, config, padding_mask, attention):
    """(config, attention, x, padding_mask) after the spec's checks, the arrays as jax.Arrays."""
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    x = _as_jax(x, "x", _float_dtypes())
    padding_mask = None if padding_mask is None else _as_jax(padding_mask, "padding_mask")
    check_input(x, cfg, padding_mask, array_type=jax.Array, float_dtypes=_float_dtypes(), bool_dtype=jnp.bool_)
    return cfg, attention_for(cfg, attention, SelfAttention), x, padding_mask


def _setup(params, x, config, padding_mask, attention):
    cfg, attention, x, padding_mask = _checked(params, x, config, padding_mask, attention)
    return cfg, attention, x, attention.prepare(params, x, padding_mask)


def ode_func(params, t, x, config, padding_mask=None, *, attention=None):
    """f(t, x): (batch, seq, d_model) -> (batch, seq, d_model), one evaluation."""
    _, attention, x, prepared = _setup(params, x, config, padding_mask, attention)
    return attention(prepared, t, x)


def ode_block(params, x, config, padding_mask=None, *, attention=None, return_trajectory=False, checkpoint=False):
    """z(1) for z(0) = x, or (z(1), trajectory (ode_steps + 1, batch, seq, d_model)).
    checkpoint: recompute each step's activations in the backward pass (jax.checkpoint on the step)."""
    check_flag("checkpoint", checkpoint)
    cfg, attention, x, prepared = _setup(params, x, config, padding_mask, attention)
    tableau, steps = TABLEAUS[cfg.ode_solver], cfg.ode_steps
    h = 1.0 / steps

    def step(z, k):
        # t is float32 (float64 under x64) whatever the state's dtype; a stage that uses it may
        # promote, so f's output is brought back to the state's dtype, which scan requires
        z = rk_step(lambda t, y: attention(prepared, t, y).astype(y.dtype), k / steps, h, z, tableau,
                    attention.solution_gate(prepared))
        return z, (z if return_trajectory else None)  # no stacked states unless asked for

    if checkpoint:  # prepared stays outside: the step closes over it, so it is not recomputed
        step = jax.checkpoint(step, prevent_cse=False)  # inside scan CSE cannot merge steps anyway
    # k is an integer; k / steps is then in JAX's default float (float64 under x64), never in x's dtype:
    # bfloat16 would round t = 1/3 to 0.33398
    z1, states = jax.lax.scan(step, x, jnp.arange(steps))
    if return_trajectory:
        return z1, jnp.concatenate([x[None], states])
    return z1


# An ODEConfig is static pytree data (hashable, no arrays), so a KVCache, which holds one, is a
# pytree: it passes through jax.tree_util and jit like any NamedTuple of arrays.
jax.tree_util.register_static(ODEConfig)

STATIC_ARGNAMES = ("config", "attention", "return_trajectory", "checkpoint")
ode_block_jit = jax.jit(ode_block, static_argnames=STATIC_ARGNAMES)


@functools.partial(jax.jit, static_argnames=("config", "attention", "max_len"))
def _prefill(params, x, padding_mask, config, attention, max_len):
    z, cache = attention.prefill(params, x, padding_mask, max_len)
    return z, cache.k, cache.v, cache.padding_mask


@functools.partial(jax.jit, static_argnames=("config", "attention"))
def _decode(params, x_t, k, v, padding_mask, index, config, attention):
    z, cache = attention.decode(params, x_t, KVCache(config, k, v, padding_mask, index))
    return z, cache.k, cache.v, cache.padding_mask


def prefill(params, x, config, padding_mask=None, *, max_len: int, attention=None):
    """(z(1) of the prompt x (batch, seq, d_model), a KVCache of max_len slots); decoder mode."""
    cfg = ODEConfig.from_any(config)
    check_mode(cfg)
    cfg, attention, x, padding_mask = _checked(params, x, cfg, padding_mask, attention)
    z, k, v, mask = _prefill(params, x, padding_mask, cfg, attention, check_max_len(max_len, x.shape[1]))
    return z, KVCache(cfg, k, v, mask, x.shape[1])


def decode_step(params, x_t, cache, config, *, attention=None):
    """(z(1) of the next token x_t (batch, 1, d_model), a new cache holding it); the cache given
    is left as it was. Call it outside jit: it is compiled already, once for every position."""
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    x_t = _as_jax(x_t, "x_t", _float_dtypes())
    check_input(x_t, cfg, array_type=jax.Array, float_dtypes=_float_dtypes(), name="x_t")
    if isinstance(cache, KVCache) and isinstance(cache.index, jax.core.Tracer):
        raise TypeError("cache: decode_step runs outside jit (it compiles itself once); got a traced cache")
    check_decode_input(x_t, cache, cfg)
    attention = attention_for(cfg, attention, SelfAttention)
    z, k, v, mask = _decode(params, x_t, cache.k, cache.v, cache.padding_mask, jnp.asarray(cache.index, jnp.int32),
                            cfg, attention)
    return z, KVCache(cfg, k, v, mask, cache.index + 1)

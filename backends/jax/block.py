"""The ODE attention block in JAX; port of ode_ref/block.py.

    ode_func(params, t, x, config, padding_mask=None)   f once
    ode_block(params, x, config, padding_mask=None)     z(1)
    prefill(params, x, config, padding_mask=None, *, max_len) -> (z(1), cache)
    decode_step(params, x_t, cache, config) -> (z_t, cache)    decoder mode (ode_ref/cache.py)

The step loop is a lax.scan over the step index, and its body, rk.rk_step, a lax.scan over the
tableau's stages, so the program holds one evaluation of f whatever ode_steps and the solver are.
return_f0 reads f(0, x) off the first stage rather than tracing f once more. Weight quantisation
and the mask are built once, before the scan. ode_block_jit is ode_block under jax.jit with the config, the variant
(hashed by its configuration), return_trajectory and checkpoint static.

ode_block(..., checkpoint=True) wraps the scan body in jax.checkpoint: differentiated, the scan
keeps only each step's input state (batch, seq, d_model) and recomputes the step's activations in
the backward pass, so training memory is flat in ode_steps. The values are unchanged; the gradients
agree within a few roundings, not bit for bit: JAX sums a parameter's cotangent in another order
across a checkpointed step's evaluations, and XLA fuses the recomputed forward otherwise, which on
CPU contracts other multiply-adds into fused multiply-adds (tests/backends/jax/test_block.py).

prefill and decode_step check their inputs in Python, then call one jitted function each: the
cache's arrays are fixed-shape (max_len slots) and the slot index is a traced argument, so the
decode step compiles once for every position. The prefill runs its evaluations as the block
does, a scan over steps and stages (SelfAttention.integrate); the decode step writes them out
(steps x stages evaluations of one token), each reading and writing its own cache slot.

The slot index is checked where it is still a Python value: decode_step refuses a traced cache
(it runs outside jit), and runs the spec's check_decode_input on the concrete one: a JAX cache
(jax.Array K and V), an index that is an int or a NumPy integer (not a bool, a float or an array)
in [0, max_len). Inside the jitted step it is an int32 tracer whose value no Python check can see:
there lax.dynamic_update_slice takes a negative index from the end and clamps one past it to the
last slot, silently. So the step is only safe through decode_step; a user's own jit around
SelfAttention.decode gets no index check.

A float16 or bfloat16 x runs under the spec's half-precision policy (precision.py): float32
between the policy's rounding points, z(1), f and the cache's k, v returned in x's dtype; the
float32 and float64 programs are unchanged.

Memory: ode_block, ode_func and prefill estimate what they allocate from the shapes
(check_jax_memory: a tile of heads' scores, the ALiBi bias, the mask, the cache) and refuse it
before compiling when it exceeds ode_ref.memory's limit; under jit too, since shapes are static.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.block import attention_for, check_dtype, check_flag, check_input
from ode_ref.cache import CachePort, KVCache, check_decode_input, check_max_len, check_mode
from ode_ref.config import ODEConfig, dtype_name
from ode_ref.memory import cache_need, check_memory, scores_needs, subject
from ode_ref.params import check_params
from ode_ref.precision import DTYPES
from ode_ref.tableaus import TABLEAUS

from .attention import SelfAttention, symbolic
from .precision import in_storage, under_policy
from .rk import rk_step


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
    """DTYPES, less float64 while JAX's x64 mode is off."""
    return tuple(d for d in DTYPES if d != "float64" or jax.config.jax_enable_x64)


def _checked(params, x, config, padding_mask, attention):
    """(config, attention, x, padding_mask) after the spec's checks, the arrays as jax.Arrays."""
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    x = _as_jax(x, "x", _float_dtypes())
    padding_mask = None if padding_mask is None else _as_jax(padding_mask, "padding_mask")
    check_input(x, cfg, padding_mask, array_type=jax.Array, float_dtypes=_float_dtypes(), bool_dtype=jnp.bool_)
    return cfg, attention_for(cfg, attention, SelfAttention), x, padding_mask


# XLA keeps about three (batch, heads | tile, seq_q, seq_k) arrays alive in the compiled attention
# (the products, the exponentials, the weights), measured with memory_analysis on CPU:
# tests/backends/jax/test_block.py holds the estimate to it
SCORE_ARRAYS = 3


def check_jax_memory(call: str, cfg: ODEConfig, attention: SelfAttention, x, padding_mask=None,
                     max_len: int | None = None) -> int:
    """The estimate for a call on x (bytes), or MemoryLimitError; from shapes alone, so under jit
    too. The scores of one tile of heads (attention.attn: tiled, score_tile_bytes), the whole ALiBi
    bias (twice when tiled: its heads-first copy), the mask, and, for prefill, the cache. Under
    jax.export with a symbolic batch or sequence, 0: the sizes are the caller's, known when the
    program runs, and the program then holds every head's scores at once (docs/deployment.md)."""
    if symbolic(x.shape):
        return 0
    batch, seq = x.shape[:2]
    dtype, itemsize = dtype_name(x.dtype), jnp.dtype(x.dtype).itemsize
    per_head = batch * seq * seq * itemsize  # as tiled() reckons a head's scores
    heads, tile_bytes = cfg.num_heads, attention.score_tile_bytes
    tile_heads = None if heads * per_head <= tile_bytes else min(heads, max(1, tile_bytes // per_head))
    needs = scores_needs(cfg, batch, seq, seq, dtype, itemsize, padding_mask is not None, score_arrays=SCORE_ARRAYS,
                         tile_heads=tile_heads, bias_arrays=1 if tile_heads is None else 2)
    if max_len is not None:
        needs.append(cache_need(cfg, batch, max_len, dtype, itemsize))
    return check_memory(subject(call, x.shape, max_len), *needs)


def _setup(params, x, config, padding_mask, attention, call: str):
    """(config, attention, x, prepared, x's dtype) after the checks; a half x: the policy's
    attention and x in float32 (precision.under_policy), the dtype to return in."""
    cfg, attention, x, padding_mask = _checked(params, x, config, padding_mask, attention)
    attention, x_c = under_policy(attention, x)
    check_jax_memory(call, cfg, attention, x_c, padding_mask)
    return cfg, attention, x_c, attention.prepare(params, x_c, padding_mask), x.dtype


def ode_func(params, t, x, config, padding_mask=None, *, attention=None):
    """f(t, x): (batch, seq, d_model) -> (batch, seq, d_model), one evaluation."""
    _, attention, x, prepared, dtype = _setup(params, x, config, padding_mask, attention, "ode_func")
    return attention(prepared, t, x).astype(dtype)


def ode_block(params, x, config, padding_mask=None, *, attention=None, return_trajectory=False, return_f0=False,
              checkpoint=False):
    """z(1) for z(0) = x; with return_trajectory, also the trajectory (ode_steps + 1, batch, seq,
    d_model); with return_f0, also f(0, x), read off the first step's first stage (one evaluation of
    f in the program serves both). The outputs in that order: z1, [trajectory], [f0].
    checkpoint: recompute each step's activations in the backward pass (jax.checkpoint on the step)."""
    check_flag("checkpoint", checkpoint)
    check_flag("return_f0", return_f0)
    cfg, attention, x, prepared, dtype = _setup(params, x, config, padding_mask, attention, "ode_block")
    tableau, steps = TABLEAUS[cfg.ode_solver], cfg.ode_steps
    h = 1.0 / steps

    def step(carry, k):
        z, f0 = carry
        z, first = rk_step(lambda t, y: attention(prepared, t, y), k / steps, h, z, tableau,
                           attention.solution_gate(prepared), with_first=True)
        f0 = None if f0 is None else jnp.where(k == 0, first, f0)  # step 0's first stage: f(0, x)
        return (z, f0), (z if return_trajectory else None)  # no stacked states unless asked for

    if checkpoint:  # prepared stays outside: the step closes over it, so it is not recomputed
        step = jax.checkpoint(step, prevent_cse=False)  # inside scan CSE cannot merge steps anyway
    # k is an integer; k / steps is then in JAX's default float (float64 under x64), never in x's dtype:
    # bfloat16 would round t = 1/3 to 0.33398
    (z1, f0), states = jax.lax.scan(step, (x, jnp.zeros_like(x) if return_f0 else None), jnp.arange(steps))
    out = [z1] + ([jnp.concatenate([x[None], states])] if return_trajectory else []) + ([f0] if return_f0 else [])
    out = in_storage(dtype, *out)  # a half input's outputs in its dtype; else as they are
    return out[0] if len(out) == 1 else out


# An ODEConfig is static pytree data (hashable, no arrays), so a KVCache, which holds one, is a
# pytree: it passes through jax.tree_util and jit like any NamedTuple of arrays.
jax.tree_util.register_static(ODEConfig)

STATIC_ARGNAMES = ("config", "attention", "return_trajectory", "return_f0", "checkpoint")
ode_block_jit = jax.jit(ode_block, static_argnames=STATIC_ARGNAMES)


@functools.partial(jax.jit, static_argnames=("config", "attention", "max_len"))
def _prefill(params, x, padding_mask, config, attention, max_len):
    half, x_c = under_policy(attention, x)
    z, cache = half.prefill(params, x_c, padding_mask, max_len)
    return *in_storage(x.dtype, z, cache.k, cache.v), cache.padding_mask  # the cache's k, v in x's dtype


@functools.partial(jax.jit, static_argnames=("config", "attention"))
def _decode(params, x_t, k, v, padding_mask, index, config, attention):
    half, x_c = under_policy(attention, x_t)
    k, v = in_storage(x_c.dtype, k, v)  # a half cache computes in float32, as the prefill did
    z, cache = half.decode(params, x_c, KVCache(config, k, v, padding_mask, index))
    return *in_storage(x_t.dtype, z, cache.k, cache.v), cache.padding_mask


CACHE = CachePort("JAX", "odeattn.backends.jax.prefill", jax.Array)  # what decode_step takes


def prefill(params, x, config, padding_mask=None, *, max_len: int, attention=None):
    """(z(1) of the prompt x (batch, seq, d_model), a KVCache of max_len slots); decoder mode."""
    cfg = ODEConfig.from_any(config)
    check_mode(cfg)
    cfg, attention, x, padding_mask = _checked(params, x, cfg, padding_mask, attention)
    max_len = check_max_len(max_len, x.shape[1])
    check_jax_memory("prefill", cfg, attention, x, padding_mask, max_len)
    z, k, v, mask = _prefill(params, x, padding_mask, cfg, attention, max_len)
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
    cache = check_decode_input(x_t, cache, cfg, CACHE)
    attention = attention_for(cfg, attention, SelfAttention)
    z, k, v, mask = _decode(params, x_t, cache.k, cache.v, cache.padding_mask, jnp.asarray(cache.index, jnp.int32),
                            cfg, attention)
    return z, KVCache(cfg, k, v, mask, cache.index + 1)

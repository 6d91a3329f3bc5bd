"""The ODE attention block in JAX; port of ode_ref/block.py.

    ode_func(params, t, x, config, padding_mask=None)   f once
    ode_block(params, x, config, padding_mask=None)     z(1)
    prefill(params, x, config, padding_mask=None, *, max_len) -> (z(1), cache)
    decode_step(params, x_t, cache, config) -> (z_t, cache)    decoder mode (ode_ref/cache.py)

The step loop is a lax.scan over the step index, and its body, rk.rk_step, a lax.scan over the
tableau's stages, so the program holds one evaluation of f whatever ode_steps and the tableau are
(a multistep solver's start is written out, its later steps a scan: rk.multistep_scan).
return_f0 reads f(0, x) off the first stage rather than tracing f once more. Weight quantisation
and the mask are built once, before the scan. ode_block_jit is ode_block under jax.jit; on concrete
arrays its program takes the solver's coefficients, the step count and the tables as data, so
configs differing only there share it (BlockJit; the package's docstring lists what recompiles).

ode_block(..., checkpoint=True) wraps the scan body in jax.checkpoint: differentiated, the scan
keeps only each step's input state (batch, seq, d_model) and recomputes the step's activations in
the backward pass, so training memory is flat in ode_steps. The values are unchanged; the gradients
agree within a few roundings, not bit for bit: JAX sums a parameter's cotangent in another order
across a checkpointed step's evaluations, and XLA fuses the recomputed forward otherwise, which on
CPU contracts other multiply-adds into fused multiply-adds (tests/backends/jax/test_block.py).

prefill and decode_step check their inputs in Python, then call one jitted function each: the
cache's arrays are fixed-shape (max_len slots) and the slot index is a traced argument, so the
decode step compiles once for every position. The prefill runs its evaluations as the block
does, a scan over steps and stages (SelfAttention.integrate; a multistep solver's written out);
the decode step writes them out (every evaluation of one token: cache.evaluations), each reading
and writing its own cache slot.

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

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.block import attention_for, check_dtype, check_flag, check_input
from ode_ref.cache import CachePort, KVCache, check_decode_input, check_max_len, check_mode
from ode_ref.config import ROTARY_ENCODINGS, ODEConfig, dtype_name
from ode_ref.memory import cache_need, check_memory, scores_needs, subject
from ode_ref.params import check_params
from ode_ref.precision import DTYPES, HALF_DTYPES
from ode_ref.multistep import MultistepMethod, solver, solver_of
from ode_ref.tableaus import TABLEAUS

from .attention import SelfAttention, symbolic
from .positions import hope_table, rotary_table
from .precision import in_storage, under_policy
from .rk import coefficients, multistep_scan, rk_step


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
    return _block(params, x, config, padding_mask, attention, return_trajectory, return_f0, checkpoint)


def _block(params, x, config, padding_mask=None, attention=None, return_trajectory=False, return_f0=False,
           checkpoint=False, data=None):
    """ode_block; data: a shared program's runtime data (runtime_data), read in place of the
    config's solver coefficients, step count and tables."""
    check_flag("checkpoint", checkpoint)
    check_flag("return_f0", return_f0)
    if data is not None and data["tables"] is not None:
        attention = attention_for(ODEConfig.from_any(config), attention, SelfAttention).with_tables(data["tables"])
    cfg, attention, x, prepared, dtype = _setup(params, x, config, padding_mask, attention, "ode_block")
    if isinstance(solver(cfg.ode_solver), MultistepMethod):  # steps and solver static (shared_config)
        f = lambda t, y: attention(prepared, t, y)  # noqa: E731
        z1, states, f0 = multistep_scan(f, x, solver_of(cfg), cfg.ode_steps, trajectory=return_trajectory, checkpoint=checkpoint)
        out = [z1] + ([states] if return_trajectory else []) + ([f0] if return_f0 else [])
        out = in_storage(dtype, *out)
        return out[0] if len(out) == 1 else out
    tableau = TABLEAUS[cfg.ode_solver]
    steps = cfg.ode_steps if data is None or data["steps"] is None else data["steps"]
    h = 1.0 / cfg.ode_steps  # read by a gated tableau only when data is given (its steps stay static)
    coefficients = None if data is None else data["coefficients"]

    def step(carry, k):
        z, f0 = carry
        z, first = rk_step(lambda t, y: attention(prepared, t, y), k / steps, h, z, tableau,
                           attention.solution_gate(prepared), with_first=True, data=coefficients)
        f0 = None if f0 is None else jnp.where(k == 0, first, f0)  # step 0's first stage: f(0, x)
        return (z, f0), (z if return_trajectory else None)  # no stacked states unless asked for

    if checkpoint:  # prepared stays outside: the step closes over it, so it is not recomputed
        step = jax.checkpoint(step, prevent_cse=False)  # inside scan CSE cannot merge steps anyway
    # k is an integer; k / steps is then in JAX's default float (float64 under x64), never in x's dtype:
    # bfloat16 would round t = 1/3 to 0.33398
    init = (x, jnp.zeros_like(x) if return_f0 else None)
    if isinstance(steps, int):
        (z1, f0), states = jax.lax.scan(step, init, jnp.arange(steps))
    else:  # a step count given as data: a loop whose trip count is an argument (the forward only)
        z1, f0 = jax.lax.fori_loop(0, steps, lambda k, carry: step(carry, k)[0], init)
    out = [z1] + ([jnp.concatenate([x[None], states])] if return_trajectory else []) + ([f0] if return_f0 else [])
    out = in_storage(dtype, *out)  # a half input's outputs in its dtype; else as they are
    return out[0] if len(out) == 1 else out


# An ODEConfig is static pytree data (hashable, no arrays), so a KVCache, which holds one, is a
# pytree: it passes through jax.tree_util and jit like any NamedTuple of arrays.
jax.tree_util.register_static(ODEConfig)

STATIC_ARGNAMES = ("config", "attention", "return_trajectory", "return_f0", "checkpoint")
# one jit for both keys: data None, the whole config static (jax.jit(ode_block)); data given, a shared program
_program = jax.jit(_block, static_argnames=STATIC_ARGNAMES)

# ---- configs that share a program ----------------------------------------------------------------
# ode_block_jit on concrete arrays takes these as data, not as part of the program's key, so a change
# of any of them runs the program already compiled: the solver's coefficients (another tableau of the
# same stage count; a gated one stays static, its solution is written with h), the step count (for
# z(1) and f0; a trajectory's length is part of its shape) and the fields that only make the rotary
# and hope tables. Each is computed on the host as the traced program computed it (the coefficients
# and the spec's float64 tables rounded once to the state's dtype), so the values are the same bits.
TABLE_FIELDS = ("rope_base", "rope_scaling", "sinusoidal_base", "sinusoidal_scale", "hope_base", "hope_damping")
_TABLE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ODEConfig) if f.name in TABLE_FIELDS}


def runtime_steps(cfg: ODEConfig, return_trajectory: bool) -> bool:
    """Whether a shared program takes cfg's step count as data."""
    method = solver(cfg.ode_solver)
    return not return_trajectory and not method.gated and not isinstance(method, MultistepMethod)


def shared_config(cfg: ODEConfig, steps_as_data: bool, tables_as_data: bool) -> ODEConfig:
    """The config a shared program is keyed by: cfg with its data fields at fixed values (the first
    solver of the same stage count, where it is an RK tableau: a multistep solver stays, as its step
    count does; one step, where the steps are data; the default table fields, where the tables are)."""
    tableau = solver(cfg.ode_solver)
    name = cfg.ode_solver if tableau.gated or isinstance(tableau, MultistepMethod) else next(
        name for name, t in TABLEAUS.items() if not t.gated and t.num_stages == tableau.num_stages)
    tables = _TABLE_DEFAULTS if tables_as_data else {}
    return dataclasses.replace(cfg, ode_solver=name, ode_steps=1 if steps_as_data else cfg.ode_steps, **tables)


def runtime_data(cfg: ODEConfig, dtype: str, bound: int, steps_as_data: bool, tables_as_data: bool) -> dict:
    """What a shared program reads in place of cfg's data fields, for an input of dtype and bound
    tokens: the tableau's coefficients, the step count (None: static) and the tables (None: none,
    or made in the program), as jax.Arrays."""
    compute = jnp.dtype(dtype)
    encoding = cfg.position_encoding
    tables = None if not tables_as_data else (
        rotary_table(cfg, compute, bound) if encoding in ROTARY_ENCODINGS else
        hope_table(cfg, cfg.layer_idx, compute, bound) if encoding == "hope" else None)
    method = solver(cfg.ode_solver)
    data = {"coefficients": None if isinstance(method, MultistepMethod) else coefficients(method, 1.0 / cfg.ode_steps, compute),
            "steps": np.int32(cfg.ode_steps) if steps_as_data else None, "tables": tables}
    return jax.tree_util.tree_map(jnp.asarray, data)


@functools.lru_cache(maxsize=256)
def _shared(cfg: ODEConfig, dtype: str, bound: int, return_trajectory: bool, x64: bool) -> tuple:
    """(shared_config, runtime_data) of a call, kept for the next (x64: JAX's x64 mode, which sets
    the times' float). A half input's tables stay in the program: the half-precision policy checks
    hope's range against the config's own fields (precision.check_hope_range) while it is traced."""
    del x64  # a key only: coefficients reads the mode itself
    steps_as_data, tables_as_data = runtime_steps(cfg, return_trajectory), dtype not in HALF_DTYPES
    compute = "float32" if dtype in HALF_DTYPES else dtype  # the policy computes in float32 (precision.py)
    return (shared_config(cfg, steps_as_data, tables_as_data),
            runtime_data(cfg, compute, bound, steps_as_data, tables_as_data))


def _traced(*trees) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(trees))


class BlockJit:
    """ode_block under jax.jit (ode_block_jit). On concrete arrays, with the port's own
    SelfAttention, the program is keyed by shared_config: a change of solver (same stage count),
    step count or table field runs it again without compiling. Inside a trace (a caller's jit, grad
    or vmap), with a variant (which may read any field) or with checkpoint, the whole config is the
    key, as in jax.jit(ode_block). It is called and lowered as a jax.jit function is; it has no
    eval_shape or trace, and a shared program's lowering takes its data as one more argument."""

    def _route(self, params, x, config, padding_mask, attention, return_trajectory, return_f0, checkpoint):
        """(the program's arguments, its static arguments and data) for a call."""
        static = dict(attention=attention, return_trajectory=return_trajectory, return_f0=return_f0,
                      checkpoint=checkpoint)
        if (attention is not None or checkpoint or _traced(params, x, padding_mask)
                or getattr(x, "ndim", None) != 3):  # not an input this path reads: the static one's checks say why
            return (params, x, config, padding_mask), static
        x = _as_jax(x, "x", _float_dtypes())  # a float64 x with x64 off refused, as ode_block refuses it
        shared, data = _shared(ODEConfig.from_any(config), dtype_name(x.dtype), x.shape[1], bool(return_trajectory),
                               jax.config.jax_enable_x64)
        return (params, x, shared, padding_mask), {**static, "data": data}

    def __call__(self, params, x, config, padding_mask=None, *, attention=None, return_trajectory=False,
                 return_f0=False, checkpoint=False):
        args, kwargs = self._route(params, x, config, padding_mask, attention, return_trajectory, return_f0, checkpoint)
        return _program(*args, **kwargs)

    def lower(self, params, x, config, padding_mask=None, *, attention=None, return_trajectory=False,
              return_f0=False, checkpoint=False):
        """The call's program lowered (jax.jit's lower)."""
        args, kwargs = self._route(params, x, config, padding_mask, attention, return_trajectory, return_f0, checkpoint)
        return _program.lower(*args, **kwargs)

    def _cache_size(self) -> int:
        """The programs compiled in this process (jax.jit's _cache_size)."""
        return _program._cache_size()

    def _clear_cache(self) -> None:
        _program._clear_cache()


ode_block_jit = BlockJit()


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

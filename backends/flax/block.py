"""The ODE attention block as a flax.linen Module, over the JAX port's block.

    block = ODEAttentionBlock(config=cfg, attention=MyVariant)      # or MyVariant(config=cfg)
    variables = block.init(key, x)                                  # or from_state_dict(cfg, params)
    z = block.apply(variables, x, padding_mask=m, deterministic=True)   the plain forward
    z, state = block.apply(variables, prompt, padding_mask=m, mutable=['cache'])   prefill
    z_t, state = block.apply({**variables, **state}, x_t, mutable=['cache'])    one token

The forward is the JAX port's ode_block (a lax.scan over the steps of ode_ref.rk.rk_step), and
prefill and decoding are the spec's Stages.prefill and Stages.decode, each evaluation of f
running the block's SelfAttention stages (attention.ModuleStages); the checks are the spec's, so
bad input gets the other ports' errors. Training: deterministic=False drops attention outputs at
the config's dropout rate on the `dropout` rng, a key of its own at every evaluation of f.

The cache (the 'cache' collection, made by the prefill): cached_key and cached_value
(evaluations, batch, max_len, heads, head_dim), each evaluation of f (step x stage) holding its
own keys and values (ode_ref/cache.py); padding_mask (batch, max_len), True = a real token; and
cache_index, the next slot (int32). The slot index is an array, so under jax.jit one compilation
decodes every position. A full cache is refused: by the spec's check when the index is concrete
(eagerly, and in jit_decode, which checks before its compiled step), and inside a jit of the
caller's by the same check at run time (jax.debug.callback), whose error JAX wraps. The cache's
variables (names, shapes, dtypes) are checked by name before use, under jit too.

Parameters (variables['params']): ode_func, the SelfAttention's (attention.py), and gate.kernel
(2 d_model, 1) and gate.bias (1,) for the gated solver, Xavier-uniform and 0 as the spec inits
them. from_state_dict and to_state_dict convert the seed's state_dict names to and from them.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.block import check_flag
from ode_ref.cache import KVCache, check_cache_index, check_decode_input, check_max_len, check_mode, evaluations
from ode_ref.config import ODEConfig
from ode_ref.params import GATE_BIAS, GATE_WEIGHT, check_params
from ode_ref.multistep import solver

from ode_ref.config import dtype_name
from ode_ref.precision import HALF_DTYPES

from ..jax import block as jax_block
from ..jax.precision import in_storage, under_policy
from .attention import PATHS, ModuleStages, SelfAttention, _Configured, dropout_rng, to_state_dict

CACHE_NAMES = ("cached_key", "cached_value", "padding_mask", "cache_index")
CACHE = jax_block.CACHE  # the JAX port's caches: what a decode step checks the cache holds


def from_state_dict(config, params) -> dict:
    """The variables for module.apply ({'params': ...}) from params under the seed's state_dict
    names (NumPy or JAX arrays), after the spec's check against config (check_params)."""
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    tree: dict = {}
    for name in params:
        path, transposed = PATHS[name]
        value = jax_block._as_jax(np.asarray(params[name]) if not isinstance(params[name], jax.Array) else params[name],
                                  f"params[{name!r}]")
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value.T if transposed else value
    return {"params": tree}


class Gate(_Configured):
    """The gated solver's g = sigmoid([F1; F2] @ kernel + bias) (the JAX port's stage `gate`)."""

    param_dtype: Any = jnp.float32

    def setup(self):
        d = self.config.hidden_size
        self.kernel = self.param("kernel", nn.initializers.xavier_uniform(), (2 * d, 1), self.param_dtype)
        self.bias = self.param("bias", nn.initializers.zeros, (1,), self.param_dtype)

    def state_dict(self) -> dict:
        return {GATE_WEIGHT: self.kernel.T, GATE_BIAS: self.bias}


def attention_module(block: nn.Module, attention) -> SelfAttention:
    """The block's SelfAttention, named ode_func: a new instance of a class (None: SelfAttention),
    or a copy of an instance (of the block's config)."""
    attention = SelfAttention if attention is None else attention
    if isinstance(attention, type) and issubclass(attention, SelfAttention):
        return attention(config=block.config, param_dtype=block.param_dtype)
    if not isinstance(attention, SelfAttention):
        raise TypeError(f"attention: expected a subclass or an instance of odeattn.backends.flax.SelfAttention, "
                        f"e.g. RecentKeysAttention or RecentKeysAttention(config=cfg); got {attention!r}")
    if attention.config != block.config:
        raise ValueError(f"attention: its config {attention.config} differs from config {block.config}")
    return attention.clone(parent=block, name=None)


class ODEAttentionBlock(_Configured):
    """z(1) = x + integral_0^1 f(t, z) dt by the config's solver and steps (the gated one too),
    f the `attention` SelfAttention (a subclass or an instance: a variant installs in one line).

    Attributes:
        config: an ODEConfig (or a dict or a seed config object).
        attention: a SelfAttention subclass or instance; None is SelfAttention.
        max_len: the cache's slots, for cached decoding (mutable=['cache'], decoder mode).
        param_dtype: the parameters' dtype at init."""

    attention: Any = None
    max_len: int | None = None
    param_dtype: Any = jnp.float32

    def setup(self):
        self.ode_func = attention_module(self, self.attention)
        self.gate = Gate(self.config, param_dtype=self.param_dtype) if solver(self.config.ode_solver).gated else None

    def state_dict(self) -> dict:
        """The block's parameters under the seed's names (creating them at init). Outside init the
        variables are checked first against the config (check_params), so parameters of another
        config get the spec's error, not Flax's."""
        if not self.is_initializing():
            check_params(to_state_dict(self.variables.get("params", {})), self.config)
        return {**self.ode_func.state_dict(), **(self.gate.state_dict() if self.gate is not None else {})}

    def __call__(self, x, padding_mask=None, deterministic: bool = True, return_trajectory: bool = False):
        """z(1) of x (batch, seq, d_model), or (z(1), trajectory) as the JAX port's ode_block.
        With a mutable 'cache' (not at init): the prefill of a prompt, then one token per call."""
        check_flag("return_trajectory", return_trajectory)
        params = check_storage(self.state_dict(), x)
        stages = ModuleStages(self.ode_func, deterministic, dropout_rng(self, deterministic))
        held = any(self.has_variable("cache", name) for name in CACHE_NAMES)
        if self.is_mutable_collection("cache") and not self.is_initializing():
            check_mode(self.config)
            if held:
                return self._decode(params, x, padding_mask, stages)
            return self._prefill(params, x, padding_mask, stages)
        if held and not self.is_initializing():
            raise ValueError("cache: the variables hold a cache but 'cache' is not mutable, so this call would run the "
                             "plain forward on x, not a decode step: decode with apply(..., mutable=['cache']), or pass "
                             "the variables without 'cache' for the forward")
        return jax_block.ode_block(params, x, self.config, padding_mask, attention=stages,
                                   return_trajectory=return_trajectory)

    def f(self, t, x, padding_mask=None, deterministic: bool = True):
        """f(t, x) once, the gated solver's configs too: the JAX port's ode_func over the stages."""
        stages = ModuleStages(self.ode_func, deterministic, dropout_rng(self, deterministic))
        return jax_block.ode_func(check_storage(self.state_dict(), x), t, x, self.config, padding_mask, attention=stages)

    def _prefill(self, params, x, padding_mask, stages):
        cfg, stages, x, padding_mask = jax_block._checked(params, x, self.config, padding_mask, stages)
        max_len = check_max_len(self.max_len, x.shape[1])
        half, x_c = under_policy(stages, x)  # a half x: the policy, in float32 (the JAX port's)
        jax_block.check_jax_memory("prefill", cfg, half, x_c, padding_mask, max_len)
        z, cache = half.prefill(params, x_c, padding_mask, max_len)
        self._store(cache, jnp.asarray(x.shape[1], jnp.int32), x.dtype)
        return z.astype(x.dtype)

    def _decode(self, params, x_t, padding_mask, stages):
        if padding_mask is not None:
            raise ValueError("padding_mask: a decoded token is real, so a decode step takes none; got a mask")
        cfg = self.config
        x_t = jax_block._as_jax(x_t, "x_t", jax_block._float_dtypes())
        jax_block.check_input(x_t, cfg, array_type=jax.Array, float_dtypes=jax_block._float_dtypes(), name="x_t")
        check_cache_variables({n: self.get_variable("cache", n) for n in CACHE_NAMES if self.has_variable("cache", n)}, cfg)
        k, v, mask, index = (self.get_variable("cache", name) for name in CACHE_NAMES)
        cache = KVCache(cfg, tuple(k), tuple(v), mask, index)
        traced = isinstance(index, jax.core.Tracer)
        # the spec's checks; a traced index is checked where its value is known, at run time
        checked = check_decode_input(x_t, cache._replace(index=0 if traced else _concrete_index(index)), cfg, CACHE)
        if traced:
            jax.debug.callback(lambda i, n: check_cache_index(int(i), n) and None, index, cache.max_len)
        half, x_c = under_policy(stages, x_t)
        cache = cache if traced else checked
        k, v = in_storage(x_c.dtype, cache.k, cache.v)  # a half cache computes in float32
        z, cache = half.decode(params, x_c, cache._replace(k=k, v=v))
        self._store(cache, jnp.asarray(cache.index, jnp.int32), x_t.dtype)
        return z.astype(x_t.dtype)

    def _store(self, cache: KVCache, index, dtype):
        """The cache's variables, k and v in dtype (the input's: S under the policy)."""
        k, v = in_storage(dtype, cache.k, cache.v)
        values = (jnp.stack(k), jnp.stack(v), cache.padding_mask, index)
        for name, value in zip(CACHE_NAMES, values):
            self.put_variable("cache", name, value)


def check_cache_variables(cache, cfg: ODEConfig) -> None:
    """The 'cache' collection a decode step reads, each variable checked by name before use:
    ValueError or TypeError naming it. Names, shapes and dtypes are static, so this runs under
    jax.jit too (the index's value is checked by check_cache_index)."""
    missing = [n for n in CACHE_NAMES if n not in cache]
    if missing:
        raise ValueError(f"cache: expected the variables {', '.join(CACHE_NAMES)} that the prefill makes "
                         f"(apply(..., mutable=['cache']) on the prompt); missing {', '.join(missing)}")
    k, v, mask, index = (cache[n] for n in CACHE_NAMES)
    index_dtype = _dtype_of(index)
    if np.shape(index) != () or index_dtype.kind not in "iu":
        raise TypeError(f"cache_index: expected an integer scalar (the next slot, int32); got {dtype_name(index_dtype)} "
                        f"of shape {tuple(np.shape(index))}")
    if np.ndim(mask) != 2 or _dtype_of(mask) != np.bool_:
        raise TypeError(f"padding_mask: expected the cache's bool (batch, max_len); got shape {tuple(np.shape(mask))}")
    want = (evaluations(cfg), *np.shape(mask), cfg.num_heads, cfg.head_dim)
    for name, a in (("cached_key", k), ("cached_value", v)):
        if tuple(np.shape(a)) != want:
            raise ValueError(f"{name}: expected shape {want} (evaluations, batch, max_len, heads, head_dim), as "
                             f"the cache's padding_mask and the config give; got {tuple(np.shape(a))}")
    if _dtype_of(v) != _dtype_of(k):
        raise TypeError(f"cached_value: expected dtype {dtype_name(_dtype_of(k))} (cached_key's); "
                        f"got {dtype_name(_dtype_of(v))}")


def _dtype_of(a) -> np.dtype:
    """a's dtype without reading its values (a traced array's too)."""
    return np.dtype(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype)


def jit_decode(block: ODEAttentionBlock):
    """One decode step, block.apply(variables, x_t, mutable=['cache']) under jax.jit (one
    compilation for every position), with the cache checked before each call, where its index is
    a concrete value: a full or malformed cache gets the spec's one-line error, not JAX's runtime
    error from a callback inside the compiled step. Returns (z_t, state) as apply does."""
    step = jax.jit(lambda variables, x_t: block.apply(variables, x_t, mutable=["cache"]))

    def decode(variables, x_t):
        cache = variables.get("cache") if hasattr(variables, "get") else None
        if not cache:
            raise ValueError("cache: a decode step needs the variables with the prefill's 'cache' "
                             "({**variables, **state}); got none")
        check_cache_variables(cache, block.config)
        check_cache_index(_concrete_index(cache["cache_index"]), np.shape(cache["cached_key"])[2])
        return step(variables, x_t)

    return decode


def check_storage(params: dict, x) -> dict:
    """params, unless x is float16 or bfloat16 and a parameter is not: under the policy the Flax
    stages read the module's own parameters (not the policy's rounded copies), so they must be
    stored in x's dtype already (param_dtype, or the variables converted). TypeError otherwise."""
    if not hasattr(x, "dtype"):
        return params  # not an array: the spec's input check names it
    name = dtype_name(x.dtype)
    if name in HALF_DTYPES:
        other = sorted({dtype_name(v.dtype) for v in params.values()} - {name})
        if other:
            raise TypeError(f"x: a {name} input runs under the half-precision policy, which needs the parameters "
                            f"stored in {name} (param_dtype=jnp.{name}, or the variables converted); got parameters "
                            f"in {', '.join(other)}")
    return params


def _concrete_index(index):
    """A concrete cache_index as a Python int for the spec's check (an integer array of one value);
    anything else is given to the check as it is, which names it."""
    a = np.asarray(index)
    return int(a) if a.shape == () and a.dtype.kind in "iu" else index

"""The ODE-aware KV cache: exact incremental decoding of a decoder-mode block.

In decoder mode the state of token i at every evaluation of f (step x stage) depends only on the
states of tokens <= i at that evaluation. So keeping each evaluation's K and V (after
preprocess_qkv: rotated) lets a new token run the whole ODE alone, attending at evaluation e to
the cached K and V of evaluation e: prefill on T tokens then k decode steps equals ode_block on
the T + k tokens, up to the order of floating-point sums.

    KVCache    config, k and v (one (batch, max_len, heads, head_dim) array per evaluation, in
               evaluation order: step-major, stage-minor), padding_mask (batch, max_len), index
    CacheSlots the hook Stages.evaluate calls after preprocess_qkv: records K, V (prefill) or
               writes the new token's K, V at `index` and returns every slot (decode)
    check_decode_input  the checks every port runs before a decode step, the cache's own port and
               slot index included (check_cache_port, check_cache_index)

Memory: 2 x evaluations x max_len x d_model values per batch row (evaluations: ode_steps x
stages for a tableau, 1 Euler, 4 RK4; ode_steps + 1 for ab2, + 4 for ab3 past its start).
The Python-level state is immutable: each step returns a new cache and never writes the old one,
so a step can be replayed or a prefix branched.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from .config import ODEConfig, dtype_name
from .multistep import evaluations as solver_evaluations, solver_of


class KVCache(NamedTuple):
    config: ODEConfig  # the block's config; a step under another config is refused
    k: tuple  # per evaluation: (batch, max_len, heads, head_dim), slots >= index unwritten
    v: tuple  # likewise
    padding_mask: Any  # bool (batch, max_len): True = a real token in that slot
    index: int  # slots written; the next token goes to slot `index`

    @property
    def max_len(self) -> int:
        return int(self.padding_mask.shape[1])

    @property
    def batch(self) -> int:
        return int(self.padding_mask.shape[0])


def evaluations(config: ODEConfig) -> int:
    """How many times a block evaluates f (one cache slot each): ode_steps x a tableau's stages; a
    multistep solver's one a step, its starter's stages besides (multistep.evaluations)."""
    return solver_evaluations(solver_of(config), config.ode_steps)


def cache_values(config: ODEConfig, batch: int, max_len: int) -> int:
    """The cache's size in values (K and V of every evaluation)."""
    return 2 * evaluations(config) * batch * max_len * config.hidden_size


class CacheSlots:
    """The kv hook of Stages.evaluate, called once per evaluation of f, in evaluation order.
    past None (prefill): records (k, v) and returns them. Else (decode): writes the new token's
    k, v at slot `index` of the past evaluation's arrays and returns all slots."""

    def __init__(self, attention, past: KVCache | None = None):
        self.attention, self.past = attention, past
        self.k: list = []
        self.v: list = []

    def __call__(self, k, v):
        if self.past is not None:
            e, write = len(self.k), self.attention.write_slot
            k, v = write(self.past.k[e], k, self.past.index), write(self.past.v[e], v, self.past.index)
        self.k.append(k)
        self.v.append(v)
        return k, v


def check_mode(cfg: ODEConfig) -> None:
    if cfg.mode != "decoder":
        raise ValueError(
            f"mode: cached decoding needs mode='decoder' (in encoder mode every token sees later "
            f"ones); got {cfg.mode!r}"
        )
    if cfg.ssmax and cfg.ssmax_length == "padded":
        raise ValueError(
            "ssmax_length: cached decoding needs ssmax_length='visible' (with the seed's 'padded' rule, "
            "SSMax's ln(n) is of the whole padded length, so appending a token changes every earlier "
            "one and no cache can reproduce it); got 'padded'"
        )


def check_max_len(max_len, seq_len: int) -> int:
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or max_len < seq_len:
        raise ValueError(f"max_len: expected an integer >= the prompt's length {seq_len}; got {max_len!r}")
    return int(max_len)


def array_kind(array_type: type) -> str:
    """'numpy.ndarray', 'torch.Tensor', 'jax.Array': a class of arrays by library and name, as
    messages name it (JAX's concrete class lives in jaxlib, under another name)."""
    root = array_type.__module__.partition(".")[0]
    return "jax.Array" if root in ("jax", "jaxlib") else f"{root}.{array_type.__name__}"


class CachePort(NamedTuple):
    """What a port's caches hold, for check_decode_input: the port's name in messages, the
    function that makes its caches, and the class of their arrays."""

    name: str  # "spec", "torch", "JAX"
    source: str  # "ode_ref.prefill", ...
    array_type: Any  # np.ndarray, torch.Tensor, jax.Array


SPEC_CACHE = CachePort("spec", "ode_ref.prefill", np.ndarray)


def check_cache_port(cache: KVCache, port: CachePort = SPEC_CACHE) -> None:
    """TypeError unless every array of the cache is the port's: a KVCache made by another port
    (the spec's NumPy arrays given to torch, torch's tensors to JAX) is refused by name."""
    for a in (*cache.k, *cache.v, cache.padding_mask):
        if not isinstance(a, port.array_type):
            raise TypeError(f"cache: expected a {port.name} cache from {port.source} (a KVCache of "
                            f"{array_kind(port.array_type)}); got a KVCache of {array_kind(type(a))}")


def check_cache_index(index, max_len: int) -> int:
    """The cache's slot index as a Python int: an integer (Python or NumPy; not a bool, a float
    or an array) in [0, max_len), one message for every way it is not (TypeError for the type,
    ValueError for the value); index == max_len is a full cache, said so. Unchecked, a negative
    index writes a slot counted from the end (the spec, JAX) or fails deep inside (torch), and a
    float indexes nothing or comes back a float index."""
    wrong_type = isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral)
    if not wrong_type and index == max_len:
        raise ValueError(f"cache: full ({index} of {max_len} slots written); prefill with a larger max_len")
    if wrong_type or not 0 <= index < max_len:
        raise (TypeError if wrong_type else ValueError)(
            f"cache.index: expected an integer in [0, {max_len}) (the next slot; a Python or NumPy integer, "
            f"not a bool); got {index!r} ({type(index).__name__})")
    return int(index)


def check_decode_input(x_t, cache, cfg: ODEConfig, port: CachePort = SPEC_CACHE) -> KVCache:
    """The cache, its index a Python int, after the checks of a decode step's x_t and cache:
    ValueError/TypeError naming what is wrong. port: the caller's (CachePort), whose arrays the
    cache must hold. Every port runs this before a decode step, and decodes the cache it returns."""
    check_mode(cfg)
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache: expected the KVCache that prefill or decode_step returned; got {type(cache).__name__}")
    check_cache_port(cache, port)
    if cache.config != cfg:
        raise ValueError(f"cache: built for config {cache.config}, not {cfg}")
    n = evaluations(cfg)
    if len(cache.k) != n or len(cache.v) != n:
        raise ValueError(f"cache: expected K and V for {n} evaluations; got {len(cache.k)} and {len(cache.v)}")
    want = (cache.batch, 1, cfg.hidden_size)
    if tuple(x_t.shape) != want:
        raise ValueError(f"x_t: expected shape {want} (the cache's batch, one token, d_model); got {tuple(x_t.shape)}")
    if dtype_name(x_t.dtype) != dtype_name(cache.k[0].dtype):
        raise TypeError(f"x_t: expected dtype {dtype_name(cache.k[0].dtype)} (the cache's); got {dtype_name(x_t.dtype)}")
    index = check_cache_index(cache.index, cache.max_len)
    return cache if type(cache.index) is int else cache._replace(index=index)

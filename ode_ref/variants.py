"""The staged attention API's seven example variants (eight classes: LocalWindow came first), one
stage each, written once for every port.

    ScaledQueryAttention     preprocess_qkv    q * (query_scale + time_gain * t)
    TiedKeysAttention        project           k = q (keys tied to queries)
    UnitNormQKAttention      preprocess_qkv    q, k scaled to unit length per head
    LocalWindowAttention     build_mask        keys with |i - j| < window only
    RecentKeysAttention      build_mask        the `window` most recent keys only: i - window < j <= i
    CoolerAttention          attn              the query scale halved inside attn
    DropFirstHeadAttention   postprocess_attn  the first head's output zeroed
    ScaledOutputAttention    output_proj       the output projection times output_scale

A variant subclasses SelfAttention and overrides stages. Written with operators (+ - * / ** abs,
comparisons, & |), `self.xp` (the port's array namespace: numpy here, torch, jax.numpy, or the
ONNX export's; sqrt, exp, log, tanh, abs, where, and sum and mean with axis= and keepdims= are
called alike in all four), `self.asarray` and `self.slot_indices`, the same class runs in every port:
`port_variant(cls, PortSelfAttention)` rebuilds it over a port's stages (port_variants does it
for the torch and JAX packages, the export for any such variant, a user's too). Every variant is
cache-aware: build_mask gets the cache index when decoding.
"""

from __future__ import annotations

import math
import numbers
import types

import numpy as np

from .attention import SelfAttention, Stages, of_the_spec


def check_window(window) -> int:
    """window as a Python int: an integer >= 1, Python or NumPy (as the config takes them), not a
    bool. A window wider than the sequence is every key (within the variant's own rule)."""
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window: expected an integer >= 1; got {window!r}")
    return int(window)


def check_factor(name: str, value) -> float:
    """value as a Python float: a finite real number, Python or NumPy, not a bool. NaN and +-inf
    are refused (a non-finite factor makes every output NaN: inf * 0 and inf - inf in the softmax
    and the products), and so is a number with no finite float (10**400). Any finite value has a
    meaning, zero and negative ones included: query_scale 0 is uniform attention, a negative one
    prefers the least similar keys; output_scale 0 makes f zero, the block the identity."""
    number = math.nan
    if not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond every float
            pass
    if not math.isfinite(number):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else f"{shown[:20]}... ({len(shown)} characters)"
        raise ValueError(f"{name}: expected a finite number; got {shown}")
    return number


class ScaledQueryAttention(SelfAttention):
    """preprocess_qkv: q * (query_scale + time_gain * t); a non-autonomous f when time_gain != 0."""

    def __init__(self, config, query_scale: float = 2.0, time_gain: float = 0.5):
        super().__init__(config)
        self.query_scale, self.time_gain = check_factor("query_scale", query_scale), check_factor("time_gain", time_gain)

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        q, k, v = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        return q * (self.query_scale + self.time_gain * t), k, v


class TiedKeysAttention(SelfAttention):
    """project: the keys are the queries (the key rows of W_qkv are not read)."""

    def project(self, w_qkv, h):
        q, _, v = super().project(w_qkv, h)
        return q, q, v


class UnitNormQKAttention(SelfAttention):
    """preprocess_qkv: q and k divided by their length over head_dim, after RoPE (which keeps
    lengths): q / sqrt(sum q^2 + eps). eps keeps an all-zero head finite."""

    eps = 1e-6

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        q, k, v = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        xp = self.xp
        q, k = (a / xp.sqrt(xp.sum(a * a, axis=-1, keepdims=True) + self.eps) for a in (q, k))
        return q, k, v


class LocalWindowAttention(SelfAttention):
    """build_mask: also hide keys with |i - j| >= window (a sliding window of width 2 window - 1)."""

    def __init__(self, config, window: int = 2):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = self.slot_indices(seq_len, cache_index)
        return self.hide_keys(super().build_mask(seq_len, padding_mask, cache_index=cache_index), abs(i - j) < self.window)


class RecentKeysAttention(SelfAttention):
    """build_mask: only the `window` most recent keys, i - window < j <= i (causal, in either mode)."""

    def __init__(self, config, window: int = 4):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = self.slot_indices(seq_len, cache_index)
        recent = (j <= i) & (j > i - self.window)
        return self.hide_keys(super().build_mask(seq_len, padding_mask, cache_index=cache_index), recent)


class CoolerAttention(SelfAttention):
    """attn: the query scale halved, scores * scale / 2: a flatter softmax."""

    def attn(self, q, k, v, mask, bias=None):
        return super().attn(q * 0.5, k, v, mask, bias)


class DropFirstHeadAttention(SelfAttention):
    """postprocess_attn: head 0's output zeroed, y (batch, seq, heads, head_dim)."""

    def postprocess_attn(self, y, padding_mask=None):
        keep = self.asarray([[0.0]] + [[1.0]] * (self.config.num_heads - 1), like=y)  # (heads, 1)
        return super().postprocess_attn(y, padding_mask) * keep


class ScaledOutputAttention(SelfAttention):
    """output_proj: y @ W_out^T times output_scale."""

    def __init__(self, config, output_scale: float = 0.5):
        super().__init__(config)
        self.output_scale = check_factor("output_scale", output_scale)

    def output_proj(self, w_out, y):
        return super().output_proj(w_out, y) * self.output_scale


VARIANTS: tuple[type, ...] = (
    ScaledQueryAttention, TiedKeysAttention, UnitNormQKAttention, LocalWindowAttention, RecentKeysAttention,
    CoolerAttention, DropFirstHeadAttention, ScaledOutputAttention,
)


def _rebound(value, cls):
    """A function whose zero-argument super() names cls: its __class__ cell replaced."""
    if not isinstance(value, types.FunctionType) or "__class__" not in value.__code__.co_freevars:
        return value
    cells = tuple(types.CellType(cls) if name == "__class__" else cell
                  for name, cell in zip(value.__code__.co_freevars, value.__closure__))
    func = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, cells)
    func.__kwdefaults__, func.__doc__, func.__qualname__ = value.__kwdefaults__, value.__doc__, value.__qualname__
    return func


def port_variant(variant: type, base: type, module: str | None = None) -> type:
    """The variant rebuilt over a port's SelfAttention `base`: each class between the variant and
    the spec's SelfAttention is copied, in order, onto base, its methods' super() rebound. A
    variant of a port's own SelfAttention, or not a SelfAttention at all, is refused by name."""
    if not of_the_spec(variant):
        raise TypeError(f"attention: expected a subclass of ode_ref's SelfAttention; got {variant!r}")
    chain = []
    for cls in variant.__mro__:
        if cls is SelfAttention:
            break
        if issubclass(cls, Stages) and not issubclass(cls, SelfAttention):
            raise TypeError(f"attention: {variant.__name__} derives from another port's stages ({cls.__qualname__})")
        chain.append(cls)
    ported = base
    for cls in reversed(chain):
        ported = types.new_class(cls.__name__, (ported,))
        own = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__", "__module__")}
        for name, value in own.items():
            setattr(ported, name, _rebound(value, ported))
        ported.__module__, ported.__qualname__ = module or cls.__module__, cls.__qualname__
    return ported


def port_variants(base: type, module: str) -> dict[str, type]:
    """Every example variant (VARIANTS) rebuilt over a port's SelfAttention `base` by port_variant,
    by name, their __module__ `module`: what a port's package adds to its namespace."""
    return {v.__name__: port_variant(v, base, module) for v in VARIANTS}

"""The staged attention API's seven example variants (eight classes: LocalWindow came first), as
its documentation writes them: a subclass, one stage overridden with the API's signature
(**kwargs, [batch, seq, heads, head_dim]), super() for the default. Each is the spec's class of
the same name (ode_ref/variants.py) and computes the same function; settings are fields, checked
by the spec's own checks.

    ScaledQueryAttention     preprocess_qkv    q * (query_scale + time_gain * t)
    TiedKeysAttention        project           k = q (keys tied to queries)
    UnitNormQKAttention      preprocess_qkv    q, k scaled to unit length per head
    LocalWindowAttention     build_mask        keys with |i - j| < window only
    RecentKeysAttention      build_mask        the `window` most recent keys: i - window < j <= i
    CoolerAttention          attn              the query scale halved inside attn
    DropFirstHeadAttention   postprocess_attn  the first head's output zeroed
    ScaledOutputAttention    output_proj       the output projection times output_scale
"""

from __future__ import annotations

import jax.numpy as jnp

from ode_ref.variants import check_factor, check_window

from ..jax.attention import slot_indices
from .attention import SelfAttention, query_slot

__all__ = ["ScaledQueryAttention", "TiedKeysAttention", "UnitNormQKAttention", "LocalWindowAttention",
           "RecentKeysAttention", "CoolerAttention", "DropFirstHeadAttention", "ScaledOutputAttention"]


class ScaledQueryAttention(SelfAttention):
    """preprocess_qkv: q * (query_scale + time_gain * t); a non-autonomous f when time_gain != 0."""

    query_scale: float = 2.0
    time_gain: float = 0.5

    def __post_init__(self):
        check_factor("query_scale", self.query_scale), check_factor("time_gain", self.time_gain)
        super().__post_init__()

    def preprocess_qkv(self, q, k, v, **kwargs):
        q, k, v = super().preprocess_qkv(q, k, v, **kwargs)
        return q * (self.query_scale + self.time_gain * kwargs["t"]), k, v


class TiedKeysAttention(SelfAttention):
    """project: the keys are the queries (c_attn's key columns are not read)."""

    def project(self, x):
        q, _, v = super().project(x)
        return q, q, v


class UnitNormQKAttention(SelfAttention):
    """preprocess_qkv: q and k divided by their length over head_dim, after RoPE:
    q / sqrt(sum q^2 + eps)."""

    eps: float = 1e-6

    def preprocess_qkv(self, q, k, v, **kwargs):
        q, k, v = super().preprocess_qkv(q, k, v, **kwargs)
        q, k = (a / jnp.sqrt(jnp.sum(a * a, axis=-1, keepdims=True) + self.eps) for a in (q, k))
        return q, k, v


class LocalWindowAttention(SelfAttention):
    """build_mask: also hide keys with |i - j| >= window; cache-aware (the query's slot)."""

    window: int = 2

    def __post_init__(self):
        check_window(self.window)
        super().__post_init__()

    def build_mask(self, t, padding_mask=None, **kwargs):
        mask = super().build_mask(t, padding_mask, **kwargs)
        i, j = slot_indices(t, query_slot(kwargs))
        return mask & (abs(i - j) < self.window)


class RecentKeysAttention(SelfAttention):
    """build_mask: only the `window` most recent keys, i - window < j <= i; cache-aware."""

    window: int = 4

    def __post_init__(self):
        check_window(self.window)
        super().__post_init__()

    def build_mask(self, t, padding_mask=None, **kwargs):
        mask = super().build_mask(t, padding_mask, **kwargs)
        i, j = slot_indices(t, query_slot(kwargs))
        return mask & (j <= i) & (j > i - self.window)


class CoolerAttention(SelfAttention):
    """attn: the query scale halved, scores * scale / 2: a flatter softmax."""

    def attn(self, q, k, v, mask=None, **kwargs):
        return super().attn(q * 0.5, k, v, mask, **kwargs)


class DropFirstHeadAttention(SelfAttention):
    """postprocess_attn: head 0's output zeroed, y [batch, seq, heads, head_dim]."""

    def postprocess_attn(self, y, padding_mask, deterministic, **kwargs):
        keep = jnp.asarray([[0.0]] + [[1.0]] * (self.config.num_heads - 1), dtype=y.dtype)  # (heads, 1)
        return super().postprocess_attn(y, padding_mask, deterministic, **kwargs) * keep


class ScaledOutputAttention(SelfAttention):
    """output_proj: c_proj's output times output_scale."""

    output_scale: float = 0.5

    def __post_init__(self):
        check_factor("output_scale", self.output_scale)
        super().__post_init__()

    def output_proj(self, y):
        return super().output_proj(y) * self.output_scale

"""The spec's two example variants in JAX; port of ode_ref/variants.py."""

from __future__ import annotations

import jax.numpy as jnp

from ode_ref.variants import check_window

from .attention import SelfAttention


class ScaledQueryAttention(SelfAttention):
    def __init__(self, config, query_scale: float = 2.0, time_gain: float = 0.5):
        super().__init__(config)
        self.query_scale, self.time_gain = float(query_scale), float(time_gain)

    def preprocess_qkv(self, q, k, v, *, t, positions):
        return q * (self.query_scale + self.time_gain * t), k, v


class LocalWindowAttention(SelfAttention):
    def __init__(self, config, window: int = 2):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None):
        i = jnp.arange(seq_len)
        local = jnp.abs(i[:, None] - i[None, :]) < self.window
        return super().build_mask(seq_len, padding_mask) & local

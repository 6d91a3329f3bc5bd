"""The spec's two example variants in JAX; port of ode_ref/variants.py."""

from __future__ import annotations

import jax.numpy as jnp

from ode_ref.variants import ScaledQuery, check_window

from .attention import SelfAttention, slot_indices


class ScaledQueryAttention(ScaledQuery, SelfAttention):
    """The port's SelfAttention with the spec's ScaledQuery stage."""


class LocalWindowAttention(SelfAttention):
    def __init__(self, config, window: int = 2):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = slot_indices(seq_len, cache_index)
        local = jnp.abs(i - j) < self.window
        return super().build_mask(seq_len, padding_mask, cache_index=cache_index) & local

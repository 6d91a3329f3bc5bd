"""Two example variants of the staged ODE function, each one overridden stage.

They show how a user changes one stage and still gets every solver, mask and backend for free;
the backends port both with the same names, and the tests check the ports against these.
"""

from __future__ import annotations

import numpy as np

from .attention import SelfAttention, slot_indices


class ScaledQuery:
    """preprocess_qkv: q * (query_scale + time_gain * t); a non-autonomous f when time_gain != 0.
    Only * and +, so every port mixes in this same class before its own SelfAttention."""

    def __init__(self, config, query_scale: float = 2.0, time_gain: float = 0.5):
        super().__init__(config)
        self.query_scale, self.time_gain = float(query_scale), float(time_gain)

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        q, k, v = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        return q * (self.query_scale + self.time_gain * t), k, v


class ScaledQueryAttention(ScaledQuery, SelfAttention):
    """The spec's SelfAttention with the ScaledQuery stage."""


def check_window(window) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an integer >= 1; got {window!r}")
    return window


class LocalWindowAttention(SelfAttention):
    """build_mask: also hide keys with |i - j| >= window (a sliding window of width 2 window - 1)."""

    def __init__(self, config, window: int = 2):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = slot_indices(seq_len, cache_index)
        local = np.abs(i - j) < self.window
        return super().build_mask(seq_len, padding_mask, cache_index=cache_index) & local

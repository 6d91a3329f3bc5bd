"""Positional encodings in JAX; port of ode_ref/positions.py (the frequencies and slopes are the
spec's own float64 constants).

Difference, same values: with x64 off JAX has no float64 at run time, so rope_cos_sin gathers rows
of a cos/sin table that the spec computes in float64 at trace time, for positions -1 .. bound - 1
(-1: left padding); bound is static (the sequence length, or the cache's max_len).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ode_ref import positions as spec
from ode_ref.positions import alibi_slopes


def rope_cos_sin(positions, config, dtype, bound: int):
    """(cos, sin), each (batch | 1, seq, P) in dtype, for integer positions in [-1, bound)."""
    cos, sin = spec.rope_cos_sin(np.arange(-1, bound), config, np.float64)
    row = positions + 1
    return jnp.take(jnp.asarray(cos, dtype), row, axis=0), jnp.take(jnp.asarray(sin, dtype), row, axis=0)


def apply_rope(x, cos, sin):
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation."""
    pairs = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = jnp.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return jnp.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)


def alibi_bias(positions_q, positions_k, config, dtype):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(slope_h * |p_i - p_j|)."""
    slopes = jnp.asarray(alibi_slopes(config.num_heads), dtype)[:, None, None]
    distance = jnp.abs(positions_q[:, None, :, None] - positions_k[:, None, None, :]).astype(dtype)
    return -(slopes * distance)

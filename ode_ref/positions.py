"""Positional encodings: rotary (RoPE, the seed's convention) and ALiBi, as the seed applies them.

Positions are token indices among the real tokens: cumsum(padding_mask) - 1 (left padding gets
-1, never read), or the cache slot's count of real tokens when decoding. They do not depend on t,
so prepare computes the encodings once per block:

    rope_cos_sin(positions, config, dtype)  (cos, sin), each (batch | 1, seq, P), P = head_dim // 2
    apply_rope(x, cos, sin)                 x (batch, seq, heads, head_dim) rotated pairwise
    alibi_bias(positions_q, positions_k, config, dtype)
                                            (batch | 1, heads, seq_q, seq_k) score bias

Seed convention (not RoFormer/Llama's): the pairs are interleaved, (x[2i], x[2i+1]), with an odd
head_dim's last channel untouched, and frequency i is base ** (-i / (P - 1)), from 1 down to
1 / base (P == 1: frequency 1), not base ** (-2i / head_dim).

Precision, decided here: the angle (p * rope_scaling) * frequency_i and its cos and sin are
computed in float64, then cos and sin are rounded once to the state's dtype. An angle computed in
float32, as the seed computes it in the tensor's dtype, carries an absolute error of about
|angle| * u32 that grows with the context (at p = 2047, over 1000 times float32's unit roundoff
in q and k: tests/ode_ref/test_positions.py). Rounded from float64, cos and sin add a few
roundings to q and k, the order of the projection before them, which the suite's float32
tolerance (derived from the spec's own float32 run of each case, tolerance.py) covers without a
term of its own. Ports without float64 at run time (JAX with x64 off) gather rows of a table this
module computes in float64.

ALiBi: bias[h, i, j] = -(slope_h * |p_i - p_j|), in the state's dtype (the distance is an exact
integer, so one rounding); added to the scaled scores before the mask fill (attention.py), so a
fully masked row stays finite. The slopes are Press and Smith's: 2 ** (-8 (h + 1) / H) for H a
power of two; else the P slopes of the largest power of two P < H, then the even-indexed slopes
of 2P, the first H - P of them.
"""

from __future__ import annotations

import numpy as np


def rope_frequencies(config) -> np.ndarray:
    """float64 (P,): base ** (-i / (P - 1)) for i < P = head_dim // 2 ([1] when P == 1)."""
    pairs = config.head_dim // 2
    exponent = -np.arange(pairs) / (pairs - 1) if pairs > 1 else np.zeros(pairs)
    return np.power(config.rope_base, exponent)


def rope_angles(positions, config) -> np.ndarray:
    """float64 (..., P): (p * rope_scaling) * frequency_i for integer positions (...)."""
    p = np.asarray(positions, dtype=np.float64) * config.rope_scaling
    return p[..., None] * rope_frequencies(config)


def rope_cos_sin(positions, config, dtype):
    """(cos, sin) of the angles, computed in float64 and rounded once to dtype."""
    angles = rope_angles(positions, config)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x, cos, sin):
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation
    y[2i] = x[2i] cos - x[2i+1] sin, y[2i+1] = x[2i] sin + x[2i+1] cos; channel 2P (odd head_dim) kept."""
    pairs = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = np.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return np.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """float64 (num_heads,): Press and Smith's geometric slopes."""

    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(np.log2(n) - 3)))  # 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    p = 2 ** int(np.floor(np.log2(num_heads)))
    slopes = power_of_two(p)
    if p < num_heads:
        slopes += power_of_two(2 * p)[0::2][: num_heads - p]
    return np.asarray(slopes, dtype=np.float64)


def alibi_bias(positions_q, positions_k, config, dtype):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(slope_h * |p_i - p_j|), one rounding."""
    slopes = alibi_slopes(config.num_heads).astype(dtype)[:, None, None]
    distance = np.abs(positions_q[:, None, :, None] - positions_k[:, None, None, :]).astype(dtype)
    return -(slopes * distance)


def apply_rope_vjp(y_bar, cos, sin):
    """x_bar of apply_rope(x, cos, sin): the inverse rotation (the transpose of a rotation)."""
    return apply_rope(y_bar, cos, -sin)

"""Positional encodings in PyTorch; port of ode_ref/positions.py (the frequencies and slopes are
the spec's own float64 constants). The angles, cos and sin are computed in float64 torch ops on
the positions' device, then rounded once to the state's dtype, as the spec decides."""

from __future__ import annotations

import torch

from ode_ref.positions import alibi_slopes, rope_frequencies


@torch.compiler.assume_constant_result
def _constants(name: str, config) -> list:
    """The spec's float64 constants as Python floats (torch.compile folds them, unread by tracing)."""
    return (rope_frequencies(config) if name == "rope" else alibi_slopes(config.num_heads)).tolist()


def rope_cos_sin(positions, config, dtype):
    """(cos, sin), each (batch | 1, seq, P) in dtype, of the float64 angles (p * scaling) * frequency."""
    freq = torch.tensor(_constants("rope", config), dtype=torch.float64, device=positions.device)
    angles = (positions.to(torch.float64) * config.rope_scaling)[..., None] * freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation."""
    pairs = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)
    return torch.cat([rotated, x[..., 2 * pairs:]], dim=-1)


def alibi_bias(positions_q, positions_k, config, dtype):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(slope_h * |p_i - p_j|)."""
    slopes = torch.tensor(_constants("alibi", config), dtype=dtype, device=positions_q.device)
    distance = (positions_q[:, None, :, None] - positions_k[:, None, None, :]).abs().to(dtype)
    return -(slopes[:, None, None] * distance)

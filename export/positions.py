"""Positional encodings as ONNX nodes; port of ode_ref/positions.py (the frequencies and slopes
are the spec's own float64 constants). The angles, cos and sin are computed in double (ONNX
Runtime's Cos and Sin take doubles), then cast to float32 once, as the spec decides."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ode_ref.positions import alibi_slopes, rope_frequencies

from .graph import Value


def rope_cos_sin(positions: Value, config):
    """(cos, sin), each float32 (batch | 1, seq, P), of the double angles (p * scaling) * frequency."""
    g = positions.body
    p = g.op("Cast", positions, to=TensorProto.DOUBLE) * g.const(config.rope_scaling, np.float64)
    angles = g.op("Unsqueeze", p, g.ints(-1)) * g.const(rope_frequencies(config), np.float64)
    return tuple(g.op("Cast", g.op(op, angles), to=TensorProto.FLOAT) for op in ("Cos", "Sin"))


def apply_rope(x: Value, cos: Value, sin: Value) -> Value:
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation on
    x's first 2P channels viewed (..., P, 2); an odd head_dim's last channel is put back unchanged."""
    g = x.body
    pairs = g.op("Shape", cos, start=2, end=3)  # (1,) int64: P
    two_p = pairs * 2
    body = g.op("Slice", x, g.ints(0), two_p, g.ints(3))
    shape = g.op("Concat", g.ints(0, 0, 0), pairs, g.ints(2), axis=0)
    even, odd = g.op("Split", g.op("Reshape", body, shape), g.ints(1, 1), axis=-1, outputs=2)
    c, s = (g.op("Unsqueeze", a, g.ints(2, 4)) for a in (cos, sin))  # (batch | 1, seq, 1, P, 1)
    rotated = g.op("Concat", even * c - odd * s, even * s + odd * c, axis=-1)
    rotated = g.op("Reshape", rotated, g.op("Concat", g.ints(0, 0, 0), two_p, axis=0))
    rest = g.op("Slice", x, two_p, g.ints(np.iinfo(np.int64).max), g.ints(3))  # empty for an even head_dim
    return g.op("Concat", rotated, rest, axis=-1)


def alibi_bias(positions_q: Value, positions_k: Value, config) -> Value:
    """float32 (batch | 1, heads, seq_q, seq_k): -(slope_h * |p_i - p_j|)."""
    g = positions_q.body
    distance = g.op("Abs", g.op("Sub", g.op("Unsqueeze", positions_q, g.ints(1, 3)), g.op("Unsqueeze", positions_k, g.ints(1, 2))))
    slopes = g.const(alibi_slopes(config.num_heads)[:, None, None])
    return g.op("Neg", slopes * g.op("Cast", distance, to=TensorProto.FLOAT))

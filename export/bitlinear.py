"""BitLinear as ONNX nodes; port of ode_ref/bitlinear.py.

The weights are quantised once, at export, with the spec's own function (ternarize_weight in
float32): the file stores W's ternary values transposed, as int8, and the float32 scale w_s; the
graph computes W_q^T = ternary^T / w_s once, before the steps. Activations are quantised in the
graph at every evaluation, as the spec does.
"""

from __future__ import annotations

import numpy as np

from ode_ref.bitlinear import ACT_MAX, QUANT_EPS

from .graph import Value
from .norms import layer_norm


def quantize_weight(ternary_t: Value, scale: Value) -> Value:
    """W_q^T = float(ternary^T) / w_s, (in, out): the ternary values and w_s come from the spec's
    ternarize_weight at export time (export.block)."""
    return ternary_t.body.op("Cast", ternary_t, to=1) / scale


def quantize_activation(x: Value, *, width: int) -> Value:
    g = x.body
    x_n = layer_norm(x, g.const(np.ones(width)), g.const(np.zeros(width)))
    scale = ACT_MAX / g.op("Max", g.reduce("ReduceMax", g.op("Abs", x_n)), g.const(QUANT_EPS))
    return g.op("Clip", g.op("Round", x_n * scale), g.const(-128.0), g.const(127.0)) / scale


def bitlinear(x: Value, w_q_t: Value, *, width: int) -> Value:
    """x: (..., in), w_q_t: (in, out) quantised and transposed -> (..., out)."""
    return x.body.op("MatMul", quantize_activation(x, width=width), w_q_t)


def linear(x: Value, w_t: Value) -> Value:
    """x: (..., in), w_t: (in, out) -> (..., out); no bias."""
    return x.body.op("MatMul", x, w_t)

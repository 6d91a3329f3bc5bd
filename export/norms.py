"""The six pre-norms as ONNX nodes; port of ode_ref/norms.py (same names, same formulas).

Elementary nodes at every opset, with the statistics on x / s for a per-token power of two s
(ode_ref.norms.pow2_scale), so that they are exact for every finite float32 input: ONNX's
LayerNormalization and RMSNormalization take one epsilon for the tensor, not eps / s^2 per token.
"""

from __future__ import annotations

import math

import numpy as np

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels

from .graph import Value


def pow2_scale(x: Value) -> Value:
    """A power of two s >= 1 per token near max|x| (see ode_ref.norms.pow2_scale): 2^max(0, floor(log2 m))."""
    g = x.body
    k = g.op("Floor", g.op("Log", g.reduce("ReduceMax", g.op("Abs", x))) / math.log(2.0))  # Log(0) = -inf
    k = g.op("Min", g.op("Max", k, g.const(0.0)), g.const(126.0))  # 1 / s stays a normal float32
    return g.op("Pow", g.const(2.0), k)


TINY = float(np.finfo(np.float32).tiny)


def _eps_over(eps, s: Value, power: int) -> Value:
    """eps / s^power, at least the smallest normal float32: see ode_ref.norms._eps_over."""
    return s.body.op("Max", eps / s if power == 1 else eps / s / s, s.body.const(TINY))


def layer_norm(x: Value, weight, bias, *, eps=LAYER_NORM_EPS):
    g = x.body
    s = pow2_scale(x)
    xs = x / s
    centred = xs - g.reduce("ReduceMean", xs)
    return centred / g.op("Sqrt", g.reduce("ReduceMean", centred * centred) + _eps_over(eps, s, 2)) * weight + bias


def _rms(x: Value, stat_of: Value, eps):
    g = x.body
    s = pow2_scale(stat_of)
    scaled = stat_of / s
    return (x / s) / g.op("Sqrt", g.reduce("ReduceMean", scaled * scaled) + _eps_over(eps, s, 2))


def rms_norm(x: Value, weight: Value, *, eps=RMS_EPS):
    return weight * _rms(x, x, eps)


def prms_norm(x: Value, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION, width=None):
    g = x.body
    k = prms_channels(width, fraction)
    partial = g.op("Slice", x, g.ints(0), g.ints(k), g.ints(-1))
    return weight * _rms(x, partial, eps)


def flash_norm(x: Value, *, eps=RMS_EPS):
    return _rms(x, x, eps)


def dynamic_tanh(x: Value, alpha, beta, *, eps=DYT_EPS, width=None):
    g = x.body
    s = pow2_scale(x)
    xs = x / s
    centred = xs - g.reduce("ReduceMean", xs)
    std = g.op("Sqrt", g.reduce("ReduceSum", centred * centred) / float(width - 1))
    return g.op("Tanh", centred / (std + _eps_over(eps, s, 1)) * alpha + beta)


def derf(x: Value, alpha, s, gamma, beta):
    return gamma * x.body.op("Erf", alpha * x + s) + beta


NORMS = norm_table(globals())
NEEDS_WIDTH = ("prms_norm", "dynamic_tanh")  # the width is static in the graph


def apply_norm(norm_type: str, norm_params: dict, x: Value, *, width: int):
    extra = {"width": width} if norm_type in NEEDS_WIDTH else {}
    return NORMS[norm_type](x, **norm_params, **extra)

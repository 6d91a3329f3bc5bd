"""The six pre-norms as ONNX nodes; port of ode_ref/norms.py (same names, same formulas).

layer_norm is LayerNormalization (opset 17). At opset 23, rms_norm and flash_norm are
RMSNormalization; below it they, and prms_norm and dynamic_tanh, are elementary nodes.
"""

from __future__ import annotations

import numpy as np

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels

from .graph import Value


def layer_norm(x: Value, weight: Value, bias: Value, *, eps=LAYER_NORM_EPS):
    return x.body.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=eps)


def _rms(x: Value, stat_of: Value, eps):
    g = x.body
    return x / g.op("Sqrt", g.reduce("ReduceMean", stat_of * stat_of) + eps)


def rms_norm(x: Value, weight: Value, *, eps=RMS_EPS):
    if x.body.opset >= 23:
        return x.body.op("RMSNormalization", x, weight, axis=-1, epsilon=eps)
    return weight * _rms(x, x, eps)


def prms_norm(x: Value, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION, width=None):
    g = x.body
    k = prms_channels(width, fraction)
    partial = g.op("Slice", x, g.ints(0), g.ints(k), g.ints(-1))
    return weight * _rms(x, partial, eps)


def flash_norm(x: Value, *, eps=RMS_EPS, width=None):
    if x.body.opset >= 23:
        return x.body.op("RMSNormalization", x, x.body.const(np.ones(width)), axis=-1, epsilon=eps)
    return _rms(x, x, eps)


def dynamic_tanh(x: Value, alpha, beta, *, eps=DYT_EPS, width=None):
    g = x.body
    centred = x - g.reduce("ReduceMean", x)
    std = g.op("Sqrt", g.reduce("ReduceSum", centred * centred) / float(width - 1))
    return g.op("Tanh", centred / (std + eps) * alpha + beta)


def derf(x: Value, alpha, s, gamma, beta):
    return gamma * x.body.op("Erf", alpha * x + s) + beta


NORMS = norm_table(globals())
NEEDS_WIDTH = ("prms_norm", "dynamic_tanh", "flash_norm")  # the width is static in the graph


def apply_norm(norm_type: str, norm_params: dict, x: Value, *, width: int):
    extra = {"width": width} if norm_type in NEEDS_WIDTH else {}
    return NORMS[norm_type](x, **norm_params, **extra)

"""The six pre-norms of ODEFunc, one function each, all over the last axis (d_model).

Every function maps x: (..., d_model) to the same shape and dtype. Parameters named "vector" in
NORM_PARAMS have shape (d_model,); "scalar" ones have shape (). The identity values are those
the parameters are initialised to (params.init_params).
"""

from __future__ import annotations

import math

import numpy as np

LAYER_NORM_EPS = 1e-5
RMS_EPS = 1e-6
DYT_EPS = 1e-6
PRMS_FRACTION = 0.0625

# name -> {parameter: (shape kind, identity value)}; order is the seed's state_dict order.
NORM_PARAMS: dict[str, dict[str, tuple[str, float]]] = {
    "layer_norm": {"weight": ("vector", 1.0), "bias": ("vector", 0.0)},
    "rms_norm": {"weight": ("vector", 1.0)},
    "prms_norm": {"weight": ("vector", 1.0)},
    "flash_norm": {},
    "dynamic_tanh": {"alpha": ("vector", 1.0), "beta": ("vector", 0.0)},
    "derf": {"alpha": ("scalar", 1.0), "s": ("scalar", 0.0), "gamma": ("vector", 1.0), "beta": ("vector", 0.0)},
}
NORM_TYPES: tuple[str, ...] = tuple(NORM_PARAMS)


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    """(x - mean) / sqrt(var + eps) * weight + bias, var biased (divides by n)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, *, eps=RMS_EPS):
    """weight * x / sqrt(mean(x^2) + eps)."""
    return weight * (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))


def prms_norm(x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    """rms_norm with mean(x^2) over the first k = max(1, ceil(fraction * n)) channels only."""
    k = prms_channels(x.shape[-1], fraction)
    partial = x[..., :k]
    return weight * (x / np.sqrt((partial * partial).mean(axis=-1, keepdims=True) + eps))


def prms_channels(n: int, fraction: float = PRMS_FRACTION) -> int:
    """How many leading channels prms_norm's statistic uses."""
    return max(1, math.ceil(fraction * n))


def flash_norm(x, *, eps=RMS_EPS):
    """x / sqrt(mean(x^2) + eps); no parameters."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def dynamic_tanh(x, alpha, beta, *, eps=DYT_EPS):
    """tanh((x - mean) / (std + eps) * alpha + beta), std unbiased (divides by n - 1)."""
    mean = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))
    return np.tanh((x - mean) / (std + eps) * alpha + beta)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    """The error function elementwise (libm's erf in float64, rounded back to x's dtype)."""
    return _erf(x).astype(x.dtype)


def derf(x, alpha, s, gamma, beta):
    """gamma * erf(alpha * x + s) + beta, alpha and s scalars."""
    return gamma * erf(alpha * x + s) + beta


def norm_table(namespace: dict) -> dict:
    """norm_type -> the function of that name in a module's namespace (this one, or a port's)."""
    return {name: namespace[name] for name in NORM_TYPES}


NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    """The norm named norm_type with its parameters given by name (keys of NORM_PARAMS)."""
    return NORMS[norm_type](x, **norm_params)

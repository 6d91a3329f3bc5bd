"""The six pre-norms in JAX; port of ode_ref/norms.py (same names, same formulas)."""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import erf

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, *, eps=RMS_EPS):
    return weight * (x / jnp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))


def prms_norm(x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    partial = x[..., : prms_channels(x.shape[-1], fraction)]
    return weight * (x / jnp.sqrt((partial * partial).mean(axis=-1, keepdims=True) + eps))


def flash_norm(x, *, eps=RMS_EPS):
    return x / jnp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def dynamic_tanh(x, alpha, beta, *, eps=DYT_EPS):
    mean = x.mean(axis=-1, keepdims=True)
    std = jnp.sqrt(((x - mean) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))
    return jnp.tanh((x - mean) / (std + eps) * alpha + beta)


def derf(x, alpha, s, gamma, beta):
    return gamma * erf(alpha * x + s) + beta


NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)

"""The six pre-norms in JAX; port of ode_ref/norms.py (same names, same formulas)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import erf

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels


def pow2_scale(x):
    """s = 2^max(0, floor(log2 max|x|)) per token: see ode_ref.norms.pow2_scale."""
    _, exponent = jnp.frexp(jax.lax.stop_gradient(jnp.abs(x).max(axis=-1, keepdims=True)))
    top = jnp.finfo(x.dtype).maxexp - 2  # 1 / s stays normal (XLA flushes subnormals to zero)
    return jnp.ldexp(jnp.ones((), x.dtype), jnp.clip(exponent - 1, 0, top))


def _eps_over(eps, s, power: int):
    """eps / s^power, at least the smallest normal number: see ode_ref.norms._eps_over."""
    return jnp.maximum(eps / s if power == 1 else eps / s / s, jnp.finfo(s.dtype).tiny)


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    s = pow2_scale(x)
    centred = x / s - (x / s).mean(axis=-1, keepdims=True)
    var = (centred**2).mean(axis=-1, keepdims=True)
    return centred / jnp.sqrt(var + _eps_over(eps, s, 2)) * weight + bias


def rms_norm(x, weight, *, eps=RMS_EPS):
    return weight * _rms(x, x, eps)


def _rms(x, stat_of, eps):
    s = pow2_scale(stat_of)
    return (x / s) / jnp.sqrt(((stat_of / s) ** 2).mean(axis=-1, keepdims=True) + _eps_over(eps, s, 2))


def prms_norm(x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    return weight * _rms(x, x[..., : prms_channels(x.shape[-1], fraction)], eps)


def flash_norm(x, *, eps=RMS_EPS):
    return _rms(x, x, eps)


def dynamic_tanh(x, alpha, beta, *, eps=DYT_EPS):
    s = pow2_scale(x)
    centred = x / s - (x / s).mean(axis=-1, keepdims=True)
    std = jnp.sqrt((centred**2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))
    return jnp.tanh(centred / (std + _eps_over(eps, s, 1)) * alpha + beta)


def derf(x, alpha, s, gamma, beta):
    return gamma * erf(alpha * x + s) + beta


NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)

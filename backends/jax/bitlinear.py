"""BitLinear in JAX; port of ode_ref/bitlinear.py. The straight-through estimator is a
custom_jvp whose forward is the spec's quantiser exactly and whose derivative is the identity."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ode_ref.bitlinear import ACT_MAX, QUANT_EPS

from .norms import layer_norm


def _straight_through(quantiser):
    """quantiser in the forward pass, the identity in the derivative."""
    wrapped = jax.custom_jvp(quantiser)
    wrapped.defjvp(lambda primals, tangents: (wrapped(*primals), tangents[0]))
    return wrapped


def weight_scale(w):
    return 1.0 / jnp.maximum(jnp.abs(w).mean(), QUANT_EPS)


def ternarize_weight(w):
    scale = weight_scale(w)
    return jnp.clip(jnp.round(w * scale), -1, 1), scale


@_straight_through
def quantize_weight(w):
    ternary, scale = ternarize_weight(w)
    return ternary / scale


@_straight_through
def _quantize_levels(x_n):
    scale = ACT_MAX / jnp.maximum(jnp.abs(x_n).max(axis=-1, keepdims=True), QUANT_EPS)
    return jnp.clip(jnp.round(x_n * scale), -128, 127) / scale


def quantize_activation(x):
    return _quantize_levels(layer_norm(x, 1.0, 0.0))


def bitlinear(x, w_q):
    return quantize_activation(x) @ w_q.T


def linear(x, w):
    return x @ w.T

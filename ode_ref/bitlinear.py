"""BitLinear (BitNet b1.58): ternary weights, 8-bit per-token activations, no bias.

    x_n = layer_norm(x)                      no affine, eps 1e-5, last axis
    a_s = 127 / max(max|x_n|, 1e-5)          per token (last axis)
    x_q = clip(round(x_n * a_s), -128, 127) / a_s
    w_s = 1 / max(mean|W|, 1e-5)             whole tensor
    W_q = clip(round(W * w_s), -1, 1) / w_s
    y   = x_q @ W_q^T

round is half-to-even. W_q depends on the weights only, so a block computes it once per forward
(quantize_weight), never inside the ODE loop. Training uses the straight-through estimator (the
forward is quantised, the gradient is that of the identity); that is a backend matter.
"""

from __future__ import annotations

import numpy as np

from .norms import layer_norm, layer_norm_vjp

QUANT_EPS = 1e-5
ACT_MAX = 127.0  # activation levels: clip to [-128, 127] after scaling max|x_n| to 127


def weight_scale(w):
    """w_s = 1 / max(mean|W|, eps), a scalar of w's dtype."""
    return w.dtype.type(1.0) / np.maximum(np.abs(w).mean(), w.dtype.type(QUANT_EPS))


def ternarize_weight(w):
    """(ternary, w_s): ternary = clip(round(W * w_s), -1, 1) in {-1, 0, 1}, w's dtype."""
    scale = weight_scale(w)
    return np.clip(np.round(w * scale), -1, 1), scale


def quantize_weight(w):
    """W_q = ternary / w_s: (out, in) -> (out, in)."""
    ternary, scale = ternarize_weight(w)
    return ternary / scale


def quantize_activation(x):
    """x_q: (..., in) -> (..., in), per-token 8-bit levels of the normalised input."""
    x_n = layer_norm(x, 1.0, 0.0)
    scale = ACT_MAX / np.maximum(np.abs(x_n).max(axis=-1, keepdims=True), QUANT_EPS)
    return np.clip(np.round(x_n * scale), -128, 127) / scale


def bitlinear(x, w_q):
    """x: (..., in), w_q: (out, in) already quantised -> (..., out)."""
    return quantize_activation(x) @ w_q.T


def linear(x, w):
    """x: (..., in), w: (out, in) -> (..., out); no bias."""
    return x @ w.T


# ---- the backward pass ------------------------------------------------------------------------------
def linear_vjp(y_bar, x, w):
    """(x_bar (..., in), w_bar (out, in)) of x @ w.T for the cotangent y_bar (..., out)."""
    return y_bar @ w, y_bar.reshape(-1, w.shape[0]).T @ x.reshape(-1, w.shape[1])


def bitlinear_vjp(y_bar, x, w_q):
    """(x_bar, w_q_bar) of bitlinear(x, w_q), the seed's straight-through estimator: the gradient
    passes through each quantiser as the identity (so w_q_bar is also W's gradient), and through
    the input's layer_norm as its true gradient."""
    x_q_bar, w_q_bar = linear_vjp(y_bar, quantize_activation(x), w_q)
    return layer_norm_vjp(x_q_bar, x, 1.0, 0.0)[0], w_q_bar

"""The six pre-norms of ODEFunc, one function each, all over the last axis (d_model).

Every function maps x: (..., d_model) to the same shape and dtype. Parameters named "vector" in
NORM_PARAMS have shape (d_model,); "scalar" ones have shape (). The identity values are those
the parameters are initialised to (params.init_params). The formulas are the methods of Norms,
written over an array namespace; this module's functions are those of its NumPy instance.
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


class Norms:
    """The norm formulas, written once over the array namespace self.xp with NumPy's names (NumPy
    here). A port subclasses it with its own xp and overrides only what its framework does
    otherwise (backends/jax/norms.py, backends/torch/norms.py); this module's functions are the
    methods of the spec's instance, SPEC_NORMS."""

    xp = np  # the array namespace: jax.numpy in JAX, backends/torch/xp.py in PyTorch

    def pow2_scale(self, x):
        """s = 2^max(0, floor(log2 max|x|)) per token (last axis): a power of two, so x / s and
        eps / s^2 are exact, and every statistic below is computed on x / s, where squares cannot
        overflow. Each norm is written so that, wherever the plain formula does not overflow, it
        gives the same bits (scaling by a power of two commutes with rounding, sqrt included), except
        where x / s falls among the subnormal numbers (a few ulp, far below any tolerance); for
        |x| < 2, s = 1. So the norms are exact for every finite input, float32 |x| ~ 1e19 .. 3e38 too.
        Any power of two >= 1 within a small factor of max|x| does the same: a port may compute it
        another way (torch and the export: pow(2, floor(log2 max|x|)); JAX: from the exponent bits)."""
        xp = self.xp
        _, exponent = xp.frexp(xp.abs(x).max(axis=-1, keepdims=True))
        top = xp.finfo(x.dtype).maxexp - 2  # s <= 2^126 (float32): 1 / s stays a normal number
        return xp.ldexp(xp.ones((), x.dtype), xp.clip(exponent - 1, 0, top))

    def _eps_over(self, eps, s, power: int):
        """eps / s^power, kept at least the smallest normal number: a token of equal values has
        centred values 0 and then gives 0 (then bias), not 0 / 0; elsewhere no bit changes."""
        return self.xp.maximum(eps / s if power == 1 else eps / s / s, self.xp.finfo(s.dtype).tiny)

    def layer_norm(self, x, weight, bias, *, eps=LAYER_NORM_EPS):
        """(x - mean) / sqrt(var + eps) * weight + bias, var biased (divides by n)."""
        s = self.pow2_scale(x)
        centred = x / s - (x / s).mean(axis=-1, keepdims=True)  # (x - mean) / s
        var = (centred**2).mean(axis=-1, keepdims=True)  # var / s^2
        return centred / self.xp.sqrt(var + self._eps_over(eps, s, 2)) * weight + bias

    def rms_norm(self, x, weight, *, eps=RMS_EPS):
        """weight * x / sqrt(mean(x^2) + eps)."""
        return weight * self._rms(x, x, eps)

    def _rms(self, x, stat_of, eps):
        """x / sqrt(mean(stat_of^2) + eps), on stat_of / s (s = pow2_scale(stat_of))."""
        s = self.pow2_scale(stat_of)
        return (x / s) / self.xp.sqrt(((stat_of / s) ** 2).mean(axis=-1, keepdims=True) + self._eps_over(eps, s, 2))

    def prms_norm(self, x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
        """rms_norm with mean(x^2) over the first k = max(1, ceil(fraction * n)) channels only."""
        return weight * self._rms(x, x[..., :prms_channels(x.shape[-1], fraction)], eps)

    def flash_norm(self, x, *, eps=RMS_EPS):
        """x / sqrt(mean(x^2) + eps); no parameters."""
        return self._rms(x, x, eps)

    def dynamic_tanh(self, x, alpha, beta, *, eps=DYT_EPS):
        """tanh((x - mean) / (std + eps) * alpha + beta), std unbiased (divides by n - 1)."""
        s = self.pow2_scale(x)
        centred = x / s - (x / s).mean(axis=-1, keepdims=True)  # (x - mean) / s
        std = self.xp.sqrt((centred**2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))  # std / s
        return self.xp.tanh(centred / (std + self._eps_over(eps, s, 1)) * alpha + beta)

    def erf(self, x):
        """The error function elementwise (libm's erf in float64, rounded back to x's dtype)."""
        return _erf(x).astype(x.dtype)

    def derf(self, x, alpha, s, gamma, beta):
        """gamma * erf(alpha * x + s) + beta, alpha and s scalars."""
        return gamma * self.erf(alpha * x + s) + beta

    def functions(self) -> tuple:
        """pow2_scale and the six norms, this instance's: the module functions of the same names."""
        return (self.pow2_scale, self.layer_norm, self.rms_norm, self.prms_norm, self.flash_norm, self.dynamic_tanh,
                self.derf)


def prms_channels(n: int, fraction: float = PRMS_FRACTION) -> int:
    """How many leading channels prms_norm's statistic uses."""
    return max(1, math.ceil(fraction * n))


_erf = np.vectorize(math.erf, otypes=[np.float64])
SPEC_NORMS = Norms()
pow2_scale, layer_norm, rms_norm, prms_norm, flash_norm, dynamic_tanh, derf = SPEC_NORMS.functions()
erf = SPEC_NORMS.erf


def norm_table(namespace: dict) -> dict:
    """norm_type -> the function of that name in a module's namespace (this one, or a port's)."""
    return {name: namespace[name] for name in NORM_TYPES}


NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    """The norm named norm_type with its parameters given by name (keys of NORM_PARAMS)."""
    return NORMS[norm_type](x, **norm_params)


# ---- the backward pass: each norm's vector-Jacobian product ---------------------------------------
# name_vjp(y_bar, x, **params) -> (x_bar, {parameter: its gradient}); y_bar has x's shape. A vector
# parameter's gradient sums over every axis but the last; a scalar's over all. pow2_scale is
# piecewise constant, so its derivative is zero: these are the gradients of the plain formulas.

def _over_tokens(a):
    """Sum over every axis but the last: a vector parameter's gradient, (d_model,)."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


def _normalised(x, eps):
    """((x - mean) / sqrt(var + eps), 1 / sqrt(var + eps)), var biased."""
    centred = x - x.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps)
    return centred * inv, inv


def layer_norm_vjp(y_bar, x, weight, bias, *, eps=LAYER_NORM_EPS):
    x_hat, inv = _normalised(x, eps)
    g = y_bar * weight
    x_bar = inv * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    return x_bar, {"weight": _over_tokens(y_bar * x_hat), "bias": _over_tokens(y_bar)}


def _rms_vjp(g, x, k: int, eps):
    """x_bar of x * r, r = (mean(x[..., :k]^2) + eps)^(-1/2), for the cotangent g of x * r."""
    r = 1.0 / np.sqrt((x[..., :k] ** 2).mean(axis=-1, keepdims=True) + eps)
    x_bar = g * r
    x_bar[..., :k] -= x[..., :k] * r**3 * (g * x).sum(axis=-1, keepdims=True) / k
    return x_bar, x * r


def rms_norm_vjp(y_bar, x, weight, *, eps=RMS_EPS):
    x_bar, normed = _rms_vjp(y_bar * weight, x, x.shape[-1], eps)
    return x_bar, {"weight": _over_tokens(y_bar * normed)}


def prms_norm_vjp(y_bar, x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    x_bar, normed = _rms_vjp(y_bar * weight, x, prms_channels(x.shape[-1], fraction), eps)
    return x_bar, {"weight": _over_tokens(y_bar * normed)}


def flash_norm_vjp(y_bar, x, *, eps=RMS_EPS):
    return _rms_vjp(y_bar, x, x.shape[-1], eps)[0], {}


def dynamic_tanh_vjp(y_bar, x, alpha, beta, *, eps=DYT_EPS):
    n = x.shape[-1]
    centred = x - x.mean(axis=-1, keepdims=True)
    std = np.sqrt((centred**2).sum(axis=-1, keepdims=True) / (n - 1))
    y = np.tanh(centred / (std + eps) * alpha + beta)
    u_bar = y_bar * (1.0 - y**2)  # through tanh
    std_bar = -(u_bar * alpha * centred).sum(axis=-1, keepdims=True) / (std + eps) ** 2
    # d std / d centred = centred / ((n - 1) std); a constant token (std 0, a padded one) has centred 0: 0
    d_std = np.divide(centred, (n - 1) * std, out=np.zeros_like(centred), where=std > 0)
    c_bar = u_bar * alpha / (std + eps) + std_bar * d_std
    x_bar = c_bar - c_bar.mean(axis=-1, keepdims=True)
    return x_bar, {"alpha": _over_tokens(u_bar * centred / (std + eps)), "beta": _over_tokens(u_bar)}


def derf_vjp(y_bar, x, alpha, s, gamma, beta):
    z = alpha * x + s
    z_bar = y_bar * gamma * (2.0 / math.sqrt(math.pi)) * np.exp(-(z**2))
    return z_bar * alpha, {"alpha": np.asarray((z_bar * x).sum()), "s": np.asarray(z_bar.sum()),
                           "gamma": _over_tokens(y_bar * erf(z)), "beta": _over_tokens(y_bar)}


NORM_VJPS = {name: globals()[name + "_vjp"] for name in NORM_TYPES}


def apply_norm_vjp(norm_type: str, norm_params: dict, x, y_bar):
    """(x_bar, {parameter: gradient}) of apply_norm(norm_type, norm_params, x) for the cotangent y_bar."""
    return NORM_VJPS[norm_type](y_bar, x, **norm_params)

"""The six pre-norms in PyTorch; port of ode_ref/norms.py (same names, same formulas).

In eager mode, layer_norm and rms_norm run torch's own kernels, which skip the spec's power-of-two
prescale and so differ from it only in rounding order, within the conformance tolerance (on
ill-conditioned float32 rows, at most 2.8x the spec's own float32 error). Squaring x unscaled, a
kernel gives 0 or NaN once a sum of squares overflows; its per-token rstd then is not > 0, and the
written-out formula runs instead, for the failing tokens only: the others keep the kernel's bits,
so a token's norm never depends on what another token holds. Compiled and exported code always runs the written-out formula.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, NORM_PARAMS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels


def pow2_scale(x):
    """A power of two s >= 1 per token, within a factor 2 of max|x|: see ode_ref.norms.pow2_scale
    (any power of two keeps the norms exact; log2 and exp2 rather than frexp, which
    torch.onnx.export cannot translate)."""
    top = math.floor(math.log2(torch.finfo(x.dtype).max)) - 1  # 126 for float32: 1 / s stays normal
    return torch.exp2(torch.floor(torch.log2(x.detach().abs().amax(dim=-1, keepdim=True))).clamp(0, top))


def _eps_over(eps, s, power: int):
    """eps / s^power, at least the smallest normal number: see ode_ref.norms._eps_over."""
    return (eps / s if power == 1 else eps / s / s).clamp(min=torch.finfo(s.dtype).tiny)


def fused(kernel, x, *args):
    """(kernel(x, *args)'s output, None), or (that output, ok) when the written-out formula must
    run for the tokens where ok (batch, seq, 1) is False: those whose sum of squares overflowed
    (its rstd, the last of the kernel's outputs, not > 0; NaN in x fails it too: torch's min
    propagates NaN); or None, the formula for every token, when compiling or tracing. The rstd's
    smallest entry as a Python float: a third of the time of `bool((rstd > 0).all())`."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or x.numel() == 0:
        return None
    y, *_, rstd = kernel(x, *args)
    return (y, None) if rstd.min().item() > 0 else (y, rstd > 0)


def _fallback(kernel_out, formula):
    """The kernel's output where it is good, formula() (run only when needed) elsewhere, per token."""
    if kernel_out is None:
        return formula()
    y, ok = kernel_out
    return y if ok is None else torch.where(ok, y, formula())


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    def formula():
        s = pow2_scale(x)
        centred = x / s - (x / s).mean(dim=-1, keepdim=True)
        var = (centred**2).mean(dim=-1, keepdim=True)
        return centred / torch.sqrt(var + _eps_over(eps, s, 2)) * weight + bias

    kernel = isinstance(weight, torch.Tensor)
    return _fallback(fused(torch.native_layer_norm, x, x.shape[-1:], weight, bias, eps) if kernel else None, formula)


def rms_norm(x, weight, *, eps=RMS_EPS):
    kernel_out = fused(torch.ops.aten._fused_rms_norm, x, x.shape[-1:], weight, eps)
    return _fallback(kernel_out, lambda: weight * _rms(x, x, eps))


def _rms(x, stat_of, eps):
    s = pow2_scale(stat_of)
    return (x / s) / torch.sqrt(((stat_of / s) ** 2).mean(dim=-1, keepdim=True) + _eps_over(eps, s, 2))


def prms_norm(x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    return weight * _rms(x, x[..., : prms_channels(x.shape[-1], fraction)], eps)


def flash_norm(x, *, eps=RMS_EPS):
    return _rms(x, x, eps)


def dynamic_tanh(x, alpha, beta, *, eps=DYT_EPS):
    s = pow2_scale(x)
    centred = x / s - (x / s).mean(dim=-1, keepdim=True)
    std = torch.sqrt((centred**2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1))
    return torch.tanh(centred / (std + _eps_over(eps, s, 1)) * alpha + beta)


def derf(x, alpha, s, gamma, beta):
    return gamma * torch.erf(alpha * x + s) + beta


NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)


class Norm(nn.Module):
    """Holds the norm's parameters under the seed's names (norm.weight, norm.alpha, ...)."""

    def __init__(self, norm_type: str, dim: int):
        super().__init__()
        self.norm_type = norm_type
        for name, (kind, identity) in NORM_PARAMS[norm_type].items():
            shape = (dim,) if kind == "vector" else ()
            self.register_parameter(name, nn.Parameter(torch.full(shape, identity)))

    def forward(self, *args):
        """norm(x), the seed's call, with this module's parameters; or norm(norm_params, x), the
        stage's call from ode_ref's Stages, with the parameters as prepared (the same tensors)."""
        norm_params, x = (dict(self.named_parameters()), args[0]) if len(args) == 1 else args
        return apply_norm(self.norm_type, norm_params, x)

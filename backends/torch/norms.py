"""The six pre-norms in PyTorch; port of ode_ref/norms.py (same names, same formulas).

layer_norm and rms_norm run torch's fused kernels (F.layer_norm, F.rms_norm: one pass, where the
written-out formula is about ten elementwise operations) when that is safe: in eager mode, and
when every |x| < FUSED_MAX. The fused kernels compute the same formula without the spec's
power-of-two prescale, so they differ from it only in rounding order (the conformance tolerance's
"another summation order"), and square x unscaled: float32 overflows from |x| ~ 1e19 (measured:
F.layer_norm returns NaN at 1e20), where the written-out formula stays exact. Compiled and
exported code (torch.compile, torch.export) always runs the written-out formula, which the
compiler fuses itself, and so has no data-dependent branch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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


# Below this, a fused kernel's unscaled squares and their sums over d_model cannot overflow
# float32 or bfloat16 (both reach 2^127): (2^40)^2 * 2^40 channels = 2^120.
FUSED_MAX = 2.0**40


def fused_ok(x) -> bool:
    """Whether a fused norm kernel may run on x: eager mode and every |x| < FUSED_MAX (a NaN or an
    infinity fails the test, and takes the written-out formula)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or x.numel() == 0:
        return False
    lo, hi = torch.aminmax(x.detach())
    return bool(torch.maximum(-lo, hi) < FUSED_MAX)


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    if isinstance(weight, torch.Tensor) and fused_ok(x):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    s = pow2_scale(x)
    centred = x / s - (x / s).mean(dim=-1, keepdim=True)
    var = (centred**2).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(var + _eps_over(eps, s, 2)) * weight + bias


def rms_norm(x, weight, *, eps=RMS_EPS):
    if fused_ok(x):
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return weight * _rms(x, x, eps)


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

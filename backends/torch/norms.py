"""The six pre-norms in PyTorch: the spec's formulas (ode_ref.norms.Norms) over torch (xp.py), with
the spec's names; this file writes again only what torch does otherwise: pow2_scale, and its
fused kernels for layer_norm and rms_norm.

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

from ode_ref import norms as spec
from ode_ref.norms import LAYER_NORM_EPS, NORM_PARAMS, RMS_EPS, norm_table, prms_channels  # noqa: F401  (prms_channels: the spec's name, mirrored)

from .xp import namespace


class Norms(spec.Norms):
    """The spec's norms over torch under NumPy's names (xp.py); the norms create no arrays, so the
    namespace's device is never used."""

    xp = namespace(None)

    def pow2_scale(self, x):
        """A power of two s >= 1 per token, within a factor 2 of max|x|: see ode_ref.norms.pow2_scale
        (any power of two keeps the norms exact; log2 and pow(2, e) rather than frexp, which
        torch.onnx.export cannot translate, or exp2, which is outside the Core ATen opset that
        ExecuTorch takes and that LiteRT's converter lacks; pow of 2 is exact at every integer e, tests/backends/torch)."""
        top = math.frexp(torch.finfo(x.dtype).max)[1] - 2  # 126 for float32, 1022 for float64: 1 / s stays normal
        return torch.pow(2.0, torch.floor(torch.log2(x.detach().abs().amax(dim=-1, keepdim=True))).clamp(0, top))

    def layer_norm(self, x, weight, bias, *, eps=LAYER_NORM_EPS):
        """torch.native_layer_norm in eager mode, the spec's formula where it fails (fused)."""
        kernel_out = fused(torch.native_layer_norm, x, x.shape[-1:], weight, bias, eps) if isinstance(weight, torch.Tensor) else None
        return _fallback(kernel_out, lambda: super(Norms, self).layer_norm(x, weight, bias, eps=eps))

    def rms_norm(self, x, weight, *, eps=RMS_EPS):
        """aten._fused_rms_norm in eager mode, the spec's formula where it fails (fused)."""
        kernel_out = fused(torch.ops.aten._fused_rms_norm, x, x.shape[-1:], weight, eps)
        return _fallback(kernel_out, lambda: super(Norms, self).rms_norm(x, weight, eps=eps))

    def erf(self, x):
        """torch.erf (the spec's calls libm's per element in NumPy)."""
        return torch.erf(x)


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


TORCH_NORMS = Norms()
pow2_scale, layer_norm, rms_norm, prms_norm, flash_norm, dynamic_tanh, derf = TORCH_NORMS.functions()
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

"""BitLinear in PyTorch; port of ode_ref/bitlinear.py, with the straight-through estimator.

Forward values equal the spec's; with autograd on, the rounding is bypassed in the backward pass
(y = x + (q(x) - x).detach()), so gradients flow as if quantisation were the identity.
"""

from __future__ import annotations

import torch
from torch import nn

from ode_ref.bitlinear import ACT_MAX, QUANT_EPS

from .norms import layer_norm


def _straight_through(x, quantised):
    """quantised in the forward pass, identity in the backward pass (exact value without grad)."""
    if not x.requires_grad:
        return quantised
    return x + (quantised - x).detach()


def weight_scale(w):
    return 1.0 / torch.clamp(w.abs().mean(), min=QUANT_EPS)


def ternarize_weight(w):
    scale = weight_scale(w)
    return torch.clamp(torch.round(w * scale), -1, 1), scale


def quantize_weight(w):
    ternary, scale = ternarize_weight(w)
    return _straight_through(w, ternary / scale)


def quantize_activation(x):
    x_n = layer_norm(x, 1.0, 0.0)
    scale = ACT_MAX / torch.clamp(x_n.abs().amax(dim=-1, keepdim=True), min=QUANT_EPS)
    return _straight_through(x_n, torch.clamp(torch.round(x_n * scale), -128, 127) / scale)


def bitlinear(x, w_q):
    return quantize_activation(x) @ w_q.transpose(-1, -2)


def linear(x, w):
    return x @ w.transpose(-1, -2)


class BitLinear(nn.Linear):
    """nn.Linear without bias whose forward is BitLinear; the block quantises .weight once per
    forward itself (attention.SelfAttention.prepare), so this forward is for standalone use."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x):
        return bitlinear(x, quantize_weight(self.weight))

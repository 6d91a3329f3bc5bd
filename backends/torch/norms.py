"""The six pre-norms in PyTorch; port of ode_ref/norms.py (same names, same formulas)."""

from __future__ import annotations

import torch
from torch import nn

from ode_ref.norms import DYT_EPS, LAYER_NORM_EPS, NORM_PARAMS, PRMS_FRACTION, RMS_EPS, norm_table, prms_channels


def layer_norm(x, weight, bias, *, eps=LAYER_NORM_EPS):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, *, eps=RMS_EPS):
    return weight * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def prms_norm(x, weight, *, eps=RMS_EPS, fraction=PRMS_FRACTION):
    partial = x[..., : prms_channels(x.shape[-1], fraction)]
    return weight * (x / torch.sqrt((partial * partial).mean(dim=-1, keepdim=True) + eps))


def flash_norm(x, *, eps=RMS_EPS):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def dynamic_tanh(x, alpha, beta, *, eps=DYT_EPS):
    mean = x.mean(dim=-1, keepdim=True)
    std = torch.sqrt(((x - mean) ** 2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1))
    return torch.tanh((x - mean) / (std + eps) * alpha + beta)


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

    def forward(self, norm_params: dict, x):
        """The stage norm(norm_params, z): norm_params are this module's parameters, as prepared."""
        return apply_norm(self.norm_type, norm_params, x)

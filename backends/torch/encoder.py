"""The ODE Transformer's encoder in PyTorch; port of ode_ref/encoder.py as nn.Modules.

    ODEEncoderLayer(config).forward(x, padding_mask=None)   L(x), one encoder layer
    ODEEncoder(config).forward(x, padding_mask=None)        the stack of RK blocks

The modules' state_dict keys are the released encoder's (ode_ref/encoder_params.py), so the stack
of a released checkpoint loads strict: ``load_encoder_params(encoder, state_dict)`` (the spec's
checks, then stack_params, which leaves out the embedding's keys and stacks a fairseq 0.10 layer's
q, k and v projections, then a strict load). x is (batch, seq, C) and padding_mask True for a
real token, as everywhere in odeattn (fairseq's layers take (seq, batch, C) and True for a pad).

The block, the stack, the layer's orchestration and its primitives are the spec's
(ode_ref.encoder.ODEEncoderStages over a dict of this module's parameters) over torch (xp.py), but
those TorchEncoderStages writes again. Dropout, in training, is drawn anew at every call, so at
every stage evaluation, as released.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ode_ref.attention import causal_mask
from ode_ref.encoder import ODEEncoderStages, check_encoder_input
from ode_ref.encoder_config import ODEEncoderConfig
from ode_ref.encoder_params import (ALPHA, TEMPORAL_FINAL_NORM, alpha_init, check_encoder_params, encoder_param_shapes,
                                    lower_mean, stack_params, temporal_init)

from .params import params_to_state_dict
from .xp import namespace


class TorchEncoderStages(ODEEncoderStages):
    """The spec's stages over torch under NumPy's names (xp.py; they create no arrays, so its device
    is never used); written again: torch's own kernels (F.linear, F.layer_norm, softmax, relu,
    sigmoid) and dropout."""

    xp = namespace(None)

    def linear(self, x, weight, bias):
        return F.linear(x, weight, bias)

    def layer_norm(self, x, weight, bias):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps=1e-5)

    def softmax(self, scores):
        return torch.softmax(scores, dim=-1)

    def relu(self, x):
        return torch.relu(x)

    def dropout(self, x, p: float):
        return F.dropout(x, p, training=self.training) if p > 0 else x

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def constant(self, value, like):
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)

    def causal_triangle(self, x):
        return causal_mask(x.shape[1], namespace(x.device))


def _xavier_linear(n_in: int, n_out: int) -> nn.Linear:
    linear = nn.Linear(n_in, n_out)
    nn.init.xavier_uniform_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


class SelfAttention(nn.Module):
    """The fused-projection attention's parameters (in_proj_weight, in_proj_bias, out_proj)."""

    def __init__(self, c: int):
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.empty(3 * c, c))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * c))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.out_proj = _xavier_linear(c, c)


class ODEEncoderLayer(nn.Module):
    """fairseq's encoder layer: self_attn, fc1, fc2, layer_norms.0 and .1 (released keys); a
    Macaron layer's macaron_fc1, macaron_fc2 and layer_norms.2 besides, as macaron-net names them."""

    def __init__(self, config):
        super().__init__()
        cfg = ODEEncoderConfig.from_any(config)
        self.config, self.stages = cfg, TorchEncoderStages(cfg)
        c, ff = cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim
        self.self_attn = SelfAttention(c)
        self.fc1, self.fc2 = _xavier_linear(c, ff), _xavier_linear(ff, c)
        if cfg.macaron:
            self.macaron_fc1, self.macaron_fc2 = _xavier_linear(c, ff), _xavier_linear(ff, c)
        self.layer_norms = nn.ModuleList([nn.LayerNorm(c, eps=1e-5) for _ in range(3 if cfg.macaron else 2)])

    def forward(self, x, padding_mask=None):
        """L(x): (batch, seq, C) -> (batch, seq, C)."""
        check_encoder_input(x, self.config, padding_mask, array_type=torch.Tensor, bool_dtype=torch.bool)
        self.stages.training = self.training
        return self.stages.layer(dict(self.named_parameters()), "", x, self.stages.key_mask(padding_mask))


class CorrectorHistory(nn.Module):
    """PCformer's corrector's parameters, as its released history module holds them: weight and
    weight_c (layers + 1, layers + 1) initialised to their row means over the lower triangle, and
    a LayerNorm per layer in layer_norms and in rouge_predictions_norm."""

    def __init__(self, layers: int, c: int):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(lower_mean(layers + 1), dtype=torch.get_default_dtype()))
        self.weight_c = nn.Parameter(torch.tensor(lower_mean(layers + 1), dtype=torch.get_default_dtype()))
        self.layer_norms = nn.ModuleList([nn.LayerNorm(c, eps=1e-5) for _ in range(layers)])
        self.rouge_predictions_norm = nn.ModuleList([nn.LayerNorm(c, eps=1e-5) for _ in range(layers)])


def _temporal_init(name: str, shape: tuple) -> torch.Tensor:
    """A time-dependent stack's parameter: f_weight, f_bias and f_b as released (encoder_params.temporal_init),
    the other matrices Xavier-uniform (qkvflow draws haliax's normal init), biases 0, ln_f's weight 1."""
    kind = temporal_init(name)
    if kind == "small":
        return 1e-4 * torch.randn(shape)
    if kind == "zeros" or len(shape) == 1:
        return torch.ones(shape) if name == TEMPORAL_FINAL_NORM + "weight" else torch.zeros(shape)
    return nn.init.xavier_uniform_(torch.empty(shape))


def _add_parameters(module: nn.Module, shapes: dict, init) -> None:
    """module's parameters under dotted names (block.attn.c_attn.f_W.weight), each a submodule's
    path, so that the state_dict's keys are the names."""
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        node = module
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, nn.Parameter(init(name, shape)))


class ODEEncoder(nn.Module):
    """The stack: layers.0 .. layers.N-1, layer_norm (pre-norm), gate_linear (rk2_gated), alpha
    (rk2_weighted; an ema family's), history (PCformer's corrector), with the released init
    (Xavier-uniform weights, zero biases, alpha 1, an ema family's 1/2); or qkvflow's block and
    ln_f (time_embed_dim > 0)."""

    def __init__(self, config):
        super().__init__()
        cfg = ODEEncoderConfig.from_any(config)
        self.config, self.stages = cfg, TorchEncoderStages(cfg)
        c = cfg.encoder_embed_dim
        if cfg.temporal:  # qkvflow's: one block, its keys the released module paths
            _add_parameters(self, encoder_param_shapes(cfg), _temporal_init)
            return
        self.layers = nn.ModuleList([ODEEncoderLayer(cfg) for _ in range(cfg.encoder_layers)])
        if cfg.encoder_normalize_before:
            self.layer_norm = nn.LayerNorm(c, eps=1e-5)
        if cfg.family == "rk2_gated":
            self.gate_linear = _xavier_linear(2 * c, 1)
        if ALPHA in encoder_param_shapes(cfg):  # rk2_weighted's, or an ema family's
            self.alpha = nn.Parameter(torch.full(encoder_param_shapes(cfg)[ALPHA], alpha_init(cfg)))
        if cfg.corrector:
            self.history = CorrectorHistory(cfg.encoder_layers, c)

    @classmethod
    def from_params(cls, config, params: dict, *, dtype=torch.float32) -> "ODEEncoder":
        """An encoder in evaluation mode holding the spec's params (checked, loaded strict)."""
        encoder = cls(config).to(dtype).eval()
        load_encoder_params(encoder, params)
        return encoder

    def forward(self, x, padding_mask=None):
        """x (batch, seq, C) -> (batch, seq, C); padding_mask (batch, seq) bool, True = real token."""
        check_encoder_input(x, self.config, padding_mask, array_type=torch.Tensor, bool_dtype=torch.bool)
        dtype = next(self.parameters()).dtype
        if x.dtype != dtype:
            raise TypeError(f"x: expected the encoder's dtype {dtype}; got {x.dtype}")
        self.stages.training = self.training
        return self.stages.encoder(dict(self.named_parameters()), x, padding_mask)


def load_encoder_params(encoder: ODEEncoder, params: dict) -> None:
    """Check params (the spec's, or a released state_dict's stack_params) against the encoder's
    config, then copy them in, strict."""
    params = stack_params({k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in params.items()})
    check_encoder_params(params, encoder.config)
    encoder.load_state_dict(params_to_state_dict(params, next(encoder.parameters()).dtype), strict=True)

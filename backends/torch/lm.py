"""The spec's language model (ode_ref/lm.py) as an nn.Module; its state_dict keys are the spec's
parameter names, so conversion either way is a copy.

    ODELanguageModel(config).forward(ids, attention_mask=None) -> logits (batch, seq, vocab)
    lm_params_from_state_dict(state_dict) -> the spec's params (float64 NumPy)

embed_tokens (nn.Embedding) -> blocks (ODEAttentionBlock each, the port's; block 'layer': a
one-layer ODEEncoder each, run causally by the spec's stages, ode_ref/lm_layer.py) -> norm
(nn.LayerNorm, eps 1e-5) -> lm_head (nn.Linear, no bias).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ode_ref.lm import LMConfig, check_ids, check_lm_params
from ode_ref.lm_layer import visible_keys
from ode_ref.norms import LAYER_NORM_EPS

from .block import ODEAttentionBlock
from .encoder import ODEEncoder
from .params import params_to_state_dict, state_dict_to_params


class ODELanguageModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = LMConfig.from_any(config)
        cfg = self.config
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        block = (lambda: ODEEncoder(cfg.layer_config)) if cfg.block == "layer" else (lambda: ODEAttentionBlock(cfg.block_config))
        self.blocks = nn.ModuleList(block() for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @classmethod
    def from_params(cls, config, params: dict, *, dtype=torch.float32) -> "ODELanguageModel":
        """A model in evaluation mode with the spec's parameters (checked, strict names)."""
        model = cls(config).to(dtype).eval()
        check_lm_params(params, model.config)
        model.load_state_dict(params_to_state_dict(params, dtype), strict=True)
        return model

    def forward(self, ids, attention_mask=None):
        """ids (batch, seq) int -> logits (batch, seq, vocab); attention_mask True or 1 = a real token.
        Both are torch Tensors, as every entry point of the port takes (TypeError naming one that is not)."""
        for name, value in (("ids", ids), ("attention_mask", attention_mask)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor (torch.as_tensor converts a NumPy array); got "
                                f"{type(value).__name__}")
        ids_np, mask_np = check_ids(np.asarray(ids.cpu()), self.config,
                                    None if attention_mask is None else np.asarray(attention_mask.cpu()))
        mask = None if mask_np is None else torch.as_tensor(mask_np, device=ids.device)
        z = self.embed_tokens(torch.as_tensor(ids_np, device=ids.device))
        if self.config.block == "layer":  # the spec's causal stages over the stack's parameters
            keys = np.ones(ids_np.shape, bool) if mask_np is None else mask_np
            visible = torch.as_tensor(visible_keys(keys, 0, ids_np.shape[1]), device=ids.device)
        for block in self.blocks:
            if self.config.block == "layer":
                block.stages.training = self.training  # its dropout, as ODEEncoder.forward sets it
                z = block.stages.block(dict(block.named_parameters()), 0, z, visible)
            else:
                z = block(z, padding_mask=mask)
        return self.lm_head(self.norm(z))


def lm_params_from_state_dict(state_dict: dict) -> dict:
    """An ODELanguageModel's state_dict -> the spec's params (float64 NumPy), by the same names."""
    return state_dict_to_params(state_dict)

"""The spec's two example variants in PyTorch; port of ode_ref/variants.py."""

from __future__ import annotations

import torch

from ode_ref.variants import ScaledQuery, check_window

from .attention import SelfAttention


class ScaledQueryAttention(ScaledQuery, SelfAttention):
    """The port's SelfAttention with the spec's ScaledQuery stage."""


class LocalWindowAttention(SelfAttention):
    def __init__(self, config, window: int = 2):
        super().__init__(config)
        self.window = check_window(window)

    def build_mask(self, seq_len, padding_mask=None):
        i = torch.arange(seq_len, device=self.qkv.weight.device)
        local = ((i[:, None] - i[None, :]).abs() < self.window)[None, None]
        mask = super().build_mask(seq_len, padding_mask)
        return local if mask is None else mask & local

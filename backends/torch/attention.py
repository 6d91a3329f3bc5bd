"""ODEFunc as a staged self-attention in PyTorch; port of ode_ref/attention.py.

The stages and their order are the spec's. Differences, each computing the same values:
  - the module owns its parameters under the seed's names (qkv, out_proj, norm), so prepare
    takes no params argument, and the stage `norm` is the module self.norm;
  - attn is torch.nn.functional.scaled_dot_product_attention (dropout on the attention weights
    in training mode only); build_mask returns None when every key is visible, which lets SDPA
    pick its fused kernels;
  - SDPA returns a zero row for a fully masked query (the spec: a uniform row); only padded
    queries have one, and postprocess_attn zeroes those in both.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ode_ref.block import check_input
from ode_ref.config import ODEConfig

from .bitlinear import BitLinear, bitlinear, linear, quantize_weight
from .norms import Norm

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def causal_mask(seq_len: int, device=None):
    """(seq, seq) bool, True where key j <= query i."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def positions_from_padding(padding_mask, seq_len: int, device=None):
    if padding_mask is None:
        return torch.arange(seq_len, device=device)[None, :]
    return torch.cumsum(padding_mask.long(), dim=-1) - 1


class Prepared(NamedTuple):
    """What every evaluation of f shares within one block forward (computed once)."""

    qkv: torch.Tensor  # (3 d_model, d_model), quantised (with STE) when use_bitnet
    out_proj: torch.Tensor  # (d_model, d_model)
    mask: Optional[torch.Tensor]  # bool (batch | 1, 1, seq, seq) True = visible; None = all
    padding_mask: Optional[torch.Tensor]  # bool (batch, seq)
    positions: torch.Tensor  # long (batch | 1, seq)


class SelfAttention(nn.Module):
    """The seed's ODEFunc: forward(t, x, padding_mask=None) is f evaluated once."""

    def __init__(self, config):
        super().__init__()
        cfg = ODEConfig.from_any(config)
        self.config = cfg
        self.dim, self.num_heads, self.head_dim, self.scale = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.scale
        self.mode = cfg.mode
        linear_cls = BitLinear if cfg.use_bitnet else (lambda i, o: nn.Linear(i, o, bias=False))
        self.qkv = linear_cls(self.dim, 3 * self.dim)
        self.out_proj = linear_cls(self.dim, self.dim)
        self.norm = Norm(cfg.norm_type, self.dim)
        self.dropout = nn.Dropout(cfg.dropout)

    # ---- once per block -------------------------------------------------------------------
    def prepare(self, x, padding_mask=None) -> Prepared:
        check_input(x, self.config, padding_mask, array_type=torch.Tensor, float_dtypes=FLOAT_DTYPES, bool_dtype=torch.bool)
        if x.dtype != self.qkv.weight.dtype:
            raise TypeError(
                f"x: expected dtype {self.qkv.weight.dtype} (the module's parameter dtype; "
                f"convert the module with .to(dtype)); got {x.dtype}"
            )
        qkv, out = self.qkv.weight, self.out_proj.weight
        if self.config.use_bitnet:
            qkv, out = quantize_weight(qkv), quantize_weight(out)
        seq_len = x.shape[1]
        return Prepared(
            qkv=qkv,
            out_proj=out,
            mask=self.build_mask(seq_len, padding_mask, device=x.device),
            padding_mask=padding_mask,
            positions=positions_from_padding(padding_mask, seq_len, device=x.device),
        )

    def build_mask(self, seq_len: int, padding_mask=None, device=None):
        mask = None
        if self.mode == "decoder":
            mask = causal_mask(seq_len, device)[None, None]
        if padding_mask is not None:
            keys = padding_mask[:, None, None, :]
            mask = keys if mask is None else mask & keys
        return mask

    # ---- every evaluation of f --------------------------------------------------------------
    def _linear(self, x, w):
        return bitlinear(x, w) if self.config.use_bitnet else linear(x, w)

    def project(self, w_qkv, h):
        """h: (batch, seq, d_model) -> q, k, v each (batch, seq, heads, head_dim)."""
        b, t, _ = h.shape
        qkv = self._linear(h, w_qkv).view(b, t, 3, self.num_heads, self.head_dim)
        return qkv.unbind(dim=2)

    def preprocess_qkv(self, q, k, v, *, t, positions):
        return q, k, v

    def attn(self, q, k, v, mask):
        """q, k, v: (batch, seq, heads, head_dim) -> like q."""
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        p = self.dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=self.scale)
        return y.transpose(1, 2)  # (batch, seq, heads, head_dim)

    def postprocess_attn(self, y, padding_mask=None):
        if padding_mask is None:
            return y
        return y * padding_mask[:, :, None, None].to(y.dtype)

    def output_proj(self, w_out, y):
        return self._linear(y, w_out)

    def evaluate(self, prepared: Prepared, t, z):
        """f(t, z) from prepared weights and mask: (batch, seq, d_model) -> same."""
        h = self.norm(z)
        q, k, v = self.project(prepared.qkv, h)
        q, k, v = self.preprocess_qkv(q, k, v, t=t, positions=prepared.positions)
        y = self.attn(q, k, v, prepared.mask)
        y = self.postprocess_attn(y, prepared.padding_mask)
        return self.output_proj(prepared.out_proj, y.reshape(z.shape))

    def forward(self, t, x, padding_mask=None):
        return self.evaluate(self.prepare(x, padding_mask), t, x)


ODEFunc = SelfAttention  # the seed's name

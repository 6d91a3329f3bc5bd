"""ODEFunc as a staged self-attention in PyTorch; port of ode_ref/attention.py.

The stage order and prepare are the spec's own (ode_ref.attention.Stages); the stages are torch.
Differences, each computing the same values:
  - the module owns its parameters under the seed's names (qkv, out_proj, norm), so prepare
    takes no params argument, and the stage `norm` is the module self.norm (its forward takes
    the prepared norm parameters, as the spec's stage does);
  - attn is torch.nn.functional.scaled_dot_product_attention (dropout on the attention weights
    in training mode only); build_mask returns None when every key is visible, which lets SDPA
    pick its fused kernels;
  - SDPA returns a zero row for a fully masked query (the spec: a uniform row); only padded
    queries have one, and postprocess_attn zeroes those in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ode_ref.attention import Prepared, Stages
from ode_ref.block import INPUT_DTYPES, check_input
from ode_ref.config import ODEConfig

from .bitlinear import BitLinear, bitlinear, linear, quantize_weight
from .norms import Norm



def causal_mask(seq_len: int, device=None):
    """(seq, seq) bool, True where key j <= query i."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def positions_from_padding(padding_mask, seq_len: int, device=None):
    if padding_mask is None:
        return torch.arange(seq_len, device=device)[None, :]
    return torch.cumsum(padding_mask.long(), dim=-1) - 1


class SelfAttention(Stages, nn.Module):
    """The seed's ODEFunc: forward(t, x, padding_mask=None) is f evaluated once. The stage order
    and prepare are ode_ref's Stages; this class writes the stages in torch."""

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

    # ---- once per block (Stages.prepare) --------------------------------------------------
    def prepare(self, x, padding_mask=None) -> Prepared:
        """The module owns its parameters, so prepare takes none (Stages.prepare gets the module's)."""
        check_input(x, self.config, padding_mask, array_type=torch.Tensor, float_dtypes=INPUT_DTYPES, bool_dtype=torch.bool)
        if x.dtype != self.qkv.weight.dtype:
            raise TypeError(
                f"x: expected dtype {self.qkv.weight.dtype} (the module's parameter dtype; "
                f"convert the module with .to(dtype)); got {x.dtype}"
            )
        return Stages.prepare(self, None, x, padding_mask)

    def weights(self, params, x):
        """The module's own parameters (params is None): already in x's dtype, checked above."""
        return self.qkv.weight, self.out_proj.weight, dict(self.norm.named_parameters())

    quantize_weight = staticmethod(quantize_weight)

    def positions_from_padding(self, padding_mask, seq_len: int):
        return positions_from_padding(padding_mask, seq_len, device=self.qkv.weight.device)

    def seq_len(self, x) -> int:
        return x.shape[1]

    def build_mask(self, seq_len: int, padding_mask=None):
        """bool (batch | 1, 1, seq, seq), or None when every key is visible (SDPA's fast path)."""
        mask = None
        if self.mode == "decoder":
            mask = causal_mask(seq_len, self.qkv.weight.device)[None, None]
        if padding_mask is not None:
            keys = padding_mask[:, None, None, :]
            mask = keys if mask is None else mask & keys
        return mask

    # ---- every evaluation of f (Stages.evaluate) --------------------------------------------
    def hide_padding(self, z, padding_mask=None):
        if padding_mask is None:
            return z
        return torch.where(padding_mask[:, :, None], z, z.new_zeros(()))

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

    def merge_heads(self, y):
        """(batch, seq, heads, head_dim) -> (batch, seq, d_model)."""
        return y.reshape(*y.shape[:2], self.dim)

    def output_proj(self, w_out, y):
        return self._linear(y, w_out)

    def forward(self, t, x, padding_mask=None):
        return self.evaluate(self.prepare(x, padding_mask), t, x)


ODEFunc = SelfAttention  # the seed's name

"""ODEFunc as a staged self-attention, f(t, z) for z: (batch, seq, d_model).

    prepare          once per block: cast parameters, quantise BitLinear weights, build the mask
    norm             h = norm(z)                                   (batch, seq, d_model)
    project          q, k, v = split(h @ Wqkv^T)                   (batch, seq, heads, head_dim) each
    preprocess_qkv   identity here; a variant may scale or rotate q, k (gets t and positions)
    attn             softmax((q @ k^T) * scale where mask else -big, over keys) @ v
    postprocess_attn zero the output of padded queries
    output_proj      (y merged to (batch, seq, d_model)) @ Wout^T

A variant subclasses SelfAttention and overrides one stage (see variants.py); ode_block integrates
any variant. Masks are boolean, True = visible. A masked score is replaced by the dtype's most
negative finite value, not -inf, so a fully masked row (a padded query under the causal mask)
gives a uniform row instead of NaN; postprocess_attn then zeroes it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .bitlinear import bitlinear, linear, quantize_weight
from .config import ODEConfig
from .norms import apply_norm
from .params import norm_params_of


def softmax(s, axis=-1):
    """exp(s - max) / sum, stable for any finite s (the max subtraction keeps exp <= 1)."""
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_mask(seq_len: int):
    """(seq, seq) bool, True where key j <= query i."""
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))


def positions_from_padding(padding_mask, seq_len: int):
    """(batch | 1, seq) int positions: cumsum(mask) - 1, or 0 .. seq-1 without a mask."""
    if padding_mask is None:
        return np.arange(seq_len)[None, :]
    return np.cumsum(padding_mask, axis=-1) - 1


def masked_fill_min(s, mask):
    """s where mask is True, else the dtype's most negative finite value."""
    return np.where(mask, s, np.finfo(s.dtype).min)


class Prepared(NamedTuple):
    """What every evaluation of f shares within one block forward (computed once)."""

    qkv: np.ndarray  # (3 d_model, d_model), BitLinear-quantised when use_bitnet
    out_proj: np.ndarray  # (d_model, d_model), likewise
    norm: dict  # norm parameters by short name, in the state's dtype
    mask: np.ndarray  # bool (batch | 1, 1, seq, seq), True = visible
    padding_mask: Optional[np.ndarray]  # bool (batch, seq), True = real token
    positions: np.ndarray  # int (batch | 1, seq)


class SelfAttention:
    """The staged ODE function. Override a stage to make a variant; keep the signatures."""

    def __init__(self, config):
        self.config = ODEConfig.from_any(config)

    # ---- once per block -------------------------------------------------------------------
    def prepare(self, params: dict, x, padding_mask=None) -> Prepared:
        cfg, dtype = self.config, x.dtype
        qkv = params["ode_func.qkv.weight"].astype(dtype)
        out = params["ode_func.out_proj.weight"].astype(dtype)
        if cfg.use_bitnet:
            qkv, out = quantize_weight(qkv), quantize_weight(out)
        seq_len = x.shape[1]
        return Prepared(
            qkv=qkv,
            out_proj=out,
            norm={k: v.astype(dtype) for k, v in norm_params_of(params, cfg.norm_type).items()},
            mask=self.build_mask(seq_len, padding_mask),
            padding_mask=padding_mask,
            positions=positions_from_padding(padding_mask, seq_len),
        )

    def build_mask(self, seq_len: int, padding_mask=None):
        """bool (batch | 1, 1, seq_q, seq_k): padded keys hidden; decoder adds the causal mask."""
        mask = np.ones((1, 1, seq_len, seq_len), dtype=bool)
        if self.config.mode == "decoder":
            mask = mask & causal_mask(seq_len)
        if padding_mask is not None:
            mask = mask & padding_mask[:, None, None, :]
        return mask

    # ---- every evaluation of f --------------------------------------------------------------
    def norm(self, norm_params: dict, z):
        return apply_norm(self.config.norm_type, norm_params, z)

    def _linear(self, x, w):
        return bitlinear(x, w) if self.config.use_bitnet else linear(x, w)

    def project(self, w_qkv, h):
        """h: (batch, seq, d_model) -> q, k, v each (batch, seq, heads, head_dim)."""
        b, t, _ = h.shape
        qkv = self._linear(h, w_qkv).reshape(b, t, 3, self.config.num_heads, self.config.head_dim)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def preprocess_qkv(self, q, k, v, *, t, positions):
        return q, k, v

    def attn(self, q, k, v, mask):
        """q, k, v: (batch, seq, heads, head_dim), mask (batch | 1, 1, seq, seq) -> like q."""
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale)  # (b, h, seq_q, seq_k)
        a = softmax(masked_fill_min(s, mask))
        return (a @ v).transpose(0, 2, 1, 3)  # (batch, seq, heads, head_dim)

    def postprocess_attn(self, y, padding_mask=None):
        if padding_mask is None:
            return y
        return y * padding_mask[:, :, None, None].astype(y.dtype)

    def output_proj(self, w_out, y):
        return self._linear(y, w_out)

    def evaluate(self, prepared: Prepared, t, z):
        """f(t, z): (batch, seq, d_model) -> (batch, seq, d_model)."""
        h = self.norm(prepared.norm, z)
        q, k, v = self.project(prepared.qkv, h)
        q, k, v = self.preprocess_qkv(q, k, v, t=t, positions=prepared.positions)
        y = self.attn(q, k, v, prepared.mask)
        y = self.postprocess_attn(y, prepared.padding_mask)
        return self.output_proj(prepared.out_proj, y.reshape(z.shape))

    __call__ = evaluate

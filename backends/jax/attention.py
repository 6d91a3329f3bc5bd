"""ODEFunc as a staged self-attention in JAX; port of ode_ref/attention.py.

The staged API JAX users know: project (fused qkv -> q, k, v in [batch, seq, heads, head_dim]),
preprocess_qkv(q, k, v, t=, positions=), build_mask(seq_len, padding_mask) with boolean masks
(True = visible), attn(q, k, v, mask), postprocess_attn(y, padding_mask), output_proj(w, y).
Subclass and override a stage to make a variant. Everything is a pure function of its arrays,
so jit, vmap and grad go through; instances are static arguments under jit.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ode_ref.config import ODEConfig
from ode_ref.norms import NORM_PARAMS
from ode_ref.params import NORM_PREFIX, OUT_PROJ, QKV

from .bitlinear import bitlinear, linear, quantize_weight
from .norms import apply_norm


def softmax(s, axis=-1):
    e = jnp.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_mask(seq_len: int):
    return jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))


def positions_from_padding(padding_mask, seq_len: int):
    if padding_mask is None:
        return jnp.arange(seq_len)[None, :]
    return jnp.cumsum(padding_mask, axis=-1) - 1


def masked_fill_min(s, mask):
    return jnp.where(mask, s, jnp.finfo(s.dtype).min)


class Prepared(NamedTuple):
    """What every evaluation of f shares within one block forward (a pytree)."""

    qkv: jax.Array  # (3 d_model, d_model), quantised when use_bitnet
    out_proj: jax.Array  # (d_model, d_model)
    norm: dict  # norm parameters by short name, in the state's dtype
    mask: jax.Array  # bool (batch | 1, 1, seq, seq), True = visible
    padding_mask: Optional[jax.Array]  # bool (batch, seq)
    positions: jax.Array  # int (batch | 1, seq)


class SelfAttention:
    """The staged ODE function. Override a stage to make a variant; keep the signatures."""

    def __init__(self, config):
        self.config = ODEConfig.from_any(config)

    # ---- once per block -------------------------------------------------------------------
    def prepare(self, params: dict, x, padding_mask=None) -> Prepared:
        cfg, dtype = self.config, x.dtype
        qkv, out = params[QKV].astype(dtype), params[OUT_PROJ].astype(dtype)
        if cfg.use_bitnet:
            qkv, out = quantize_weight(qkv), quantize_weight(out)
        seq_len = x.shape[1]
        return Prepared(
            qkv=qkv,
            out_proj=out,
            norm={k: params[NORM_PREFIX + k].astype(dtype) for k in NORM_PARAMS[cfg.norm_type]},
            mask=self.build_mask(seq_len, padding_mask),
            padding_mask=padding_mask,
            positions=positions_from_padding(padding_mask, seq_len),
        )

    def build_mask(self, seq_len: int, padding_mask=None):
        mask = jnp.ones((1, 1, seq_len, seq_len), dtype=bool)
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
        s = (q @ k.transpose(0, 1, 3, 2)) * jnp.asarray(self.config.scale, q.dtype)  # (b, h, seq_q, seq_k)
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

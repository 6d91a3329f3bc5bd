"""ODEFunc as a staged self-attention, f(t, z) for z: (batch, seq, d_model).

    prepare          once per block: cast parameters, quantise BitLinear weights, build the mask
                     and the positions
    hide_padding     padded tokens read as 0 (their bits never reach a real token)
    norm             h = norm(z)                                   (batch, seq, d_model)
    project          q, k, v = split(h @ Wqkv^T)                   (batch, seq, heads, head_dim) each
    preprocess_qkv   identity here; a variant may scale or rotate q, k (gets t and positions)
    attn             softmax((q @ k^T) * scale where mask else -big, over keys) @ v
    postprocess_attn zero the output of padded queries
    merge_heads      (batch, seq, heads, head_dim) -> (batch, seq, d_model)
    output_proj      y @ Wout^T

The order (Stages below) is written once and run by every port; a port writes the stages.
A variant subclasses SelfAttention and overrides one stage (see variants.py); ode_block integrates
any variant. Masks are boolean, True = visible. A masked score is replaced by the dtype's most
negative finite value, not -inf, so a fully masked row (a padded query under the causal mask)
gives a uniform row instead of NaN; postprocess_attn then zeroes it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .bitlinear import bitlinear, linear, quantize_weight
from .config import ODEConfig
from .norms import apply_norm
from .params import OUT_PROJ, QKV, norm_params_of


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
    """What every evaluation of f shares within one block forward (computed once by prepare).
    Shapes are the spec's; each port holds the same fields in its own arrays."""

    qkv: Any  # (3 d_model, d_model), BitLinear-quantised when use_bitnet
    out_proj: Any  # (d_model, d_model), likewise
    norm: dict  # norm parameters by short name, in the state's dtype
    mask: Any  # bool (batch | 1, 1, seq, seq), True = visible
    padding_mask: Any  # bool (batch, seq), True = real token; or None
    positions: Any  # int (batch | 1, seq)


class Stages:
    """The orchestration of f: what a block forward prepares once, and the stage order of every
    evaluation. Written once, here, and mixed into every port's SelfAttention (this spec, PyTorch,
    JAX and the ONNX export), each of which supplies the stages in its own arrays, plus three
    hooks: weights (the parameters in the state's dtype), seq_len and merge_heads."""

    def prepare(self, params, x, padding_mask=None) -> Prepared:
        qkv, out_proj, norm = self.weights(params, x)
        if self.config.use_bitnet:
            qkv, out_proj = self.quantize_weight(qkv), self.quantize_weight(out_proj)
        seq_len = self.seq_len(x)
        return Prepared(qkv, out_proj, norm, self.build_mask(seq_len, padding_mask), padding_mask,
                        self.positions_from_padding(padding_mask, seq_len))

    def evaluate(self, prepared: Prepared, t, z):
        """f(t, z): (batch, seq, d_model) -> (batch, seq, d_model)."""
        h = self.norm(prepared.norm, self.hide_padding(z, prepared.padding_mask))
        q, k, v = self.project(prepared.qkv, h)
        q, k, v = self.preprocess_qkv(q, k, v, t=t, positions=prepared.positions)
        y = self.attn(q, k, v, prepared.mask)
        y = self.postprocess_attn(y, prepared.padding_mask)
        return self.output_proj(prepared.out_proj, self.merge_heads(y))


class SelfAttention(Stages):
    """The staged ODE function. Override a stage to make a variant; keep the signatures."""

    def __init__(self, config):
        self.config = ODEConfig.from_any(config)

    # ---- once per block (Stages.prepare) --------------------------------------------------
    def weights(self, params: dict, x):
        """(W_qkv, W_out, norm parameters by short name), cast to x's dtype."""
        dtype = x.dtype
        norm = {k: v.astype(dtype) for k, v in norm_params_of(params, self.config.norm_type).items()}
        return params[QKV].astype(dtype), params[OUT_PROJ].astype(dtype), norm

    quantize_weight = staticmethod(quantize_weight)
    positions_from_padding = staticmethod(positions_from_padding)

    def seq_len(self, x) -> int:
        return x.shape[1]

    def build_mask(self, seq_len: int, padding_mask=None):
        """bool (batch | 1, 1, seq_q, seq_k): padded keys hidden; decoder adds the causal mask."""
        mask = np.ones((1, 1, seq_len, seq_len), dtype=bool)
        if self.config.mode == "decoder":
            mask = mask & causal_mask(seq_len)
        if padding_mask is not None:
            mask = mask & padding_mask[:, None, None, :]
        return mask

    # ---- every evaluation of f (Stages.evaluate) --------------------------------------------
    def hide_padding(self, z, padding_mask=None):
        """Padded tokens read as 0: whatever bits they hold (NaN, Inf) never reach a real token.
        For finite inputs nothing changes: padded keys are never attended, padded queries zeroed."""
        if padding_mask is None:
            return z
        return np.where(padding_mask[:, :, None], z, z.dtype.type(0))

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

    def merge_heads(self, y):
        """(batch, seq, heads, head_dim) -> (batch, seq, d_model)."""
        return y.reshape(*y.shape[:2], self.config.hidden_size)

    def output_proj(self, w_out, y):
        return self._linear(y, w_out)

    __call__ = Stages.evaluate

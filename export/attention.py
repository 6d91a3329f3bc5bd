"""ODEFunc as ONNX nodes; port of ode_ref/attention.py with the same stages.

prepare and build_mask add nodes to the main graph once; the other stages add nodes to the body
of the local function `ode_func`, which every stage of every step calls. Default stages only:
a variant's Python override has no ONNX form, so exporting one raises NotImplementedError.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ode_ref.config import ODEConfig
from ode_ref.norms import NORM_PARAMS

from .bitlinear import bitlinear, linear, quantize_activation, quantize_weight
from .graph import Value
from .norms import apply_norm

FLOAT_MIN = float(np.finfo(np.float32).min)


def causal_mask(g, x: Value) -> Value:
    """(seq, seq) bool, True where key j <= query i, for the runtime seq of x."""
    seq = g.op("Squeeze", g.op("Shape", x, start=1, end=2), g.ints(0))
    i = g.op("Range", g.const(0, np.int64), seq, g.const(1, np.int64))
    return g.op("LessOrEqual", g.op("Unsqueeze", i, g.ints(0)), g.op("Unsqueeze", i, g.ints(1)))


def masked_fill_min(g, s: Value, mask: Value) -> Value:
    return g.op("Where", mask, s, g.const(FLOAT_MIN))


def softmax(g, s: Value) -> Value:
    return g.op("Softmax", s, axis=-1)  # ONNX Softmax subtracts the max: stable


class Prepared(NamedTuple):
    """Values shared by every evaluation (main-graph names, passed to ode_func by name)."""

    qkv: tuple  # (W_q^T, W_k^T, W_v^T), each (d_model, d_model): W_qkv's row blocks, quantised when use_bitnet
    out_proj: Value  # (d_model, d_model): W_out^T
    norm: dict  # short name -> Value
    mask: Optional[Value]  # opset 17: bool (batch|1, 1, seq, seq); opset 23: additive float; None = all
    keep: Optional[Value]  # float (batch, seq, 1): 1 real token, 0 padding; None = no padding


class SelfAttention:
    def __init__(self, config, opset: int):
        self.config, self.opset = ODEConfig.from_any(config), opset

    # ---- once per block, main graph -------------------------------------------------------------
    def prepare(self, g, weights: dict, x: Value, padding_mask: Optional[Value]) -> Prepared:
        """weights: qkv (three blocks), out_proj (transposed; with use_bitnet ternary, plus *_scale)
        and norm params."""
        qkv, out = weights["qkv"], weights["out_proj"]
        if self.config.use_bitnet:  # one scale for the whole of W_qkv, as the spec quantises it
            qkv = tuple(quantize_weight(g, w, weights["qkv_scale"]) for w in qkv)
            out = quantize_weight(g, out, weights["out_proj_scale"])
        mask = self.build_mask(g, x, padding_mask)
        if mask is not None and self.opset >= 23:
            # ONNX Runtime's Attention-23 wants the mask's query axis in full: (b|1, 1, seq, seq)
            seq = g.op("Shape", x, start=1, end=2)
            mask = g.op("Expand", mask, g.op("Concat", g.ints(1, 1), seq, seq, axis=0))
            mask = g.op("Where", mask, g.const(0.0), g.const(FLOAT_MIN))  # Attention-23 adds a float mask
        keep = None if padding_mask is None else g.op("Cast", g.op("Unsqueeze", padding_mask, g.ints(2)), to=1)
        norm = {k: weights["norm." + k] for k in NORM_PARAMS[self.config.norm_type]}
        return Prepared(qkv, out, norm, mask, keep)

    def build_mask(self, g, x: Value, padding_mask: Optional[Value]) -> Optional[Value]:
        mask = None
        if self.config.mode == "decoder":
            mask = g.op("Unsqueeze", causal_mask(g, x), g.ints(0, 1))  # (1, 1, seq, seq)
        if padding_mask is not None:
            keys = g.op("Unsqueeze", padding_mask, g.ints(1, 2))  # (batch, 1, 1, seq)
            mask = keys if mask is None else g.op("And", mask, keys)
        return mask

    # ---- every evaluation, inside ode_func ---------------------------------------------------
    def norm(self, norm_params: dict, z: Value) -> Value:
        return apply_norm(self.config.norm_type, norm_params, z, width=self.config.hidden_size)

    def _linear(self, x: Value, w_t: Value) -> Value:
        return bitlinear(x, w_t, width=self.config.hidden_size) if self.config.use_bitnet else linear(x, w_t)

    def project(self, w_qkv_t: tuple, h: Value):
        """h (batch, seq, d_model) -> q, k, v: (batch, seq, heads, head_dim) at opset 17; at 23,
        (batch, seq, d_model), the 3D form that Attention-23 splits into heads itself. The three
        row blocks of W_qkv give the three products directly (the spec's reshape-and-split), and
        BitLinear quantises h once for all three."""
        g, cfg = h.body, self.config
        x = quantize_activation(h, width=cfg.hidden_size) if cfg.use_bitnet else h
        out = tuple(linear(x, w) for w in w_qkv_t)
        if self.opset >= 23:
            return out
        return tuple(g.op("Reshape", a, g.ints(0, 0, cfg.num_heads, cfg.head_dim)) for a in out)

    def preprocess_qkv(self, q, k, v, *, t, positions):
        return q, k, v

    def attn(self, q: Value, k: Value, v: Value, mask: Optional[Value]) -> Value:
        """-> y merged to (batch, seq, d_model): the merge is done here, before postprocess_attn
        (a per-token factor, so the order changes no value)."""
        g, cfg = q.body, self.config
        if self.opset >= 23:
            return g.op("Attention", q, k, v, mask, scale=cfg.scale, q_num_heads=cfg.num_heads, kv_num_heads=cfg.num_heads)
        q_, v_ = g.op("Transpose", q, perm=[0, 2, 1, 3]), g.op("Transpose", v, perm=[0, 2, 1, 3])  # (b, h, seq, hd)
        s = g.op("MatMul", q_, g.op("Transpose", k, perm=[0, 2, 3, 1])) * cfg.scale  # (b, h, sq, sk)
        y = g.op("MatMul", softmax(g, s if mask is None else masked_fill_min(g, s, mask)), v_)
        y = g.op("Transpose", y, perm=[0, 2, 1, 3])  # (batch, seq, heads, head_dim)
        return g.op("Reshape", y, g.ints(0, 0, cfg.hidden_size))

    def postprocess_attn(self, y: Value, keep: Optional[Value]) -> Value:
        """keep: float (batch, seq, 1), 0 for padded queries."""
        return y if keep is None else y * keep

    def output_proj(self, w_out_t: Value, y: Value) -> Value:
        return self._linear(y, w_out_t)

    def evaluate(self, prepared: Prepared, t, z: Value) -> Value:
        g = z.body
        h = self.norm(prepared.norm, z)
        q, k, v = self.project(prepared.qkv, h)
        q, k, v = self.preprocess_qkv(q, k, v, t=t, positions=None)
        y = self.attn(q, k, v, prepared.mask)
        y = self.postprocess_attn(y, prepared.keep)
        return self.output_proj(prepared.out_proj, y)

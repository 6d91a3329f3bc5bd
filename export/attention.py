"""ODEFunc as ONNX nodes; port of ode_ref/attention.py with the same stages.

prepare (ode_ref's Stages.prepare) adds nodes to the main graph once; the other stages add nodes to
the body of the local function `ode_func`, which every stage of every step calls. A variant of
the spec's SelfAttention (ode_ref/variants.py) exports at opset 17: block.export_attention rebuilds
it over these stages, and its overrides run on Values (graph.py says which operations they have).
The decode-step model (block.export_decode_model) runs Stages.decode on main-graph Values: the
cache's slot index is an input, and a slot is written with Where(slot == index, new, past).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto

from ode_ref import positions as spec_positions
from ode_ref.attention import Stages
from ode_ref.config import ODEConfig
from ode_ref.norms import NORM_PARAMS

from .bitlinear import (bitlinear, integer_bitlinear, integer_levels, integer_product, linear, quantize_activation,
                        quantize_weight)
from .graph import XP, Value
from .norms import apply_norm
from .positions import apply_hope, apply_rope, bam_bias, content_bias, hope_tables, rope_cos_sin
from .positions import ssmax_bias, ssmax_factor, ssmax_lengths, ssmax_queries

FLOAT_MIN = float(np.finfo(np.float32).min)


def slot_indices(seq_len: Value, cache_index: Optional[Value] = None):
    """(query indices (seq_q, 1), key indices (seq,)), int64; decoding: the one query at cache_index."""
    g = seq_len.body
    j = g.op("Range", g.const(0, np.int64), g.op("Squeeze", seq_len, g.ints(0)), g.const(1, np.int64))
    i = g.op("Unsqueeze", j, g.ints(1)) if cache_index is None else g.op("Reshape", cache_index, g.ints(1, 1))
    return i, j


def positions_from_padding(padding_mask: Optional[Value], seq_len: Value) -> Value:
    """int64 (batch | 1, seq): cumsum(mask) - 1, or 0 .. seq-1 without a mask."""
    if padding_mask is None:
        _, j = slot_indices(seq_len)
        return j.body.op("Unsqueeze", j, j.body.ints(0))
    g = padding_mask.body  # counted in int32 (exact below 2**31 tokens): tract has no int64 CumSum
    counts = g.op("CumSum", g.op("Cast", padding_mask, to=TensorProto.INT32), g.const(1, np.int64))
    return g.op("Cast", counts, to=TensorProto.INT64) - g.const(1, np.int64)


def causal_mask(seq_len: Value) -> Value:
    """bool (seq, seq): key j visible to query i where j <= i (ode_ref.attention.causal_mask). The
    comparison of two Ranges passes through Trilu, which keeps its values: tract 0.23 broadcasts
    the bare comparison against the scores with a wrong shape, and IREE cannot bound a square made
    from the sequence length alone (ConstantOfShape), so neither simpler form runs in both."""
    g = seq_len.body
    i, j = slot_indices(seq_len)
    return g.op("Trilu", g.op("LessOrEqual", j, i), upper=0)


def masked_fill_min(g, s: Value, mask: Value) -> Value:
    return g.op("Where", mask, s, g.const(FLOAT_MIN))


def softmax(g, s: Value) -> Value:
    return g.op("Softmax", s, axis=-1)  # ONNX Softmax subtracts the max: stable


class SelfAttention(Stages):
    """The stages as ONNX nodes; the stage order and prepare are ode_ref's Stages. prepare runs on
    main-graph Values (once per block); evaluate on the Values of the local function ode_func.
    Differences, same values: the weights are transposed (in, out) and W_qkv is its three row
    blocks; at opset 23, q, k, v stay (batch, seq, d_model) and Attention-23 splits and merges
    the heads, and the mask is additive (0 or the most negative float). bitlinear="integer"
    (export.bitlinear): with use_bitnet, the projections are integer products on the ternary
    weights as stored, nothing dequantised."""

    def __init__(self, config, opset: int, bitlinear: str = "float"):
        self.config, self.opset, self.bitlinear = ODEConfig.from_any(config), opset, bitlinear

    @property
    def integer(self) -> bool:
        return self.config.use_bitnet and self.bitlinear == "integer"

    # ---- once per block (Stages.prepare), main graph --------------------------------------------
    def weights(self, params: dict, x: Value):
        """params: the initializers as Values (export.block): W_qkv^T's three blocks and W_out^T,
        with use_bitnet their ternary values and scales, and the norm parameters. The integer form:
        W_qkv as (q, k, v ternary blocks, c), W_out as (ternary, c), c the product's scale."""
        norm = {k: params["norm." + k] for k in NORM_PARAMS[self.config.norm_type]}
        if self.integer:
            return (*params["qkv"], params["qkv_scale"]), (params["out_proj"], params["out_proj_scale"]), norm
        if self.config.use_bitnet:  # one scale for the whole of W_qkv, as the spec quantises it
            return (params["qkv"], params["qkv_scale"]), (params["out_proj"], params["out_proj_scale"]), norm
        return params["qkv"], params["out_proj"], norm

    def encoder_weights(self, params: dict, x: Value) -> dict:
        """The encoder's initializers by short name (export.block; its Linear weights transposed)."""
        return params["encoder"]

    def gate_weights(self, params: dict, x: Value):
        """(W_g^T (2 d_model, 1), b_g (1,)): initializers."""
        return params["gate"]

    def quantize_weight(self, w):
        """(ternary^T or W_qkv's three ternary blocks, w_s) -> W_q^T (each block); the integer
        form keeps the ternary values as they are stored."""
        if self.integer:
            return w
        ternary, scale = w
        if isinstance(ternary, tuple):
            return tuple(quantize_weight(t, scale) for t in ternary)
        return quantize_weight(ternary, scale)

    positions_from_padding = staticmethod(positions_from_padding)

    # ---- what a variant's stages use besides operators (ode_ref/variants.py) ----------------
    xp = XP
    slot_indices = staticmethod(slot_indices)

    def asarray(self, value, like: Value) -> Value:
        return like.body.const(value, np.float32)

    def seq_len(self, x: Value) -> Value:
        return x.body.op("Shape", x, start=1, end=2)

    def build_mask(self, seq_len: Value, padding_mask: Optional[Value] = None, *,
                   cache_index: Optional[Value] = None) -> Optional[Value]:
        """opset 17: bool (batch|1, 1, seq_q, seq_k), or None when every key is visible; opset 23:
        the same as an additive float mask expanded to (batch|1, 1, seq, seq), as Attention-23 wants
        (the decode-step model is opset 17 only)."""
        g = seq_len.body
        mask = None
        if self.config.mode == "decoder":
            if cache_index is None:
                seen = causal_mask(seq_len)
            else:  # the decode step's one query, at cache_index
                i, j = slot_indices(seq_len, cache_index)
                seen = g.op("LessOrEqual", j, i)
            mask = g.op("Unsqueeze", seen, g.ints(0, 1))  # (1, 1, seq_q, seq_k)
        if padding_mask is not None:
            keys = g.op("Unsqueeze", padding_mask, g.ints(1, 2))  # (batch, 1, 1, seq)
            mask = keys if mask is None else g.op("And", mask, keys)
        if mask is not None and self.opset >= 23:
            mask = g.op("Expand", mask, g.op("Concat", g.ints(1, 1), seq_len, seq_len, axis=0))
            mask = g.op("Where", mask, g.const(0.0), g.const(FLOAT_MIN))
        return mask

    def rope_tables(self, positions: Value, bound, like: Value):
        return rope_cos_sin(positions, self.config)

    def alibi_bias(self, positions_q: Value, positions_k: Value, like: Value) -> Value:
        """The spec's alibi_bias over the graph's XP, in float32 (the graph's dtype)."""
        return spec_positions.alibi_bias(positions_q, positions_k, self.config, np.float32, xp=XP)

    def hope_tables(self, positions: Value, bound, like: Value, layer_idx: int):
        return hope_tables(positions, self.config, layer_idx)

    def bam_bias(self, encoder: dict, positions_q: Value, positions_k: Value, like: Value) -> Value:
        return bam_bias(encoder, positions_q, positions_k, self.config)

    def ssmax_factor(self, encoder: dict, positions_q: Value, positions_k: Value, seq_len: Value, like: Value) -> Value:
        return ssmax_factor(encoder["ssmax.s"], ssmax_lengths(positions_q, positions_k, self.config, seq_len))

    # ---- the cache's slots (Stages.prefill and Stages.decode, in their models); axis 1 is the slot --
    def all_real(self, x: Value) -> Value:
        """bool (batch, seq) all True."""
        g = x.body
        return g.op("ConstantOfShape", g.op("Shape", x, start=0, end=2), value=onnx.numpy_helper.from_array(np.array([True])))

    def pad_slots(self, a: Value, max_len: Value) -> Value:
        """a (batch, seq, ...) of any rank zero-padded (False for bool) at the end of axis 1 to
        max_len slots (an int64 (1,) Value): pads [0, .., 0 | 0, max_len - seq, 0, ..]."""
        g = a.body
        rank = g.op("Shape", g.op("Shape", a))  # (1,)
        zeros = g.op("ConstantOfShape", rank, value=onnx.numpy_helper.from_array(np.array([0], np.int64)))
        axis = g.op("Range", g.const(0, np.int64), g.op("Squeeze", rank, g.ints(0)), g.const(1, np.int64))
        extra = g.op("Sub", max_len, g.op("Shape", a, start=1, end=2))
        ends = g.op("Where", g.op("Equal", axis, g.const(1, np.int64)), extra, zeros)
        return g.op("Pad", a, g.op("Concat", zeros, ends, axis=0))

    def _slot(self, index: Value, like: Value, rank: int) -> Value:
        """bool (1, max_len, 1, ...) of the given rank: True at slot index."""
        g = index.body
        _, j = slot_indices(self.seq_len(like))
        return g.op("Reshape", g.op("Equal", j, index), g.ints(1, -1, *[1] * (rank - 2)))

    def write_slot(self, buffer: Value, new: Value, index: Value) -> Value:
        """buffer (batch, max_len, heads, head_dim) with new (batch, 1, heads, head_dim) at slot index."""
        return buffer.body.op("Where", self._slot(index, buffer, 4), new, buffer)

    def read_slot(self, a: Value, index: Value) -> Value:
        """a (batch, max_len) -> (batch, 1), the slot index."""
        return a.body.op("Gather", a, a.body.op("Reshape", index, a.body.ints(1)), axis=1)

    def mark_slot(self, padding_mask: Value, index: Value) -> Value:
        return padding_mask.body.op("Or", padding_mask, self._slot(index, padding_mask, 2))

    # ---- every evaluation (Stages.evaluate), inside ode_func -----------------------------------------
    def hide_padding(self, z: Value, padding_mask: Optional[Value] = None) -> Value:
        if padding_mask is None:
            return z
        g = z.body
        return g.op("Where", g.op("Unsqueeze", padding_mask, g.ints(2)), z, g.const(0.0))

    def norm(self, norm_params: dict, z: Value) -> Value:
        return apply_norm(self.config.norm_type, norm_params, z, width=self.config.hidden_size)

    def _linear(self, x: Value, w_t) -> Value:
        if self.integer:
            ternary_t, c = w_t
            return integer_bitlinear(x, ternary_t, c, width=self.config.hidden_size)
        return bitlinear(x, w_t, width=self.config.hidden_size) if self.config.use_bitnet else linear(x, w_t)

    def project(self, w_qkv: tuple, h: Value):
        """h (batch, seq, d_model) -> q, k, v: (batch, seq, heads, head_dim) at opset 17; at 23,
        (batch, seq, d_model), the 3D form that Attention-23 splits into heads itself. The three
        row blocks of W_qkv give the three products directly (the spec's reshape-and-split), and
        BitLinear quantises h once for all three (the integer form: its levels and m; W_qkv's c is
        one for the three blocks)."""
        g, cfg = h.body, self.config
        if self.integer:
            *blocks, c = w_qkv
            levels, m = integer_levels(h, width=cfg.hidden_size)
            out = tuple(integer_product(levels, w, m, c) for w in blocks)
        else:
            x = quantize_activation(h, width=cfg.hidden_size) if cfg.use_bitnet else h
            out = tuple(linear(x, w) for w in w_qkv)  # the three blocks of W_qkv^T
        if self.opset >= 23:
            return out
        return tuple(g.op("Reshape", a, g.ints(0, 0, cfg.num_heads, cfg.head_dim)) for a in out)

    def _per_head(self, fn, *xs):
        """fn on each x viewed (batch, seq, heads, head_dim): at opset 23 x is 3D, reshaped for it."""
        if self.opset < 23:
            return tuple(fn(x) for x in xs)
        g, cfg = xs[0].body, self.config
        split = (g.op("Reshape", x, g.ints(0, 0, cfg.num_heads, cfg.head_dim)) for x in xs)
        return tuple(g.op("Reshape", fn(x), g.ints(0, 0, cfg.hidden_size)) for x in split)

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        """The rotation or hope's map on q and k (at opset 23 they are 3D: viewed per head for it). A
        head of width 1 has no pair to map: left as it is, with no empty array (tract holds none)."""
        if rope is None or self.config.head_dim < 2:
            return q, k, v
        apply = apply_hope if self.config.position_encoding == "hope" else apply_rope
        q, k = self._per_head(lambda a: apply(a, *rope), q, k)
        return q, k, v

    def content_bias(self, encoder: dict, z: Value, positions_q: Value, positions_k: Value) -> Value:
        return content_bias(z, encoder, positions_q, positions_k, self.config)

    ssmax_bias = staticmethod(ssmax_bias)

    def ssmax_queries(self, q: Value, factor: Value) -> Value:
        """q times SSMax's factor (at opset 23 q is 3D: viewed per head for it)."""
        return self._per_head(lambda a: ssmax_queries(a, factor), q)[0]

    def hide_nonfinite(self, k: Value, v: Value, mask: Optional[Value]):
        """The spec's stage: each NaN or Inf in k and v replaced by 0 (Where), and poison, bool:
        (batch, seq_q | 1, heads, 1) at opset 17, the visible keys' count of bad rows (a MatMul with
        the mask) > 0. At opset 23, where q, k, v and y are (batch, seq, d_model), per query
        (batch, seq_q | 1, 1), over every head: the out projection mixes y's heads, so one NaN head
        or all give the token the same NaN row, and no Reshape is needed. No Cast: the 0/1 counts
        come from Where."""
        g = k.body
        nonfinite_k, nonfinite_v = (g.op("Or", g.op("IsNaN", a), g.op("IsInf", a)) for a in (k, v))
        zero, one = g.const(0.0), g.const(1.0)
        either = g.op("Where", g.op("Or", nonfinite_k, nonfinite_v), one, zero)
        bad = g.reduce("ReduceMax", either, -1)  # (b, seq_k, h, 1) at 17, (b, seq_k, 1) at 23
        k, v = g.op("Where", nonfinite_k, zero, k), g.op("Where", nonfinite_v, zero, v)
        if mask is None:
            return k, v, g.op("Greater", g.reduce("ReduceMax", bad, 1), zero)
        if self.opset >= 23:  # the additive mask (ALiBi's bias merged): hidden keys hold FLOAT_MIN
            visible = g.op("Where", g.op("Greater", mask, g.const(FLOAT_MIN)), one, zero)  # (b | 1, 1 | h, seq_q, seq_k)
            visible = g.reduce("ReduceMax", visible, 1)  # (b | 1, 1, seq_q, seq_k): the same in every head
            counts = g.op("MatMul", visible, g.op("Unsqueeze", bad, g.ints(1)))  # (b, 1, seq_q, 1)
            return k, v, g.op("Greater", g.op("Squeeze", counts, g.ints(1)), zero)
        visible = g.op("Where", mask, one, zero)  # (b | 1, 1, seq_q, seq_k)
        counts = g.op("MatMul", visible, g.op("Transpose", bad, perm=[0, 2, 1, 3]))  # (b, h, seq_q, 1)
        return k, v, g.op("Transpose", g.op("Greater", counts, zero), perm=[0, 2, 1, 3])

    def poison_queries(self, q: Value, poison: Value) -> Value:
        g = q.body
        return g.op("Where", poison, g.const(float("nan")), q)

    def merge_bias(self, mask: Optional[Value], bias: Optional[Value]):
        """At opset 23, Attention takes one additive mask: the bias added to it, once, in the main
        graph (prepare); at 17 they stay apart."""
        if self.opset < 23 or bias is None:
            return mask, bias
        return (bias if mask is None else mask + bias), None

    def attn(self, q: Value, k: Value, v: Value, mask: Optional[Value], bias: Optional[Value] = None) -> Value:
        """-> (batch, seq, heads, head_dim) at opset 17; (batch, seq, d_model) at 23. The ALiBi
        bias is added to the scores before the mask fill (at 23, to the additive mask).

        Opset 23 uses Attention on 3D q, k, v: of the candidate forms (Attention on 3D or 4D q, k,
        v, and opset 17's Transpose/MatMul/Softmax/MatMul) it ran fastest in ONNX Runtime on the
        CPU, 1.35x opset 17's form at B8 T512 D512 H8 (benchmarks/opset_forms.py). The norms have
        no form to choose: the same elementary nodes at every opset (export/norms.py)."""
        g, cfg = q.body, self.config
        if self.opset >= 23:
            mask, _ = self.merge_bias(mask, bias)
            return g.op("Attention", q, k, v, mask, scale=cfg.scale, q_num_heads=cfg.num_heads, kv_num_heads=cfg.num_heads)
        q_, v_ = g.op("Transpose", q, perm=[0, 2, 1, 3]), g.op("Transpose", v, perm=[0, 2, 1, 3])  # (b, h, seq, hd)
        s = g.op("MatMul", q_, g.op("Transpose", k, perm=[0, 2, 3, 1])) * cfg.scale  # (b, h, sq, sk)
        if bias is not None:
            s = s + bias
        y = g.op("MatMul", softmax(g, s if mask is None else masked_fill_min(g, s, mask)), v_)
        return g.op("Transpose", y, perm=[0, 2, 1, 3])  # (batch, seq, heads, head_dim)

    def postprocess_attn(self, y: Value, padding_mask: Optional[Value] = None) -> Value:
        if padding_mask is None:
            return y
        g = y.body
        axes = g.ints(2) if self.opset >= 23 else g.ints(2, 3)  # y is 3D at opset 23
        return g.op("Where", g.op("Unsqueeze", padding_mask, axes), y, g.const(0.0))  # y * mask, without a Cast

    def merge_heads(self, y: Value) -> Value:
        """(batch, seq, heads, head_dim) -> (batch, seq, d_model); Attention-23 merged them already."""
        return y if self.opset >= 23 else y.body.op("Reshape", y, y.body.ints(0, 0, self.config.hidden_size))

    def output_proj(self, w_out: Value, y: Value) -> Value:
        """w_out: W_out^T, (d_model, d_model); the integer form: (ternary^T, c)."""
        return self._linear(y, w_out)

    # ---- the gated solver, once per step (Stages.solution_gate), inside ode_step -------------------
    def gate(self, gate_params, f1: Value, f2: Value) -> Value:
        """g = sigmoid([F1; F2] @ W_g^T + b_g) -> (batch, seq, 1)."""
        w_t, b = gate_params
        g = f1.body
        return g.op("Sigmoid", g.op("MatMul", g.op("Concat", f1, f2, axis=-1), w_t) + b)

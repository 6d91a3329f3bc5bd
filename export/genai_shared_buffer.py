"""GenAI's shared-buffer form of the language model (past_present_share_buffer true): each cache
layer is one buffer of max_length slots, allocated once by GenAI and written in place, ONNX's
static-cache form at opset 24.

    past_key_values.<l>.key / .value, present.<l>.key / .value   [batch, heads, max_length, head_dim]

Each evaluation of f writes its new K and V at slot total_seq - seq with TensorScatter (axis 2)
and attends over the whole buffer, the unwritten and padded slots hidden. Block 'attention' does so
with Attention (opset 24, heads-first q, k, v) and its additive mask (0 where visible, plus ALiBi's
bias, else the most negative float): the spec's scores, masked as the spec masks them. Block
'layer' keeps the spec's own attention (ode_ref/encoder_layer.py, export.genai.LayerStages) over
the buffer, its visibility (key_mask, with the layer's own slot) over max_length slots. ONNX
Runtime 1.32 runs both operators on its CPU provider.

What differs from the concat form (export.genai), for block 'attention': q, k, v meet in
Attention's heads-first layout, and the spec's rule for non-finite keys (hide_nonfinite,
poison_queries) is left out: it would read and copy every slot of the buffer at every evaluation,
the copy this form exists to avoid. With finite weights (`odeattn export` checks them) and token
ids, K and V are finite.
"""

from __future__ import annotations

from onnx import helper

from .attention import FLOAT_MIN, SelfAttention
from .graph import Body, Value

OPSET = 24


class SharedSelfAttention(SelfAttention):
    """The export's stages (opset 17's shapes) with the attention as one Attention-24 node over
    the in-place buffers, which the kv hook (SharedCache) hands over heads-first."""

    def merge_bias(self, mask, bias):
        """One additive mask for Attention, built once per block: 0 (or ALiBi's bias) where visible,
        the most negative float elsewhere."""
        g = mask.body
        return g.op("Where", mask, g.const(0.0) if bias is None else bias, g.const(FLOAT_MIN)), None

    def hide_nonfinite(self, k, v, mask):
        return k, v, None

    def poison_queries(self, q, poison):
        return q

    def attn(self, q, k, v, mask, bias=None):
        """q (batch, seq, heads, head_dim); k, v the buffers (batch, heads, max_length, head_dim);
        mask the additive mask (batch, 1 | heads, seq, max_length) -> (batch, seq, heads, head_dim)."""
        g = q.body
        heads_first = g.op("Transpose", q, perm=[0, 2, 1, 3])
        y = g.op("Attention", heads_first, k, v, mask, scale=self.config.scale)
        return g.op("Transpose", y, perm=[0, 2, 1, 3])


class SharedCache:
    """The kv hook: this call's k, v written into evaluation e's buffer at slot `start`
    (TensorScatter), which becomes present.<layer>; the buffers go to attn heads-first."""

    def __init__(self, main: Body, first_layer: int, write_indices: Value, past: str, present: str):
        self.main, self.layer, self.write_indices = main, first_layer, write_indices
        self.past, self.present = past, present

    def store(self, new_t: Value, name: str) -> Value:
        """present.<layer>.<name>: the buffer with new_t (batch, heads, seq, head_dim) written at its slots."""
        g, present = self.main, self.present % self.layer + name
        # the output is the graph's present output itself: bound to the past buffer (as GenAI binds
        # it), TensorScatter then writes in place; through an Identity it would write a copy
        g.nodes.append(helper.make_node("TensorScatter", [self.past % self.layer + name, new_t.name, self.write_indices.name],
                                        [present], name=present, axis=2))
        return Value(g, present)

    def __call__(self, k, v):
        g = self.main
        k, v = (self.store(g.op("Transpose", a, perm=[0, 2, 1, 3]), name) for a, name in ((k, "key"), (v, "value")))
        self.layer += 1
        return k, v


def key_mask(main: Body, mask: Value, total: Value, first_past: str) -> tuple[Value, Value]:
    """(attention_mask (int64 [batch, total_seq]) padded with 0 to the buffers' max_length, that length (1,))."""
    g = main
    max_len = g.op("Shape", Value(g, first_past), start=2, end=3)
    return g.op("Pad", mask, g.op("Concat", g.ints(0, 0, 0), max_len - total, axis=0)), max_len


def write_indices(main: Body, mask: Value, seq: Value, total: Value) -> Value:
    """TensorScatter's write_indices (batch,): every row writes this call's tokens from slot total - seq."""
    return main.op("Expand", total - seq, main.op("Shape", mask, start=0, end=1))

"""The block's ONNX file run by tract (the `tract` package: Sonos's inference engine in Rust).

    unsupported_form(model) -> str | None

What tract 0.23 runs (docs/deployment.md): the default form at opset 17 or 23 (its Attention), in
float32 or float16, the diagnostic outputs and the encoder stack's model, batch and sequence
dynamic; not the Loop form nor ONNX local functions (`--functions`), which it does not implement,
nor a bfloat16 file, nor the prefill model of cached decoding, whose cache has max_len slots, an
input's value, where tract sizes every array from the inputs' shapes. Three forms in the export are
tract's (export/attention.py): the positions counted in int32 (tract has no int64 CumSum), the
causal mask passed through a Trilu (tract broadcasts the bare comparison wrongly) and no rotation
of a head of width 1 (tract holds no empty array). The runtime side, tract's load and run and its
errors in one line, is export/standalone.py's, which needs neither odeattn nor onnx where it runs.
"""

from __future__ import annotations


def unsupported_form(model) -> str | None:
    """Why tract does not run this form of the block's file, or None where it does."""
    from onnx import TensorProto

    if model.functions:
        return "a file with ONNX local functions (--functions), which tract does not implement; expected the default form"
    if any(n.op_type == "Loop" for n in model.graph.node):
        return "the Loop form (--steps-input), which tract does not implement; expected the default form"
    if any(t.data_type == TensorProto.BFLOAT16 for t in model.graph.initializer):
        return "a bfloat16 file (--dtype bfloat16), a type tract does not have; expected a float32 or float16 file"
    return None

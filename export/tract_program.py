"""The block's ONNX file run by tract (the `tract` package: Sonos's inference engine in Rust).

    unsupported_form(model) -> str | None
    tract_runner(model) -> run(feed) -> {output name: array}
    run_tract_block(path, x, padding_mask=None) -> z(1)

What tract 0.23 runs (docs/deployment.md): the default form at opset 17 or 23 (its Attention), in
float32 or float16, the diagnostic outputs and the encoder stack's model, batch and sequence
dynamic; not the Loop form nor ONNX local functions (`--functions`), which it does not implement,
nor a bfloat16 file, nor the prefill model of cached decoding, whose cache has max_len slots, an
input's value, where tract sizes every array from the inputs' shapes. Three forms in the export are
tract's (export/attention.py): the positions counted in int32 (tract has no int64 CumSum), the
causal mask passed through a Trilu (tract broadcasts the bare comparison wrongly) and no rotation
of a head of width 1 (tract holds no empty array). run_tract_block needs neither odeattn nor onnx
where it runs.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


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


class TractError(RuntimeError):
    """tract's error in one line: its message and causes, without the Rust backtrace that
    RUST_BACKTRACE=1 appends."""

    def __init__(self, error):
        text = str(error).split("\n\nStack backtrace:")[0]
        super().__init__("; ".join(line.strip() for line in text.splitlines() if line.strip() not in ("", "Caused by:")))


def _runnable(path):
    import tract

    try:
        return tract.onnx().load(str(path)).into_model().into_runnable()
    except tract.TractError as err:
        raise TractError(err) from None


def tract_runner(model):
    """feed -> {output name: array}: model (an onnx.ModelProto) loaded by tract once (from a
    temporary file: tract loads a path), run with feed's arrays in the order of its inputs."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        runnable = _runnable(path)
    inputs, outputs = [i.name for i in model.graph.input], [o.name for o in model.graph.output]

    def run(feed):
        import tract

        try:
            out = runnable.run([np.asarray(feed[name], order="C") for name in inputs])
        except tract.TractError as err:
            raise TractError(err) from None
        if len(out) != len(outputs):
            raise RuntimeError(f"tract returned {len(out)} outputs of the model's {len(outputs)} ({', '.join(outputs)})")
        return {name: a.to_numpy() for name, a in zip(outputs, out)}

    return run


def run_tract_block(path, x, padding_mask=None) -> np.ndarray:
    """z(1) of the block's ONNX file at path on x (and padding_mask, where the file takes one):
    a one-shot; a server keeps the runnable, as tract_runner does."""
    args = [np.asarray(x, order="C")] + ([] if padding_mask is None else [np.asarray(padding_mask, bool, order="C")])
    return _runnable(path).run(args)[0].to_numpy()  # z: the model's first output

"""The second export route: the PyTorch backend's module through torch.onnx.export.

The direct route (block.export_model) needs no torch and keeps the structure readable; this one
exists so that a user holding a trained torch module can export it as is, and a test checks that
the two files compute the same outputs.
"""

from __future__ import annotations

import os

TORCH_OPSETS = (18, 23)  # torch.onnx.export's opsets this route writes; the first is its default


def export_torch(block, path, *, opset: int = TORCH_OPSETS[0], seq: int = 8) -> None:
    """Write `block` (backends.torch.ODEAttentionBlock, float32) to path with dynamic batch and seq."""
    import torch

    block = block.eval()
    d = block.config.hidden_size
    x = torch.zeros(2, seq, d)
    mask = torch.ones(2, seq, dtype=torch.bool)
    batch_dim, seq_dim = torch.export.Dim("batch"), torch.export.Dim("seq")
    program = torch.onnx.export(
        block, (x,), kwargs={"padding_mask": mask}, dynamo=True, opset_version=opset,
        input_names=["x", "padding_mask"], output_names=["z"],
        dynamic_shapes={"x": {0: batch_dim, 1: seq_dim}, "padding_mask": {0: batch_dim, 1: seq_dim}}, verbose=False,
    )
    program.save(os.fspath(path))

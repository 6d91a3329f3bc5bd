"""Export of the ODE attention block: the unrolled ONNX graph and inference with ONNX Runtime, and
jax.export's program (jax_program.py). Here: the batch every export's check against the spec runs."""

import numpy as np


def check_batch(d_model: int, seq: int = 8, *, padded: bool = True):
    """(x, padding_mask) of an export's check against the spec: x normal [2, seq, d_model], seed 0,
    float64; the second row's tokens after the fifth padded (none when seq <= 5), or no mask."""
    x = np.random.default_rng(0).normal(size=(2, seq, d_model))
    return x, (np.arange(seq)[None, :] < np.array([[seq], [min(5, seq)]])) if padded else None

"""Export of the ODE attention block: the unrolled ONNX graph and inference with ONNX Runtime, and
the other targets' artifacts (jax_program.py, iree_program.py, aoti_program.py,
executorch_program.py, litert_program.py). Here: the batch every export's check against the spec runs, the
checks of an artifact's inputs that its runtime does not make, and the refusal of a shape it does not hold."""

import numpy as np


class PastBounds(ValueError):
    """A shape an artifact was not built to hold: past an ExecuTorch program's planned batch and
    sequence, or past the positions a jax.export program was exported with. Whoever judges drawn
    inputs (fuzz --model) counts it as not supported, not as a failure."""


def check_batch(d_model: int, seq: int = 8, *, padded: bool = True, batch: int = 2):
    """(x, padding_mask) of an export's check against the spec: x normal [batch, seq, d_model], seed
    0, float64; every second row's tokens after the fifth padded (none when seq <= 5; a batch of one
    is that padded row), or no mask."""
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    lengths = np.resize([seq, min(5, seq)] if batch > 1 else [min(5, seq)], batch)
    return x, (np.arange(seq)[None, :] < lengths[:, None]) if padded else None


def artifact_inputs(x, padding_mask, *, d_model: int, dtype, takes_mask: bool, what: str = "program"):
    """(x as a C-ordered array of dtype, the mask to feed or None) for an artifact that takes x
    (batch, seq, d_model) and, where takes_mask, a bool padding mask (None: every token real).
    ValueError naming x or padding_mask where the artifact cannot take them: another shape or
    width (its runtime would read past the buffer), or a mask that pads a token where it takes none
    (it would read padding as tokens)."""
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[2] != d_model:
        raise ValueError(f"x: expected (batch, seq, {d_model}), the {what}'s d_model; got shape {x.shape}")
    mask = np.ones(x.shape[:2], bool) if padding_mask is None else np.asarray(padding_mask)
    if mask.shape != x.shape[:2]:
        raise ValueError(f"padding_mask: expected x's (batch, seq) {x.shape[:2]}; got shape {mask.shape}")
    if not takes_mask and not mask.all():
        raise ValueError(f"padding_mask: the {what} was exported without a padding mask (every token real); "
                         "got a mask that pads tokens")
    return np.ascontiguousarray(x, dtype), np.ascontiguousarray(mask, bool) if takes_mask else None

"""Diagnostics of the spec: how close BitLinear's rounding decisions are to a tie.

BitLinear rounds, so it is discontinuous: where x_n * a_s lies within rounding noise of a
half-integer (or |W * w_s| of 0.5), two correct implementations may round differently. Such near
ties are not rare: BitLinear's outputs lie on a lattice (integer levels times ternary weights), so
a decoder's first token, whose attention output is exactly its own v, often lands on one.
quantisation_margin measures the smallest distance to a tie, in quantisation levels, over every
rounding a forward makes; the conformance cases are chosen with a margin large enough that any
implementation of the stated precision makes the spec's decisions (see conformance/README).
"""

from __future__ import annotations

import numpy as np

from .attention import SelfAttention
from .bitlinear import QUANT_EPS, ACT_MAX, weight_scale
from .block import ode_block, ode_func
from .norms import layer_norm


def tie_distance(levels):
    """Distance of each value to the nearest half-integer (a rounding tie)."""
    return np.abs(np.abs(levels - np.floor(levels)) - 0.5)


class _LevelProbe(SelfAttention):
    """SelfAttention that records the pre-rounding levels x_n * a_s of every activation."""

    def __init__(self, config):
        super().__init__(config)
        self.levels = []

    def _linear(self, x, w):
        x_n = layer_norm(x, 1.0, 0.0)
        self.levels.append(x_n * (ACT_MAX / np.maximum(np.abs(x_n).max(axis=-1, keepdims=True), QUANT_EPS)))
        return super()._linear(x, w)


def quantisation_levels(params, x, config, padding_mask=None, *, whole_block: bool = True) -> list:
    """Every pre-rounding value of a forward, in order: |W * w_s| of both weights, then the
    activation levels x_n * a_s of f(0, x) (whole_block=False) or of the whole block (True).
    Empty without BitLinear."""
    probe = _LevelProbe(config)
    if not probe.config.use_bitnet:
        return []
    weights = [params["ode_func.qkv.weight"], params["ode_func.out_proj.weight"]]
    weights = [np.abs(w.astype(x.dtype) * weight_scale(w.astype(x.dtype))) + 0.0 for w in weights]
    if whole_block:
        ode_block(params, x, config, padding_mask, attention=probe)
    else:
        ode_func(params, 0.0, x, config, padding_mask, attention=probe)
    return weights + probe.levels


def quantisation_margin(params, x, config, padding_mask=None, *, whole_block: bool = True) -> float:
    """The smallest distance to a rounding tie, in levels, over quantisation_levels (inf if none)."""
    levels = quantisation_levels(params, x, config, padding_mask, whole_block=whole_block)
    return min((float(tie_distance(v).min()) for v in levels), default=float("inf"))

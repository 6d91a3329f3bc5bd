"""Fair test inputs: a case's input is redrawn until it tests the implementation, not the input.

BitLinear rounds, so it is discontinuous: where x_n * a_s lies within rounding noise of a
half-integer (or |W * w_s| of 0.5), two correct implementations may round differently. Such near
ties are not rare: BitLinear's outputs lie on a lattice (integer levels times ternary weights), so
a decoder's first token, whose attention output is exactly its own v, often lands on one.
check_fair measures the smallest distance to a tie, in quantisation levels, over every rounding
a forward makes; the conformance cases are chosen with a margin large enough that any
implementation of the stated precision makes the spec's decisions.

make_inputs() draws a case's input and padding mask and redraws (seed + 1, + 2, ...) until the
draw is a fair test:

  - BitLinear decisions are unambiguous: every rounding of the float64 forward is at least
    TIE_NOISE_FACTOR times the float32 forward's own deviation in levels (and at least
    TIE_FLOOR) away from a tie, so any float32 or float64 implementation whose error is of the
    spec's order rounds exactly as the spec does;
  - the block is not ill-conditioned at this input: the spec's own float32 error is at most
    MAX_CONDITION float32 roundings (prms_norm over one near-zero channel can amplify rounding
    10^5-fold; such inputs test the input, not the implementation).
"""

from __future__ import annotations

import numpy as np

import ode_ref as R
from ode_ref.attention import SelfAttention
from ode_ref.bitlinear import ACT_MAX, QUANT_EPS, weight_scale
from ode_ref.block import ode_block
from ode_ref.norms import layer_norm

from .tolerance import UNIT_ROUNDOFF, relative_error

TIE_FLOOR = 1e-6  # levels; float64 level noise is ~1e-13, exact lattice ties give < 1e-13
TIE_NOISE_FACTOR = 3.0  # margin / (float32 level deviation), which is ~1e-6 .. 1e-5
MAX_CONDITION = 1000.0  # spec float32 error / float32 unit roundoff
MAX_REDRAWS = 200


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


def quantisation_levels(params, x, config, padding_mask=None) -> list:
    """Every pre-rounding value of a forward, in order: |W * w_s| of both weights, then the
    activation levels x_n * a_s of every evaluation of the block. Empty without BitLinear."""
    probe = _LevelProbe(config)
    if not probe.config.use_bitnet:
        return []
    weights = [params["ode_func.qkv.weight"], params["ode_func.out_proj.weight"]]
    weights = [np.abs(w.astype(x.dtype) * weight_scale(w.astype(x.dtype))) + 0.0 for w in weights]
    ode_block(params, x, config, padding_mask, attention=probe)
    return weights + probe.levels


def padding_for(batch: int, seq: int, rng) -> np.ndarray:
    """Row 0 right-padded, row 1 left-padded, others random; every row keeps >= 1 real token."""
    mask = np.ones((batch, seq), dtype=bool)
    if seq == 1:
        return mask
    for b in range(batch):
        n_pad = int(rng.integers(1, seq))  # 1 .. seq-1 padded
        if b % 3 == 0:
            mask[b, seq - n_pad:] = False
        elif b % 3 == 1:
            mask[b, :n_pad] = False
        else:
            mask[b] = rng.random(seq) < 0.6
            mask[b, int(rng.integers(seq))] = True
    return mask


def check_fair(config, params, x, mask) -> str | None:
    """Why (x, mask) is not a fair test input, or None if it is (see the module docstring)."""
    x32 = x.astype(np.float32)
    z64, z32 = R.ode_block(params, x, config, mask), R.ode_block(params, x32, config, mask)
    e32 = relative_error(z32, z64)
    if e32 > MAX_CONDITION * UNIT_ROUNDOFF["float32"]:
        return f"ill-conditioned: spec float32 error {e32:.1e}"
    levels64 = quantisation_levels(params, x, config, mask)
    if levels64:
        levels32 = quantisation_levels(params, x32, config, mask)
        for what, lv64, lv32 in (("weight", levels64[:2], levels32[:2]), ("activation", levels64[2:], levels32[2:])):
            noise = max(float(np.abs(a - b).max()) for a, b in zip(lv32, lv64))
            margin = min(float(tie_distance(v).min()) for v in lv64)
            if margin < max(TIE_FLOOR, TIE_NOISE_FACTOR * noise):
                return f"{what} near a rounding tie: margin {margin:.1e} levels, float32 deviation {noise:.1e}"
    return None


def make_inputs(config, params, batch: int, seq: int, *, seed: int, padding: bool, scale: float = 1.0,
                offset: float = 0.0, decoded: int = 0):
    """(x, padding_mask, seed_used): x = scale * (offset + N(0, 1)) float64, the first fair draw from seed.
    decoded > 0: the last `decoded` tokens are real (decoding appends real tokens); the padding
    is drawn over the prompt before them."""
    reasons = []
    for attempt in range(MAX_REDRAWS):
        rng = np.random.default_rng(seed + attempt)
        x = rng.normal(size=(batch, seq, config.hidden_size))
        x = (offset + x) * scale if offset else x * scale  # offset 0: the draw as before it existed, bit for bit
        mask = None
        if padding:
            mask = np.ones((batch, seq), dtype=bool)
            mask[:, :seq - decoded] = padding_for(batch, seq - decoded, rng)
        reason = check_fair(config, params, x, mask)
        if reason is None:
            return x, mask, seed + attempt
        reasons.append(reason)
    raise RuntimeError(f"no fair input in {MAX_REDRAWS} draws from seed {seed} for {config}: {reasons[:3]}")

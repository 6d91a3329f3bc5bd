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


class _Tied(Exception):
    """A float64 activation level within TIE_FLOOR of a tie: the input is unfair whatever the float32
    forward gives (_tie's threshold is at least TIE_FLOOR)."""


class _LevelProbe(SelfAttention):
    """SelfAttention that records, with BitLinear, the pre-rounding levels x_n * a_s of every
    activation (its values are the spec's own). stop_at_tie: raise _Tied at the first array of
    levels that _tie will find under TIE_FLOOR, so an unfair input costs part of one forward."""

    def __init__(self, config, stop_at_tie: bool = False):
        super().__init__(config)
        self.levels = []
        self.stop_at_tie = stop_at_tie

    def _linear(self, x, w):
        if self.config.use_bitnet:
            x_n = layer_norm(x, 1.0, 0.0)
            self.levels.append(x_n * (ACT_MAX / np.maximum(np.abs(x_n).max(axis=-1, keepdims=True), QUANT_EPS)))
            if self.stop_at_tie:
                self._stop_at_tie(float(tie_distance(self.levels[-1]).min()))
        return super()._linear(x, w)

    def _stop_at_tie(self, margin: float) -> None:
        """_tie's margin is min() over the arrays in order: an array holding a NaN (margin NaN) is
        passed over, unless it is the first, whose NaN the margin then stays (no tie is found)."""
        if np.isnan(margin):
            self.stop_at_tie = len(self.levels) > 1
        elif margin < TIE_FLOOR:
            raise _Tied(f"activation near a rounding tie: margin {margin:.1e} levels in float64, under {TIE_FLOOR:g}")


def _weight_levels(params, dtype) -> list:
    """|W * w_s| of both BitLinear weights, in dtype (the input's: the spec casts them to it)."""
    weights = [params["ode_func.qkv.weight"], params["ode_func.out_proj.weight"]]
    return [np.abs(w.astype(dtype) * weight_scale(w.astype(dtype))) + 0.0 for w in weights]


def _forward(params, x, config, padding_mask=None, stop_at_tie: bool = False) -> tuple:
    """(the spec's trajectory (steps + 1, batch, seq, d_model), quantisation_levels) of one forward
    (stop_at_tie: _LevelProbe's)."""
    probe = _LevelProbe(config, stop_at_tie)
    _, trajectory = ode_block(params, x, config, padding_mask, attention=probe, return_trajectory=True)
    if not probe.config.use_bitnet:
        return trajectory, []
    return trajectory, _weight_levels(params, x.dtype) + probe.levels


def _tie(what: str, levels64: list, levels32: list) -> str | None:
    """Why the float64 levels are too near a rounding tie for the float32 ones' deviation, or None."""
    noise = max(float(np.abs(a - b).max()) for a, b in zip(levels32, levels64))
    margin = min(float(tie_distance(v).min()) for v in levels64)
    if margin < max(TIE_FLOOR, TIE_NOISE_FACTOR * noise):
        return f"{what} near a rounding tie: margin {margin:.1e} levels, float32 deviation {noise:.1e}"
    return None


def weight_tie(config, params) -> str | None:
    """check_fair's weight test alone: the parameters' own, the same for every input, so a caller
    that redraws inputs asks it once."""
    if not R.ODEConfig.from_any(config).use_bitnet:
        return None
    return _tie("weight", _weight_levels(params, np.float64), _weight_levels(params, np.float32))


def quantisation_levels(params, x, config, padding_mask=None) -> list:
    """Every pre-rounding value of a forward, in order: |W * w_s| of both weights, then the
    activation levels x_n * a_s of every evaluation of the block. Empty without BitLinear."""
    return _forward(params, x, config, padding_mask)[1] if R.ODEConfig.from_any(config).use_bitnet else []


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
    return fair_forwards(config, params, x, mask)[0]


def fair_forwards(config, params, x, mask) -> tuple:
    """(check_fair's answer, the spec's float64 and float32 trajectories of (x, mask)): one forward
    per precision, recording BitLinear's levels as it runs, whose states a caller may reuse. An
    exact tie in the float64 forward ends the check there, with no trajectories (None, None)."""
    try:
        traj64, levels64 = _forward(params, x, config, mask, stop_at_tie=True)
    except _Tied as tie:
        return str(tie), None, None
    traj32, levels32 = _forward(params, x.astype(np.float32), config, mask)
    e32 = relative_error(traj32[-1], traj64[-1])
    if e32 > MAX_CONDITION * UNIT_ROUNDOFF["float32"]:
        return f"ill-conditioned: spec float32 error {e32:.1e}", traj64, traj32
    for what, lv64, lv32 in (("weight", levels64[:2], levels32[:2]), ("activation", levels64[2:], levels32[2:])) if levels64 else ():
        reason = _tie(what, lv64, lv32)
        if reason is not None:
            return reason, traj64, traj32
    return None, traj64, traj32


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

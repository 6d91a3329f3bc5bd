"""The test matrix shared by the golden cases and the backend tests.

pairwise() covers every pair of factor values in few rows. make_inputs() draws a case's input
and padding mask and redraws (seed + 1, + 2, ...) until the draw is a fair test:

  - BitLinear decisions are unambiguous: every rounding of the float64 forward is at least
    TIE_NOISE_FACTOR times the float32 forward's own deviation in levels (and at least
    TIE_FLOOR) away from a tie, so any float32 or float64 implementation whose error is of the
    spec's order rounds exactly as the spec does (ode_ref.diagnostics explains why ties occur);
  - the block is not ill-conditioned at this input: the spec's own float32 error is at most
    MAX_CONDITION float32 roundings (prms_norm over one near-zero channel can amplify rounding
    10^5-fold; such inputs test the input, not the implementation).
"""

from __future__ import annotations

import itertools

import numpy as np

import ode_ref as R
from ode_ref.diagnostics import quantisation_levels, tie_distance

from .tolerance import UNIT_ROUNDOFF, relative_error

TIE_FLOOR = 1e-6  # levels; float64 level noise is ~1e-13, exact lattice ties give < 1e-13
TIE_NOISE_FACTOR = 3.0  # margin / (float32 level deviation); measured deviation ~1e-6 .. 1e-5
MAX_CONDITION = 1000.0  # spec float32 error / float32 unit roundoff
MAX_REDRAWS = 200

FACTORS = {
    "norm_type": list(R.NORM_TYPES),
    "ode_solver": list(R.SOLVERS),
    "mode": list(R.MODES),
    "use_bitnet": [False, True],
    "padding": [False, True],
    "ode_steps": [1, 2, 3, 4, 5, 6, 7, 8],
    # (batch, seq, heads, d_model): T = 1, H = 1, D not a power of two, B up to 3
    "shape": [(2, 5, 2, 8), (1, 1, 1, 6), (3, 7, 3, 12), (2, 4, 1, 10), (1, 9, 4, 16)],
}


def pairwise(factors: dict) -> list[dict]:
    """Rows (dicts) in which every pair of values of two factors appears at least once.

    Greedy and deterministic: each row starts from the first uncovered pair and fills the other
    factors with the value that covers the most still-uncovered pairs.
    """
    names = list(factors)
    uncovered = {
        ((a, va), (b, vb))
        for a, b in itertools.combinations(names, 2)
        for va in factors[a]
        for vb in factors[b]
    }
    order = {n: i for i, n in enumerate(names)}
    rows = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (order[p[0][0]], order[p[1][0]], str(p)))
        row = {a: va, b: vb}
        for n in names:
            if n in row:
                continue
            def gain(v):
                return sum(
                    ((m, row[m]), (n, v)) in uncovered if order[m] < order[n] else ((n, v), (m, row[m])) in uncovered
                    for m in row
                )
            row[n] = max(factors[n], key=gain)  # first value wins ties: deterministic
        rows.append({n: row[n] for n in names})
        for a, b in itertools.combinations(names, 2):
            uncovered.discard(((a, row[a]), (b, row[b])))
    return rows


def config_of(row: dict) -> R.ODEConfig:
    batch, seq, heads, d_model = row["shape"]
    return R.ODEConfig(
        hidden_size=d_model, num_heads=heads, norm_type=row["norm_type"], ode_solver=row["ode_solver"],
        mode=row["mode"], use_bitnet=row["use_bitnet"], ode_steps=row["ode_steps"],
    )


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


def make_inputs(config, params, batch: int, seq: int, *, seed: int, padding: bool, scale: float = 1.0):
    """(x, padding_mask, seed_used): x ~ N(0, scale^2) float64, the first fair draw from seed."""
    reasons = []
    for attempt in range(MAX_REDRAWS):
        rng = np.random.default_rng(seed + attempt)
        x = rng.normal(size=(batch, seq, config.hidden_size)) * scale
        mask = padding_for(batch, seq, rng) if padding else None
        reason = check_fair(config, params, x, mask)
        if reason is None:
            return x, mask, seed + attempt
        reasons.append(reason)
    raise RuntimeError(f"no fair input in {MAX_REDRAWS} draws from seed {seed} for {config}: {reasons[:3]}")

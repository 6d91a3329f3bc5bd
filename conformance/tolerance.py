"""Tolerances, derived per case from the spec's own measured float32 error.

How far a correct implementation may be from the float64 golden depends on the case's
conditioning: a block that amplifies rounding (prms_norm over a near-zero channel, say) shows it
in the spec's own float32 run. So the golden generator runs the spec in float32 on every case
and stores that error per quantity, e32 = max|spec32 - golden| / max|golden|. Then, for a
backend computing in `dtype` with unit roundoff u:

    tolerance = SAFETY * max(e32 * u / u32, FLOOR_ULPS * u)

e32 * u / u32 is the spec's float32 error rescaled to the backend's precision (the error of a
backward-stable computation scales with u). SAFETY = 32 covers a backend that sums in another
order than NumPy: on the golden cases whose rescaled e32 is above the floor, no port's error is
over 16 times it (torch float32, the largest). FLOOR_ULPS = 1 keeps a case whose float32 run happened to be almost exact from getting a
tolerance below one rounding.
"""

from __future__ import annotations

import numpy as np

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
SAFETY = 32.0
FLOOR_ULPS = 1.0


def relative_error(got, want) -> float:
    """max|got - want| / max|want| (want = 0 everywhere: the absolute error)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 0.0
    err = float(np.abs(got - want).max()) if want.size else 0.0
    return err / scale if scale > 0 else err


def tolerance(e32: float, dtype: str) -> float:
    """The allowed relative_error for a backend computing in dtype, given the spec's e32."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {sorted(UNIT_ROUNDOFF)}; got {dtype!r}")
    u = UNIT_ROUNDOFF[dtype]
    return SAFETY * max(e32 * u / UNIT_ROUNDOFF["float32"], FLOOR_ULPS * u)

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

Half precision (float16, bfloat16) follows its own rule, for the same reason: a port that follows
the policy (ode_ref.precision) rounds to storage at the same points as the spec under it, and
sums in another order between them. So the golden set stores the spec's own error under the
policy, e16 and ebf16 (half.py), and

    half_tolerance = HALF_SAFETY * max(e_S, FLOOR_ULPS * u_S)

HALF_SAFETY = 2 from the spread of two other implementations of the policy (half.OTHERWISE:
float64 between the roundings, and float32 with the projections summed by einsum's loop instead
of BLAS) over every testable case and quantity of the packaged set: their error is at most 1.05
times e_S, floored at u_S (float16; 1.00 in bfloat16), and they differ from the spec's run by at
most 1.23 u_S. The roundings to storage, not the sums, set a half result's error: a value that
lands on the neighbouring half value adds one u_S. 2 is that worst ratio's next power of two
(a margin of 1.9 over it); a larger factor would let a port that breaks the policy pass, since
such a break is itself of the size of a few roundings.
"""

from __future__ import annotations

import numpy as np

from ode_ref.precision import HALF_DTYPES

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
SAFETY = 32.0
FLOOR_ULPS = 1.0
HALF_SAFETY = 2.0  # see the module docstring: the spread of two other implementations of the policy, at most 1.05


# XLA on CPU flushes subnormal numbers to zero, inputs and results alike: its runtime sets the
# CPU's flush-to-zero and denormals-are-zero modes around every computation, and jax 0.10.2 has no
# setting that keeps them (XLA_FLAGS=--xla_cpu_ftz=false leaves the flush; the ports' float32
# figures measured). So a backend whose adapter says flushes_subnormals (the JAX and Flax ones) is
# held to the spec run on the input with its subnormal entries read as 0 (flush_subnormals): an
# input made only of subnormals is the zero input there, relative error 1.0 against the spec on the
# input itself. torch and ONNX Runtime keep subnormals and are held to the spec on the input as given.


def flush_subnormals(a):
    """a with each subnormal entry read as 0 (its sign kept): the input a backend whose adapter
    says flushes_subnormals computes on. Normal numbers, zeros, Inf and NaN are unchanged."""
    a = np.asarray(a)
    return np.where(np.abs(a) < np.finfo(a.dtype).tiny, a * 0, a)


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


def half_tolerance(e_half: float, dtype: str) -> float:
    """The allowed relative_error for a backend following the half-precision policy in dtype
    (float16 or bfloat16), given the spec's own error under the policy e_half (e16 or ebf16)."""
    if dtype not in HALF_DTYPES:
        raise ValueError(f"dtype: expected one of bfloat16, float16; got {dtype!r}")
    return HALF_SAFETY * max(e_half, FLOOR_ULPS * UNIT_ROUNDOFF[dtype])


def quantity_tolerance(dtype: str, e32: float, e_half: float | None = None, float64_bound: float | None = None) -> float:
    """The allowed relative_error of one quantity computed in dtype, the rule every judge calls
    (the suite's comparison, the fuzzer's stages, the GenAI check): half_tolerance(e_half) where
    the spec's own error under the half policy was measured (a golden or drawn case's quantity in
    float16 or bfloat16), else tolerance(e32); in float64, at most float64_bound when one is
    given (a port that claims float64 agreement to ~1e-14, say)."""
    tol = half_tolerance(e_half, dtype) if e_half is not None else tolerance(e32, dtype)
    if float64_bound is not None and dtype == "float64":
        tol = min(tol, float64_bound)
    return tol

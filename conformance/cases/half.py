"""The spec under the half-precision policy on a case: its errors e16 and ebf16, or why it has none.

For every case the generator runs the spec under ode_ref.precision's policy in float16 and in
bfloat16 and stores, per quantity, e_S = relative_error(spec in S, golden float64): e16 and
ebf16, beside e32 (tolerance.half_tolerance derives the half tolerance from them). A case where
half precision has no meaning is untestable in that dtype, with the reason, decided by measuring
the run itself (half_errors), in this order:

    grad, encoder   the policy covers the attention block's forward and its cached decoding,
                    not the backward pass nor the encoder layer: untestable in both dtypes, as
                    those kinds say themselves (kinds.Kind.no_policy), before half_errors runs
    range           float16: an input or parameter beyond float16's range (65504), or hope over
                    more positions than float16 holds its factor r cosh(a) for (the spec refuses
                    the run, precision.check_hope_range, as every port does)
    overflow        the run under the policy gives a non-finite quantity where the golden is finite
                    (none does in the packaged set: the policy keeps the sums of squares and exp
                    in float32)
    BitLinear ties  use_bitnet: a second implementation of the policy (OTHERWISE) quantises some
                    level otherwise than the spec does (an 8-bit activation level or a ternary
                    weight). A level is an integer: a flip moves the output by a whole level, not
                    by a rounding, and which levels flip then depends on the order a port sums in,
                    so the error is no rounding error. The reason counts the flipped levels. The
                    levels that flip against the float64 run flip alike in every implementation
                    (measured: h is rounded to storage before it is quantised), so they alone do
                    not make a case untestable; they are in e_S.
    conditioning    the spec's own error under the policy over ILL_CONDITIONED_ULPS units of the
                    dtype's rounding (the reason says whether BitLinear levels flipped against
                    float64 or the case amplifies the rounding)

OTHERWISE holds two other implementations of the policy, run by policy_otherwise: the same
roundings to S at the same points, with everything between them computed in float64 instead of
float32, or in float32 with the projections summed in another order (each a legitimate "rounded
otherwise"); their spread against the spec's run is what tolerance.HALF_SAFETY is chosen from.
"""

from __future__ import annotations

import numpy as np

import ode_ref as R
from ode_ref.bitlinear import ACT_MAX, QUANT_EPS, layer_norm, quantize_activation
from ode_ref.precision import DTYPES, HALF_DTYPES, HalfPrecisionAttention, check_half_dtype, check_hope_range, half_attention, round_to

from .decoding import run_decode, split_decoded
from .tolerance import UNIT_ROUNDOFF, relative_error

HALF_FIELDS = {"float16": "e16", "bfloat16": "ebf16"}  # dtype -> the manifest's field
FLOAT16_MAX = float(np.finfo(np.float16).max)
# A case whose spec error under the policy is over this many units u of the dtype's rounding is
# untestable in it: its result has lost 3 of its bits (float16 11 -> 8, bfloat16 8 -> 5) to the
# case's conditioning, not to the port. Measured on the packaged set: over it, the prms_norm cases
# over near-zero channels (their e32 already 185-299 u32) at 15.7 to 1592 u (a relative error of
# 6.2 in bfloat16), and the BitLinear ones whose levels flip against float64 at 9 to 447 u; every
# other case is at most 7.7 u (at most 3.1 u without BitLinear).
ILL_CONDITIONED_ULPS = 8.0


def check_dtypes(dtypes, *, name: str = "dtypes") -> tuple:
    """dtypes as a tuple, if a non-empty sequence of DTYPES; ValueError naming the field, the
    allowed values and what it got otherwise."""
    if isinstance(dtypes, str) or not isinstance(dtypes, (tuple, list)) or not dtypes \
            or not all(isinstance(d, str) and d in DTYPES for d in dtypes):
        raise ValueError(f"{name}: expected a non-empty tuple of {', '.join(map(repr, DTYPES))}; got {dtypes!r}")
    return tuple(dtypes)


def numpy_dtype(dtype: str):
    """The NumPy dtype of a dtype name: bfloat16 is ml_dtypes' (NumPy has none)."""
    check_dtypes((dtype,), name="dtype")
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def cast(a, dtype: str):
    """a (float64) as dtype, the way a backend receives it: a half dtype through float32 (what
    every library converts from, so a value is rounded as ode_ref.precision.round_to rounds it)."""
    a = np.asarray(a)
    if dtype in HALF_DTYPES:
        with np.errstate(over="ignore"):  # beyond float16's range is inf, float16's own rounding
            return a.astype(np.float32).astype(numpy_dtype(dtype))
    return a.astype(numpy_dtype(dtype))


class _Levels(R.SelfAttention):
    """The spec's SelfAttention recording every BitLinear level it quantises to: each activation's
    8-bit levels and each weight's ternary levels, in the order computed (a list of int8 arrays).
    Put first in a class's bases, it records for the policy classes after it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.levels = []

    def quantize_weight(self, w):
        ternary, _ = R.ternarize_weight(w)
        self.levels.append(ternary.astype(np.int8))
        return super().quantize_weight(w)

    def _linear(self, x, w):
        if self.config.use_bitnet:
            x_n = layer_norm(x, 1.0, 0.0)
            scale = ACT_MAX / np.maximum(np.abs(x_n).max(axis=-1, keepdims=True), QUANT_EPS)
            self.levels.append(np.clip(np.round(x_n * scale), -128, 127).astype(np.int8))
        return super()._linear(x, w)


class _Float64Policy(HalfPrecisionAttention):
    """The policy computing in float64 between its roundings (storage values held in float64)."""

    def to_storage(self, a):
        return round_to(a, self.storage).astype(np.float64)


class _ReorderedPolicy(HalfPrecisionAttention):
    """The policy in float32 with every projection's sums in another order (einsum's loop, not BLAS)."""

    def _linear(self, x, w):
        x = quantize_activation(x) if self.config.use_bitnet else x
        return np.einsum("...i,oi->...o", x, w)


# The second implementations of the policy: name -> (class, the array type its input is held in)
OTHERWISE = {"float64": (_Float64Policy, np.float64), "reordered": (_ReorderedPolicy, np.float32)}


def _run(config, params, x, padding_mask, *, decoded: int, attention) -> dict:
    """The spec's quantities (those with an e32) on x, run with attention, outputs as computed."""
    if decoded:
        prompt = x.shape[1] - decoded
        return split_decoded(run_decode(config, params, x, padding_mask, prompt, attention=attention), prompt)
    out = {"f0": R.ode_func(params, 0.0, x, config, padding_mask, attention=attention)}
    _, traj = R.ode_block(params, x, config, padding_mask, attention=attention, return_trajectory=True)
    out.update({f"step_{k}": traj[k] for k in range(1, len(traj))})
    return out


def spec_half(config, params, x, padding_mask, *, dtype: str, decoded: int = 0, attention=None) -> dict:
    """quantity -> the spec's output under the policy in dtype (float32 arrays holding dtype values):
    half_block's trajectory and half_func's f0 for a block case, prefill and decode_step with
    half_attention for a decode case (x rounded on the way in, every output on the way out).
    attention: a spec variant to run under the policy (its levels recorder, here), or None."""
    half = half_attention(config, dtype, attention)
    with np.errstate(all="ignore"):  # float16 overflow is measured (a non-finite output), not raised
        out = _run(config, params, round_to(x, dtype), padding_mask, decoded=decoded, attention=half)
        return {q: round_to(a, dtype) for q, a in out.items()}


def policy_otherwise(config, params, x, padding_mask, *, dtype: str, how: str, decoded: int = 0,
                     levels=None) -> dict:
    """spec_half's quantities by a second implementation of the policy (OTHERWISE[how]): what a port
    that follows the policy but sums otherwise may return. levels: a list that receives the
    BitLinear levels quantised to (as _Levels records them), or None."""
    cls, held = OTHERWISE[how]
    half = type(f"Levels{cls.__name__}", (_Levels, cls), {})(config, dtype) if levels is not None else cls(config, dtype)
    if levels is not None:
        half.levels = levels
    with np.errstate(all="ignore"):
        out = _run(config, params, round_to(x, dtype).astype(held), padding_mask, decoded=decoded, attention=half)
        return {q: round_to(a, dtype) for q, a in out.items()}


def _flips(config, params, x, padding_mask, *, dtype: str, decoded: int) -> tuple:
    """(flipped, vs_float64, total): of the total BitLinear levels the spec under the policy
    quantises to, how many a second implementation of the policy (the worse of OTHERWISE) and the
    float64 run quantise otherwise."""
    spec, exact = _Levels(config), _Levels(config)
    spec_half(config, params, x, padding_mask, dtype=dtype, decoded=decoded, attention=spec)
    _run(config, params, x, padding_mask, decoded=decoded, attention=exact)
    others = [[] for _ in OTHERWISE]
    for how, levels in zip(OTHERWISE, others):
        policy_otherwise(config, params, x, padding_mask, dtype=dtype, how=how, decoded=decoded, levels=levels)

    def differ(levels):
        if [a.shape for a in levels] != [a.shape for a in spec.levels]:
            raise AssertionError("two runs of one case quantised different arrays")
        return sum(int((a != b).sum()) for a, b in zip(spec.levels, levels))

    return max(map(differ, others)), differ(exact.levels), sum(a.size for a in spec.levels)


def half_errors(config, params, x, padding_mask, golden: dict, *, dtype: str, decoded: int = 0) -> tuple:
    """(errors, reason): errors = quantity -> relative_error(spec under the policy in dtype, golden)
    for the quantities of golden (those with an e32), reason None; or (None, the reason the case is
    untestable in dtype), by the rules of this module's docstring. A block or decode case: the
    kinds the policy has no meaning on say so themselves (kinds.Kind.no_policy)."""
    check_half_dtype(dtype)
    if dtype == "float16":
        big = max([float(np.abs(x).max())] + [float(np.abs(v).max()) for v in params.values() if v.size])
        if big > FLOAT16_MAX:
            return None, f"float16 range: an input or parameter reaches {big:.3g}, beyond float16's {FLOAT16_MAX:g}"
        try:
            check_hope_range(config, dtype, x.shape[1], config.layer_idx)
        except ValueError as err:
            return None, f"float16 range: the spec refuses the run: {err}"
    out = spec_half(config, params, x, padding_mask, dtype=dtype, decoded=decoded)
    bad = [q for q in golden if not np.isfinite(out[q]).all()]
    if bad:
        return None, (f"{dtype} overflow: the spec under the policy gives non-finite values in {bad[0]}"
                      f"{f' (and {len(bad) - 1} more quantities)' if len(bad) > 1 else ''} where the golden is finite")
    errors = {q: relative_error(out[q], golden[q]) for q in golden}
    flipped, exact, total = _flips(config, params, x, padding_mask, dtype=dtype, decoded=decoded) if config.use_bitnet else (0, 0, 0)
    if flipped:
        return None, (f"BitLinear rounding ties: {flipped} of the {total} levels the spec quantises to in {dtype} lie so near "
                      "a rounding boundary that another implementation of the policy (float64, or float32 summed "
                      "otherwise, between the roundings) quantises them otherwise; a flipped level is no rounding error")
    worst = max(errors.values(), default=0.0)
    if worst > ILL_CONDITIONED_ULPS * UNIT_ROUNDOFF[dtype]:
        q = max(errors, key=errors.get)
        why = (f"BitLinear levels: in {dtype} the policy quantises {exact} of {total} levels otherwise than float64 "
               "does (every implementation of it alike), each moving the output by a whole level" if exact else
               "ill-conditioned: the case amplifies the rounding")
        return None, (f"{why}; the spec's own error under the policy reaches {worst:.3g} at {q}, "
                      f"{worst / UNIT_ROUNDOFF[dtype]:.0f} units of {dtype} rounding, over {ILL_CONDITIONED_ULPS:g}: "
                      "a tolerance from it would pass a wrong result")
    return errors, None

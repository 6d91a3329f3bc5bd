"""Half precision: the mixed-precision policy a block follows in float16 or bfloat16.

A block run in a storage dtype S (float16 or bfloat16) holds these in S, each rounded once where
it is made (round to nearest, ties to even):

    stored      the input x and every parameter
    h           the norm's output, norm(z)
    q, k, v     the projection's output, and q, k again after the rotation (rope, hope)
    y           the attention's output, before the output projection
    k_i         each stage's derivative, f(t, Z_i) = the output projection's output
    z(1)        the block's output (and each state of the trajectory, as returned)

and computes in float32 from those values:

    products    every matrix product: S values multiplied and summed in float32
    attention   the scores q k^T * scale + bias, the mask fill, the softmax and the weighted sum
                of v: a sum over seq_k weights loses mass in S, and exp overflows float16 above 11
    norms       the statistics (mean, variance, mean square): a sum of squares over d_model
                overflows float16 once |z| reaches about 256 / sqrt(d_model)
    BitLinear   its scales (mean |W|, max |x_n|) and levels; the levels are integers, exact in S
    positions   the rotary and hope tables, ALiBi's and BAM's biases, SSMax's factor
    RK          the state z and the stage sums z_0 + h sum_j a_ij k_j, and the gate (a multistep
                solver's past evaluations and momentum's speed alike): an increment h k is
                1/steps of z's size, so a state in bfloat16 (8 bits) would drop most of it

MixedPrecision is that policy as a mixin over any port's SelfAttention: it rounds at the points
above through one hook, to_storage(a), which each port writes in its own arrays. The spec's
HalfPrecisionAttention computes in float32 arrays that hold S values; half_block runs it.
NumPy has no bfloat16, so round_to rounds float32 bits (ode_ref imports NumPy only).
"""

from __future__ import annotations

import functools

import numpy as np

from .attention import SelfAttention
from .block import SPEC_DTYPES, check_dtype, ode_block, ode_func
from .positions import hope_angles, hope_damping

# The half pair: the storage dtypes S of the policy above.
HALF_DTYPES = ("float16", "bfloat16")
# The dtypes a case or a backend may run: float32 and float64 everywhere, and the half pair in the
# ports, under this policy (the spec's own ode_block takes block.SPEC_DTYPES; half_block is its run).
DTYPES = ("float32", "float64", "bfloat16", "float16")


def check_half_dtype(dtype: str, *, name: str = "dtype") -> str:
    """dtype, if it is one of HALF_DTYPES; ValueError naming the field otherwise."""
    if dtype not in HALF_DTYPES:
        raise ValueError(f"{name}: expected one of {', '.join(HALF_DTYPES)}; got {dtype!r}")
    return dtype


def round_to(a, dtype: str):
    """a rounded to dtype (float16 or bfloat16), ties to even, as a float32 array holding the
    rounded values. float16 overflows to +-inf above 65504; bfloat16 has float32's range. NaN
    stays NaN. a is taken as float32 first (what every library converts from)."""
    a = np.asarray(a, dtype=np.float32)
    if check_half_dtype(dtype) == "float16":
        with np.errstate(over="ignore"):  # beyond 65504 is +-inf, float16's own rounding
            return a.astype(np.float16).astype(np.float32)
    bits = a.view(np.uint32)
    half_up = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))  # ties go to the even top half
    with np.errstate(over="ignore"):
        rounded = ((bits + half_up) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(a), a, rounded)  # a NaN's payload plus the carry could read as Inf


FLOAT16_MAX = 65504.0  # float16's largest finite value


def check_float16_range(name: str, a, dtype: str) -> None:
    """ValueError naming `name` if a finite value of a (x or a parameter, before the policy rounds
    it) lies beyond float16's range: rounded, it would be Inf and the block's z NaN. The policy
    refuses it rather than saturating; bfloat16 has float32's range and is never refused."""
    if dtype != "float16":
        return
    a = np.asarray(a, dtype=np.float64)
    big = np.abs(np.where(np.isfinite(a), a, 0.0)).max(initial=0.0)
    if big > FLOAT16_MAX:
        raise ValueError(f"{name}: float16 holds magnitudes up to {FLOAT16_MAX:g}; got a finite value of magnitude "
                         f"{big:.4g} (it would round to Inf); scale it down, or use bfloat16 or float32")


def hope_factor(config, positions, layer_idx: int) -> np.ndarray:
    """hope's largest factor r cosh(a) over its frequencies, at each of positions (float64)."""
    return (hope_damping(positions, config, layer_idx) * np.cosh(hope_angles(positions, config, layer_idx))).max(axis=-1)


def hope_peak(config, last: int, layer_idx: int) -> tuple[float, int]:
    """(hope's largest factor r cosh(a) over positions 0 .. last, a position where it is). Per
    frequency, r = exp(-c p) falls (or rises, c < 0) while cosh(a) rises until the clip holds a at
    12, so the largest lies at 0, at last, or beside a frequency's clip position 12 / |b|: those
    few positions are weighed, not every one (a cache may hold millions)."""
    from .positions import HOPE_ANGLE_LIMIT, hope_gain, rotary_frequencies

    rates = np.abs(rotary_frequencies(config.head_dim // 2, config.hope_base) * hope_gain(layer_idx))
    clips = HOPE_ANGLE_LIMIT / rates[rates > 0]
    near = np.concatenate([np.floor(clips), np.ceil(clips)])
    candidates = np.unique(np.clip(np.concatenate([[0, last], near[np.isfinite(near)]]), 0, last).astype(np.int64))
    factors = hope_factor(config, candidates, layer_idx)
    at = int(np.argmax(factors))
    return float(factors[at]), int(candidates[at])


def check_hope_range(config, dtype: str, bound: int, layer_idx: int) -> None:
    """ValueError naming positional_encoding when hope, run in float16 over positions below bound,
    multiplies q and k by a factor r cosh(a) beyond float16's range at one of them (the last, or
    else hope_peak's: the factor rises to its clip and falls after, so the last is not always the
    largest): its
    rotated q and k (held in S) would overflow for any entry of magnitude 1. Decided from the
    config and the sequence's length alone (static under jit), so every path refuses the same runs."""
    if dtype != "float16" or config.position_encoding != "hope" or not isinstance(bound, (int, np.integer)):
        return
    last = max(int(bound) - 1, 0)
    factor, at = float(hope_factor(config, [last], layer_idx)[0]), last  # named at the last position where it passes
    if factor <= FLOAT16_MAX:
        factor, at = hope_peak(config, last, layer_idx)
    if factor > FLOAT16_MAX:
        fits = next(t for t in range(1, at + 1) if float(hope_factor(config, [t], layer_idx)[0]) > FLOAT16_MAX)
        raise ValueError(f"positional_encoding: hope in float16 multiplies q and k by r cosh(a) = {factor:.3g} at "
                         f"position {at}, beyond float16's {FLOAT16_MAX:g}, so they overflow to NaN; float16 runs "
                         f"hope on sequences (and caches) of at most {fits} tokens here (layer_idx {layer_idx}); "
                         f"got {int(bound)}; use bfloat16 or float32")


class MixedPrecision:
    """The policy as a mixin: class Half(MixedPrecision, PortSelfAttention). The port supplies
    to_storage(a) -> a with its values rounded to self.storage, in the array the next stage
    computes in (float32 here); everything else is the port's own stages, run in float32."""

    storage: str = "bfloat16"

    def to_storage(self, a):
        raise NotImplementedError

    def weights(self, params: dict, x):
        qkv, out_proj, norm = super().weights(params, x)
        return self.to_storage(qkv), self.to_storage(out_proj), {k: self.to_storage(v) for k, v in norm.items()}

    def encoder_weights(self, params: dict, x):
        return {k: self.to_storage(v) for k, v in super().encoder_weights(params, x).items()}

    def gate_weights(self, params: dict, x):
        return tuple(self.to_storage(a) for a in super().gate_weights(params, x))

    def norm(self, norm_params: dict, z):
        return self.to_storage(super().norm(norm_params, z))

    def project(self, w_qkv, h):
        return tuple(self.to_storage(a) for a in super().project(w_qkv, h))

    def hope_tables(self, positions, bound: int, like, layer_idx: int):
        check_hope_range(self.config, self.storage, bound, layer_idx)
        return super().hope_tables(positions, bound, like, layer_idx)

    def prefill(self, params, x, padding_mask, max_len: int):
        check_hope_range(self.config, self.storage, max_len, self.config.layer_idx)  # the cache's last position
        return super().prefill(params, x, padding_mask, max_len)

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        if rope is None:  # nothing rotated: q and k are already in S
            return super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        q, k, v = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        return self.to_storage(q), self.to_storage(k), v

    def attn(self, q, k, v, mask, bias=None):
        return self.to_storage(super().attn(q, k, v, mask, bias))

    def output_proj(self, w_out, y):
        return self.to_storage(super().output_proj(w_out, y))


class HalfPrecisionAttention(MixedPrecision, SelfAttention):
    """The spec's SelfAttention under the policy, in float32 arrays holding `storage` values."""

    def __init__(self, config, storage: str):
        super().__init__(config)
        self.storage = check_half_dtype(storage, name="storage")

    def to_storage(self, a):
        return round_to(a, self.storage)


@functools.cache
def policy_class(policy: type, cls: type) -> type:
    """The class (policy, cls): a port's policy mixin (MixedPrecision and its to_storage) over the
    port's SelfAttention or a variant cls, made once per pair."""
    return type(f"Half{cls.__name__}", (policy, cls), {})


def policy_view(attention, policy: type, storage: str, **settings):
    """attention under the policy in storage: an object of policy_class(policy, type(attention))
    holding attention's own attributes (the same objects: a torch module's parameters too) and
    storage (and the port's settings, e.g. its dtype object), so its stages, a variant's
    included, run between the policy's rounding points. attention itself is left as it was."""
    cls = policy_class(policy, type(attention))
    half = cls.__new__(cls)
    half.__dict__.update(vars(attention), storage=check_half_dtype(storage, name="storage"), **settings)
    return half


def half_attention(config, storage: str, attention=None):
    """The policy over attention (an instance of the spec's SelfAttention or of a variant of it,
    whose stages it keeps), or over SelfAttention(config) when None."""
    if attention is None or type(attention) is SelfAttention:
        return HalfPrecisionAttention(config, storage)
    return policy_view(attention, HalfPrecisionAttention, storage)


def half_block(params, x, config, padding_mask=None, *, dtype: str, attention=None,
               return_trajectory: bool = False):
    """ode_block under the policy in dtype: x (batch, seq, d_model) and params are rounded to
    dtype on the way in, z(1) (and each state of the trajectory) on the way out. Returns float32
    arrays holding dtype values. attention: a spec variant to run under the policy, or None."""
    check_dtype("x", np.asarray(x).dtype, (*HALF_DTYPES, *SPEC_DTYPES))  # rounded to dtype below
    for name, a in (("x", x), *((f"params[{k!r}]", v) for k, v in params.items())):
        check_float16_range(name, a, dtype)
    attention = half_attention(config, dtype, attention)
    out = ode_block(params, round_to(x, dtype), attention.config, padding_mask, attention=attention,
                    return_trajectory=return_trajectory)
    if return_trajectory:
        return round_to(out[0], dtype), round_to(out[1], dtype)
    return round_to(out, dtype)


def half_func(params, t, x, config, padding_mask=None, *, dtype: str, attention=None):
    """f(t, x) under the policy in dtype: a stage's derivative, already in dtype (float32 array)."""
    for name, a in (("x", x), *((f"params[{k!r}]", v) for k, v in params.items())):
        check_float16_range(name, a, dtype)
    attention = half_attention(config, dtype, attention)
    return ode_func(params, t, round_to(x, dtype), attention.config, padding_mask, attention=attention)

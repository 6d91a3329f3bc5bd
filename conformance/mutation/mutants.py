"""The mutation battery: one-line bugs that real ports make, applied to the spec, run through the
real runner (worker processes and all). A suite that passes them is too weak: every mutant must
fail at least one case in float32 and in float64. `odeattn conformance mutants` prints the kill
table; tests/conformance/test_mutants.py requires every kill.

In half precision the battery runs the spec under the mixed-precision policy (ode_ref.precision)
with the mutant's stage or patch in place, in bfloat16 against the ebf16-derived tolerances; a
mutant bfloat16 misses runs in float16 too, and the table names the smallest dtype that kills it
(bfloat16 < float16 < float32 < float64). The policy mutants (policy_mutants.py) break the policy
itself, so they run in the half dtypes only, and each must be killed in bfloat16.

A mutant is a record: its name, the part of the spec it breaks, the bug in words, and the patch,
either a stage override (a SelfAttention subclass) or a replacement of one spec function or
table entry, in place only while the mutant computes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import ode_ref as R
from ode_ref import attention as A
from ode_ref import bitlinear as BL
from ode_ref import multistep as MS
from ode_ref import norms as N
from ode_ref import positions as P
from ode_ref import rk as RK
from ode_ref import temporal as T
from ode_ref.encoder import ODEEncoderStages
from ode_ref.encoder_layer import EncoderStages
from ode_ref.tableaus import TABLEAUS, ButcherTableau

from ode_ref.precision import HALF_DTYPES, MixedPrecision

from . import policy_mutants as PM
from .encoder_mutants import (_ema_power_off_by_one, _embedding_with_2pi, _ffn_bias_dropped, _gate_stages_swapped,
                              _history_weights_transposed, _macaron_second_half_dropped, _post_norm_applied_pre,
                              _released_residual_in_paper, _t_at_step_start, _weight_as_out_in)
from ..adapters import SpecAdapter
from ..cases.fields import CONFIGS as FIELD_CONFIGS, ignoring, mutant_name, proven
from ..adapters import BackendRef
from ..running.runner import run_suite


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str  # the stage, norm, BitLinear part or solver it breaks
    bug: str
    stage: Optional[type] = None  # a SelfAttention subclass with the bug in one stage
    patch: Optional[Callable[[], list]] = None  # -> [(namespace, key, value)], dicts or modules
    ignores: Optional[str] = None  # a config field the mutant runs at its default (cases/fields.py)
    ignores_in: Optional[type] = None  # the config class whose field it is

    @property
    def policy(self) -> bool:
        """A policy violation (a MixedPrecision override): meaningful in a half dtype only."""
        return self.stage is not None and issubclass(self.stage, MixedPrecision)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes it has meaning in: the half ones for a policy mutant, float32 and float64 for a
        field ignored (the golden set proves the field there), else all four."""
        if self.ignores:
            return ("float32", "float64")
        return HALF_DTYPES if self.policy else ("float32", "float64", *HALF_DTYPES)


# ---- stages --------------------------------------------------------------------------------------
class _ScaleByHeadDim(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(1.0 / self.config.head_dim)  # bug: 1/d, not d^-1/2
        s = s if bias is None else s + bias
        return (A.softmax(A.masked_fill_min(s, mask)) @ v).transpose(0, 2, 1, 3)


class _SoftmaxOverQueries(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale)
        s = s if bias is None else s + bias
        return (A.softmax(A.masked_fill_min(s, mask), axis=-2) @ v).transpose(0, 2, 1, 3)  # bug: axis -2


class _MaskFillZero(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale)
        s = s if bias is None else s + bias
        return (A.softmax(np.where(mask, s, 0.0)) @ v).transpose(0, 2, 1, 3)  # bug: masked scores 0, not -big


class _CausalOffByOne(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        mask = super().build_mask(seq_len, padding_mask, cache_index=cache_index)
        i, j = A.slot_indices(seq_len, cache_index)
        return mask & (j < i) if self.config.mode == "decoder" else mask  # bug: j < i


class _CausalTransposed(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = A.slot_indices(seq_len, cache_index)
        mask = np.ones((1, 1, i.shape[0], seq_len), dtype=bool)
        if self.config.mode == "decoder":
            mask = mask & (j >= i)  # bug: j >= i
        return mask if padding_mask is None else mask & padding_mask[:, None, None, :]


class _PaddedKeysVisible(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        return super().build_mask(seq_len, None, cache_index=cache_index)  # bug: the padding mask never reaches the keys


class _PaddedQueriesKept(R.SelfAttention):
    def postprocess_attn(self, y, padding_mask=None):
        return y  # bug: padded queries keep their attention output


class _SplitHeadsFirst(R.SelfAttention):
    def project(self, w_qkv, h):
        b, t, _ = h.shape
        qkv = self._linear(h, w_qkv).reshape(b, t, self.config.num_heads, 3, self.config.head_dim)  # bug: (H, 3)
        return qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]


class _MergeHeadsTransposed(R.SelfAttention):
    def merge_heads(self, y):
        return y.transpose(0, 1, 3, 2).reshape(*y.shape[:2], self.config.hidden_size)  # bug: (head_dim, heads)


# ---- positions and the cache ---------------------------------------------------------------------
def _rotate_half(x, cos, sin):
    """The RoFormer/Llama convention: pairs (x[i], x[i + P]), not interleaved."""
    p = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    a, b = x[..., :p], x[..., p:2 * p]
    return np.concatenate([a * c - b * s, a * s + b * c, x[..., 2 * p:]], axis=-1)


class _RopeRotateHalf(R.SelfAttention):
    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        if rope is None:
            return q, k, v
        return _rotate_half(q, *rope), _rotate_half(k, *rope), v  # bug: rotate-half pairs


def _llama_frequencies(config):
    pairs = config.head_dim // 2
    return np.power(config.rope_base, -2.0 * np.arange(pairs) / config.head_dim)  # bug: base^(-2i/d)


def _alibi_slopes_reversed(num_heads):
    return _SPEC_SLOPES(num_heads)[::-1]  # bug: the steepest slope on the last head


_SPEC_SLOPES = P.alibi_slopes


class _DecodePositionIsSlot(R.SelfAttention):
    def read_slot(self, a, index):
        return np.full((a.shape[0], 1), index)  # bug: the cache slot, not the count of real tokens before it


# ---- norms -----------------------------------------------------------------------------------------
def _norm(name, fn):
    return lambda: [(N.NORMS, name, fn)]


def _layer_norm_eps(x, weight, bias):
    return N.layer_norm(x, weight, bias, eps=1e-6)  # bug: eps 1e-6, not 1e-5


def _layer_norm_no_bias(x, weight, bias):
    return N.layer_norm(x, weight, 0.0)  # bug: the bias dropped


def _layer_norm_unbiased(x, weight, bias):
    n = x.shape[-1]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / (n - 1)  # bug: unbiased variance
    return (x - mean) / np.sqrt(var + N.LAYER_NORM_EPS) * weight + bias


def _rms_eps_outside(x, weight):
    return weight * (x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + N.RMS_EPS))  # bug: eps outside sqrt


def _prms_all_channels(x, weight):
    return N.rms_norm(x, weight)  # bug: the statistic over every channel


def _prms_last_channels(x, weight):
    k = N.prms_channels(x.shape[-1])
    partial = x[..., -k:]  # bug: the last k channels, not the first
    return weight * (x / np.sqrt((partial * partial).mean(axis=-1, keepdims=True) + N.RMS_EPS))


def _flash_over_seq(x):
    return x / np.sqrt((x * x).mean(axis=(-2, -1), keepdims=True) + N.RMS_EPS)  # bug: over (seq, d_model)


def _dyt_biased(x, alpha, beta):
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)  # bug: biased std (n)
    return np.tanh((x - mean) / (std + N.DYT_EPS) * alpha + beta)


def _derf_shift_inside(x, alpha, s, gamma, beta):
    return gamma * N.erf(alpha * (x + s)) + beta  # bug: alpha (x + s)


# ---- BitLinear -------------------------------------------------------------------------------------
def _act_per_tensor(x):
    x_n = N.layer_norm(x, 1.0, 0.0)
    scale = BL.ACT_MAX / np.maximum(np.abs(x_n).max(), BL.QUANT_EPS)  # bug: one scale for the tensor
    return np.clip(np.round(x_n * scale), -128, 127) / scale


def _act_truncate(x):
    x_n = N.layer_norm(x, 1.0, 0.0)
    scale = BL.ACT_MAX / np.maximum(np.abs(x_n).max(axis=-1, keepdims=True), BL.QUANT_EPS)
    return np.clip(np.trunc(x_n * scale), -128, 127) / scale  # bug: truncation, not round-half-even


def _act_no_norm(x):
    scale = BL.ACT_MAX / np.maximum(np.abs(x).max(axis=-1, keepdims=True), BL.QUANT_EPS)
    return np.clip(np.round(x * scale), -128, 127) / scale  # bug: no layer_norm before quantising


def _weight_clip_2(w):
    scale = BL.weight_scale(w)
    return np.clip(np.round(w * scale), -2, 2) / scale  # bug: clip to [-2, 2]


def _weight_scale_per_row(w):
    scale = w.dtype.type(1.0) / np.maximum(np.abs(w).mean(axis=-1, keepdims=True), w.dtype.type(BL.QUANT_EPS))  # bug
    return np.clip(np.round(w * scale), -1, 1) / scale


# ---- solvers -------------------------------------------------------------------------------------
def _ralston_heun_weights():
    t = TABLEAUS["ralston"]
    return [(TABLEAUS, "ralston", dataclasses.replace(t, b=(0.5, 0.5)))]  # bug: b = (1/2, 1/2), not (1/4, 3/4)


def _rk38_for_rk4():
    return [(TABLEAUS, "rk4", dataclasses.replace(TABLEAUS["rk38"], name="rk4"))]  # torchdiffeq's 'rk4'


def _integrate_h_off_by_one(f, y0, method, steps: int, gate=None, *, checkpoint=None, trajectory=True):
    h = 1.0 / (steps + 1)  # bug: the grid has steps + 1 points, so h = 1/(steps + 1)
    states, past = [y0], ()
    for n, t0 in enumerate(RK.step_times(steps)):
        if isinstance(method, ButcherTableau):
            states.append(RK.rk_step(f, t0, h, states[-1], method, gate))
        else:
            y, past = MS.multistep(f, t0, h, states[-1], method, past, n)
            states.append(y)
    return states if trajectory else states[-1:]


def _integrate_reversed(f, y0, method, steps, gate=None, *, checkpoint=None, trajectory=True):
    states = MS.solve(f, y0, method, steps, gate, checkpoint=checkpoint)[::-1]  # bug: the trajectory newest first
    return states if trajectory else states[-1:]


def _ab2_coefficients_swapped():
    return [(MS.MULTISTEP, "ab2", dataclasses.replace(MS.AB2, betas=(-0.5, 1.5)))]  # bug: -1/2 f_n + 3/2 f_{n-1}


def _momentum_swapped(f, t0, h, y, method, past, n):
    if not method.momentum:
        return _SPEC_MULTISTEP(f, t0, h, y, method, past, n)
    f_n = f(t0, y)  # bug: v <- (1 - gamma) v + gamma f, the speed's weights swapped
    v = method.gamma * f_n if not past else (1.0 - method.gamma) * past[0] + method.gamma * f_n
    return y + h * v, (v,)


class _GateComplement(R.SelfAttention):
    def gate(self, gate_params, f1, f2):
        return 1.0 - super().gate(gate_params, f1, f2)  # bug: z + h ((1 - g) F1 + g F2)


class _GateInputsSwapped(R.SelfAttention):
    def gate(self, gate_params, f1, f2):
        return super().gate(gate_params, f2, f1)  # bug: the gate reads [F2; F1]


class _GateNoBias(R.SelfAttention):
    def gate(self, gate_params, f1, f2):
        w, b = gate_params
        return super().gate((w, b * 0), f1, f2)  # bug: the gate's bias dropped


# ---- the seed's positional family ---------------------------------------------------------------
class _HopeRelative(R.SelfAttention):
    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        if self.config.position_encoding != "hope":
            return super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        back = P.hope_tables(-positions, self.config, self.config.layer_idx, q.dtype)  # bug: k at -j, as RoPE's inverse
        return P.apply_hope(q, *rope), P.apply_hope(k, *back), v


class _PapeNormedState(R.SelfAttention):
    def norm(self, norm_params, z):
        self._normed = super().norm(norm_params, z)
        return self._normed

    def content_bias(self, encoder, z, positions_q, positions_k):
        return super().content_bias(encoder, self._normed, positions_q, positions_k)  # bug: the normed state h


class _BamAlphaOnKey(R.SelfAttention):
    def bam_bias(self, encoder, positions_q, positions_k, like):
        swapped = P.bam_bias(encoder, positions_k, positions_q, self.config, like.dtype)  # bug: |i - alpha j - mu|
        return swapped.transpose(0, 1, 3, 2)


class _SsmaxBeforeBias(R.SelfAttention):
    def ssmax_bias(self, bias, factor):
        return bias  # bug: the bias added after the rescale, unscaled


class _SsmaxPaddedLength(R.SelfAttention):
    def ssmax_factor(self, encoder, positions_q, positions_k, seq_len, like):
        lengths = np.full((1, positions_q.shape[1]), seq_len)  # bug: n = the padded length, whatever the rule
        return P.ssmax_factor(encoder["ssmax.s"], lengths, like.dtype)

# ---- the ODE Transformer's encoder (encoder cases): encoder_mutants.py -----------------------------
_SPEC_MULTISTEP = MS.multistep

MUTANTS = [
    Mutant("scale_1_over_head_dim", "attn", "scores scaled by 1/head_dim instead of head_dim^-1/2", stage=_ScaleByHeadDim),
    Mutant("softmax_over_queries", "attn", "softmax over the query axis", stage=_SoftmaxOverQueries),
    Mutant("masked_scores_zero", "attn", "masked scores filled with 0 instead of the most negative float", stage=_MaskFillZero),
    Mutant("causal_off_by_one", "build_mask", "causal mask j < i (the diagonal hidden)", stage=_CausalOffByOne),
    Mutant("causal_transposed", "build_mask", "causal mask transposed (j >= i)", stage=_CausalTransposed),
    Mutant("padded_keys_visible", "build_mask", "padded keys not hidden", stage=_PaddedKeysVisible),
    Mutant("padded_queries_kept", "postprocess_attn", "padded queries not zeroed", stage=_PaddedQueriesKept),
    Mutant("qkv_split_heads_first", "project", "qkv reshaped (heads, 3) instead of (3, heads)", stage=_SplitHeadsFirst),
    Mutant("heads_merged_transposed", "merge_heads", "heads merged as (head_dim, heads)", stage=_MergeHeadsTransposed),
    Mutant("rope_rotate_half", "RoPE", "pairs (x[i], x[i + P]) (RoFormer/Llama), not interleaved", stage=_RopeRotateHalf),
    Mutant("rope_llama_frequencies", "RoPE", "frequencies base^(-2i/head_dim), not base^(-i/(P - 1))",
           patch=lambda: [(P, "rope_frequencies", _llama_frequencies)]),
    Mutant("alibi_slopes_reversed", "ALiBi", "slopes in reverse head order", patch=lambda: [(P, "alibi_slopes", _alibi_slopes_reversed)]),
    Mutant("decode_position_is_slot", "cache", "a decoded token's position is its slot, padding counted",
           stage=_DecodePositionIsSlot),
    Mutant("layer_norm_eps", "layer_norm", "eps 1e-6 instead of 1e-5", patch=_norm("layer_norm", _layer_norm_eps)),
    Mutant("layer_norm_no_bias", "layer_norm", "bias dropped", patch=_norm("layer_norm", _layer_norm_no_bias)),
    Mutant("layer_norm_unbiased_var", "layer_norm", "unbiased variance (n - 1)", patch=_norm("layer_norm", _layer_norm_unbiased)),
    Mutant("rms_norm_eps_outside_sqrt", "rms_norm", "x / (sqrt(mean x^2) + eps)", patch=_norm("rms_norm", _rms_eps_outside)),
    Mutant("prms_norm_all_channels", "prms_norm", "statistic over every channel", patch=_norm("prms_norm", _prms_all_channels)),
    Mutant("prms_norm_last_channels", "prms_norm", "statistic over the last k channels", patch=_norm("prms_norm", _prms_last_channels)),
    Mutant("flash_norm_over_seq", "flash_norm", "statistic over (seq, d_model)", patch=_norm("flash_norm", _flash_over_seq)),
    Mutant("dynamic_tanh_biased_std", "dynamic_tanh", "biased std (n) instead of unbiased", patch=_norm("dynamic_tanh", _dyt_biased)),
    Mutant("derf_shift_inside", "derf", "erf(alpha (x + s)) instead of erf(alpha x + s)", patch=_norm("derf", _derf_shift_inside)),
    Mutant("bitlinear_act_scale_per_tensor", "BitLinear", "activation scale over the whole tensor, not per token",
           patch=lambda: [(BL, "quantize_activation", _act_per_tensor)]),
    Mutant("bitlinear_act_truncate", "BitLinear", "activation rounding by truncation", patch=lambda: [(BL, "quantize_activation", _act_truncate)]),
    Mutant("bitlinear_act_no_layer_norm", "BitLinear", "activation quantised without its layer_norm",
           patch=lambda: [(BL, "quantize_activation", _act_no_norm)]),
    Mutant("bitlinear_weight_clip_2", "BitLinear", "ternary clip bounds [-2, 2]", patch=lambda: [(R.SelfAttention, "quantize_weight", staticmethod(_weight_clip_2))]),
    Mutant("bitlinear_weight_scale_per_row", "BitLinear", "weight scale per output row, not per tensor",
           patch=lambda: [(R.SelfAttention, "quantize_weight", staticmethod(_weight_scale_per_row))]),
    Mutant("ralston_weights", "tableau", "Ralston with Heun's weights b = (1/2, 1/2)", patch=_ralston_heun_weights),
    Mutant("rk38_for_rk4", "tableau", "the 3/8 rule run for rk4 (torchdiffeq's 'rk4')", patch=_rk38_for_rk4),
    Mutant("step_size_off_by_one", "step times", "h = 1/(steps + 1): the grid stops short of t = 1",
           patch=lambda: [(A, "solve", _integrate_h_off_by_one)]),
    Mutant("gate_complement", "gated RK2", "z + h ((1 - g) F1 + g F2): the gate's weights swapped", stage=_GateComplement),
    Mutant("gate_inputs_swapped", "gated RK2", "the gate reads [F2; F1], not [F1; F2]", stage=_GateInputsSwapped),
    Mutant("gate_bias_dropped", "gated RK2", "the gate's bias dropped", stage=_GateNoBias),
    Mutant("trajectory_reversed", "trajectory", "states returned newest first", patch=lambda: [(A, "solve", _integrate_reversed)]),
    Mutant("ab2_coefficients_swapped", "Adams-Bashforth", "Adams-Bashforth 2 as y + h (-1/2 f_n + 3/2 f_{n-1})", patch=_ab2_coefficients_swapped),
    Mutant("momentum_weights_swapped", "momentum", "v <- (1 - gamma) v + gamma f: the speed's weights swapped",
           patch=lambda: [(MS, "multistep", _momentum_swapped)]),
    Mutant("encoder_gate_stages_swapped", "encoder block", "rk2_gated's gate reads [k_2; k_1], not [k_1; k_2]",
           patch=lambda: [(ODEEncoderStages, "stage_weights", _gate_stages_swapped)]),
    Mutant("encoder_released_residual_in_paper", "encoder block", "the paper profile's stages are L(y), the released residual, not L(y) - y",
           patch=lambda: [(ODEEncoderStages, "stage", _released_residual_in_paper)]),
    Mutant("encoder_post_norm_applied_pre", "encoder layer", "a post-norm layer's norms applied before each sublayer",
           patch=lambda: [(EncoderStages, "sublayer", _post_norm_applied_pre)]),
    Mutant("encoder_ffn_bias_dropped", "encoder layer", "the FFN's fc2 bias dropped", patch=lambda: [(EncoderStages, "ffn", _ffn_bias_dropped)]),
    Mutant("ema_power_off_by_one", "PCformer predictor", "weights a (1-a)^(s-i): one power of (1 - a) too many on each",
           patch=lambda: [(ODEEncoderStages, "ema_weights", _ema_power_off_by_one)]),
    Mutant("corrector_weights_transposed", "PCformer corrector", "the history's weights read weight[m, c-1], not weight[c-1, m]",
           patch=lambda: [(ODEEncoderStages, "history_sum", _history_weights_transposed)]),
    Mutant("macaron_second_half_dropped", "Macaron layer", "the paper's second FFN added whole, not halved",
           patch=lambda: [(R.ODEEncoderConfig, "ffn_factors", property(_macaron_second_half_dropped))]),
    Mutant("temporal_t_at_step_start", "time-dependent weights", "the weights at t = k h, the step's start, not (k + 1) h",
           patch=lambda: [(T, "step_ends", _t_at_step_start)]),
    Mutant("temporal_embedding_2pi", "time-dependent weights", "e(t)'s angles 2 pi 1000 t w_i, not 1000 t w_i",
           patch=lambda: [(T, "time_embedding", _embedding_with_2pi)]),
    Mutant("temporal_weight_out_in", "time-dependent weights", "W(t) read as (out, in) and transposed, not (in, out)",
           patch=lambda: [(T.TemporalStages, "temporal_linear", _weight_as_out_in)]),
    Mutant("hope_relative", "hope", "k mapped at -j (as RoPE's inverse): the score made relative, i - j", stage=_HopeRelative),
    Mutant("pape_normed_state", "PaPE", "coefficients from the normed state h, not the raw z", stage=_PapeNormedState),
    Mutant("bam_alpha_on_key", "BAM", "alpha on the key index: abs(i - alpha j - mu)", stage=_BamAlphaOnKey),
    Mutant("ssmax_before_bias", "SSMax", "the rescale before the bias: the bias not multiplied", stage=_SsmaxBeforeBias),
    Mutant("ssmax_padded_length", "SSMax", "ln of the padded length where the rule is the visible keys",
           stage=_SsmaxPaddedLength),
    # the policy's violations, in the half dtypes only (policy_mutants.py)
    Mutant("policy_softmax_in_storage", "policy", "the scores, softmax and weighted sum of v computed in the storage dtype",
           stage=PM.SoftmaxInStorage),
    Mutant("policy_norm_statistics_in_storage", "policy", "the norm's input and statistics in the storage dtype",
           stage=PM.NormStatisticsInStorage),
    Mutant("policy_state_in_storage", "policy", "the RK state and stage sums held in the storage dtype",
           stage=PM.StateInStorage),
    Mutant("policy_projection_sums_in_storage", "policy", "the projections' sums accumulated in the storage dtype",
           stage=PM.ProjectionSumsInStorage),
]


# A mutant per config field the golden set must prove (cases/fields.py): a port that ignores it
FIELD_MUTANTS = [Mutant(mutant_name(cls, name), f"config: {cls.__name__}",
                        f"{name} ignored: the port runs its default, {default!r}", ignores=name, ignores_in=cls)
                 for cls in FIELD_CONFIGS for name, default in proven(cls).items()]
MUTANTS += FIELD_MUTANTS


@contextlib.contextmanager
def applied(mutant: Mutant):
    """The mutant's replacements in place, undone on exit."""
    changes = mutant.patch() if mutant.patch else []
    saved = []
    for where, key, value in changes:
        if isinstance(where, dict):
            saved.append((where, key, where[key]))
            where[key] = value
        else:  # as stored: a class's staticmethod stays one when restored
            saved.append((where, key, inspect.getattr_static(where, key)))
            setattr(where, key, value)
    try:
        yield
    finally:
        for where, key, value in reversed(saved):
            if isinstance(where, dict):
                where[key] = value
            else:
                setattr(where, key, value)


class MutantAdapter(SpecAdapter):
    """The spec with one mutant, in the dtypes the mutant has meaning in."""

    shares_process = True  # a mutant leaves nothing behind in its worker: the next one may run there

    def __init__(self, mutant: Mutant):
        self.mutant, self.name, self.dtypes = mutant, f"mutant:{mutant.name}", mutant.dtypes

    def _attention(self, config):
        return self.mutant.stage(config) if self.mutant.stage else None

    def supports(self, config, dtype):
        """A field mutant runs only the cases that set its field: elsewhere it is the spec."""
        if self.mutant.ignores and type(config) is not self.mutant.ignores_in:
            return f"not supported: {self.mutant.ignores} of an {self.mutant.ignores_in.__name__}, not of this case's config"
        if self.mutant.ignores and ignoring(config, self.mutant.ignores) is None:
            field = self.mutant.ignores
            if getattr(config, field) == proven(type(config))[field]:
                return f"not supported: {field} is at its default in this case (ignoring it changes nothing)"
            return f"not supported: this config refuses {field} at its default (the field is fixed here, not read)"
        return super().supports(config, dtype)

    def _config(self, config):
        return (ignoring(config, self.mutant.ignores) or config) if self.mutant.ignores else config

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        with applied(self.mutant):
            return super().run_trajectory(self._config(config), params, x, padding_mask, dtype)

    def run_block(self, config, params, x, padding_mask, dtype):
        with applied(self.mutant):
            return super().run_block(self._config(config), params, x, padding_mask, dtype)

    def run_func(self, config, params, t, x, padding_mask, dtype):
        with applied(self.mutant):
            return super().run_func(self._config(config), params, t, x, padding_mask, dtype)

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        with applied(self.mutant):
            return super().run_decode(self._config(config), params, x, padding_mask, prompt, dtype)

    def run_encoder(self, config, params, x, padding_mask, dtype):
        with applied(self.mutant):
            return super().run_encoder(self._config(config), params, x, padding_mask, dtype)

    def run_lm(self, config, params, ids, attention_mask, dtype):
        with applied(self.mutant):
            return super().run_lm(self._config(config), params, ids, attention_mask, dtype)


# '<this module>:battery.<name>' names each mutant's adapter for a worker
battery = types.SimpleNamespace(**{m.name: (lambda m=m: MutantAdapter(m)) for m in MUTANTS})
DTYPE_ORDER = ("bfloat16", "float16", "float32", "float64")  # lowest precision first: the smallest that kills


def kill_table(cases, *, jobs=None, progress=None) -> list[dict]:
    """Run every mutant on every forward case (block, decode and encoder; the grad cases check the
    backward pass, which these bugs are not written for) in float32 and float64, and in bfloat16
    and float16 on the cases float64 kills, up to each one's first kill (a policy mutant: in those
    two only, on every case): one row a mutant."""

    cases = [c for c in cases if not c.kind.backward]
    refs = [BackendRef(f"mutant:{m.name}", f"{__name__}:battery.{m.name}", dtypes=m.dtypes,
                       shares_process=MutantAdapter.shares_process) for m in MUTANTS]
    report = run_suite(refs, cases, jobs=jobs, progress=progress, first_failure=HALF_DTYPES, gate="float64")
    return [_row(m, [r for r in report.results if r.backend == f"mutant:{m.name}"],
                 [e.message for e in report.errors if e.backend == f"mutant:{m.name}"], len(cases)) for m in MUTANTS]


def _row(m: Mutant, mine: list, errors: list, cases: int) -> dict:
    """A mutant's kill-table row from its results (every dtype it ran) and its backend errors."""
    # a failure kills; so does a field mutant's error (a port ignoring a field that sets a parameter's
    # shape cannot run the case's parameters); any other mutant's error is the battery's own fault
    kills = ("failed", "error") if m.ignores else ("failed",)
    killed = {d: [r for r in mine if r.dtype == d and r.status in kills] for d in DTYPE_ORDER}
    first = next((killed[d][0] for d in ("float64", "float32", "bfloat16") if killed[d]), None)
    return {
        "mutant": m.name, "target": m.target, "bug": m.bug, "policy": m.policy, "ignores": m.ignores,
        "ran_float64": sum(r.dtype == "float64" and r.status not in ("skipped", "untestable") for r in mine),
        "killed_float32": len(killed["float32"]), "killed_float64": len(killed["float64"]), "cases": cases,
        "smallest_dtype": next((d for d in DTYPE_ORDER if killed[d]), "-"),
        "first_divergence": _quantity(first.message) if first else "-",
        "errors": ([] if m.ignores else [r.message for r in mine if r.status == "error"][:1]) + errors,
    }


def _quantity(message: str) -> str:
    """'f0' or 'step_k' from a runner message ('diverges first at f0 = ...')."""
    if message.startswith("diverges first at "):
        return message[len("diverges first at "):].split()[0]
    return message.split(":")[0]


def format_table(rows) -> str:
    """The kill table: how many forward cases kill each mutant in float32 / float64 (a policy
    mutant: not run there, it has no meaning there), and the smallest dtype that kills it (none: it
    survived every dtype). The field mutants have a table of their own (format_field_table)."""
    lines = ["| mutant | breaks | cases killing it (float32 / float64) | smallest dtype killing | first divergence |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["ignores"]:
            continue
        full = "not run (half dtypes only)" if r["policy"] else f"{r['killed_float32']} / {r['killed_float64']} of {r['cases']}"
        smallest = "none: survived" if r["smallest_dtype"] == "-" else r["smallest_dtype"]
        lines.append(f"| `{r['mutant']}`: {r['bug']} | {r['target']} | {full} | {smallest} | {r['first_divergence']} |")
    return "\n".join(lines)


def format_field_table(rows) -> str:
    """The per-field kill table: for each config field a port may ignore (cases/fields.py), the
    forward cases that set it, and how many of them kill the mutant that runs it at its default."""
    lines = ["| field ignored (run at its default) | config | cases setting it | killing it (float32 / float64) | first divergence |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["ignores"]:
            lines.append(f"| `{r['ignores']}`: {r['bug'].split(': ', 1)[1]} | {r['target'].split(': ', 1)[1]} | "
                         f"{r['ran_float64']} | {r['killed_float32']} / {r['killed_float64']} | {r['first_divergence']} |")
    return "\n".join(lines)


def verdict(rows) -> str:
    """One line under the kill table: every mutant killed where it must be, or which were not."""
    alive = survivors(rows)
    policy, fields = sum(r["policy"] for r in rows), sum(bool(r["ignores"]) for r in rows)
    if not alive:
        return (f"verdict: all {len(rows)} mutants killed ({len(rows) - policy} in float32 and float64, {fields} of them a "
                f"config field ignored; {policy} policy mutants in bfloat16)")
    return (f"verdict: {len(alive)} of {len(rows)} mutants survived in float32 or float64 (a policy mutant: in "
            f"bfloat16), or errored: {', '.join(alive)}")


def survivors(rows) -> list[str]:
    """The mutants of a kill table that some precision did not kill (a policy mutant: bfloat16),
    or that errored."""
    return [r["mutant"] for r in rows if r["errors"] or (r["smallest_dtype"] != "bfloat16" if r["policy"] else
                                                          not (r["killed_float32"] and r["killed_float64"]))]

"""Policy violations: a port that runs in float16 or bfloat16 but computes in the storage dtype S
something the mixed-precision policy (ode_ref.precision) computes in float32. Each is a stage
override over the policy's mixin, MixedPrecision, so it runs only in a half dtype (in float32 and
float64 it has no meaning: every to_storage is the identity there). Each models what a port gets
by leaving one .float() out: every intermediate of that stage rounded to S, and a sum a kernel
keeps in S accumulated in S (a running total, rounded after every addition: the mass a long sum
loses in S).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import ode_ref as R
from ode_ref import norms as N
from ode_ref import rk as RK
from ode_ref.precision import MixedPrecision
from ode_ref.multistep import multistep, solver_of
from ode_ref.tableaus import TABLEAUS

# each storage dtype's most negative finite value, the mask fill a port computing in S uses
_STORAGE_MIN = {"float16": float(np.finfo(np.float16).min), "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)}


def storage_sum(terms, to_storage, axis: int = -1):
    """The sum over axis (kept, length 1) of terms as a running total held in S: each partial sum
    rounded by to_storage, in index order."""
    terms = np.moveaxis(terms, axis, -1)
    total = np.zeros_like(terms[..., 0])
    for j in range(terms.shape[-1]):
        total = to_storage(total + terms[..., j])
    return np.expand_dims(total, axis)


class SoftmaxInStorage(MixedPrecision, R.SelfAttention):
    """The scores, the mask fill, the softmax and the weighted sum of v computed in S."""

    def attn(self, q, k, v, mask, bias=None):
        r = self.to_storage
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        s = r((q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale))
        if bias is not None:
            s = r(s + bias)
        s = np.where(mask, s, _STORAGE_MIN[self.storage])
        e = r(np.exp(r(s - s.max(axis=-1, keepdims=True))))
        a = r(e / storage_sum(e, r))
        y = storage_sum(r(a[..., None] * v[:, :, None]), r, axis=-2)[..., 0, :]  # sum over seq_k of a_ij v_j
        return r(y.transpose(0, 2, 1, 3))


class NormStatisticsInStorage(MixedPrecision, R.SelfAttention):
    """The norm's input and its statistics (mean, variance, mean square, std) in S, their sums
    over d_model accumulated in S, no pow2 scale; derf, which has none, on its input in S."""

    def norm(self, norm_params: dict, z):
        r, kind, x, p = self.to_storage, self.config.norm_type, self.to_storage(z), norm_params
        n = x.shape[-1]
        if kind in ("layer_norm", "dynamic_tanh"):
            c = r(x - r(storage_sum(x, r) / n))
            squares = storage_sum(r(c * c), r)
            if kind == "layer_norm":
                return r(r(c / r(np.sqrt(r(r(squares / n) + N.LAYER_NORM_EPS)))) * p["weight"] + p["bias"])
            std = r(np.sqrt(r(squares / (n - 1))))
            return r(np.tanh(r(c / r(std + N.DYT_EPS)) * p["alpha"] + p["beta"]))
        if kind in ("rms_norm", "prms_norm", "flash_norm"):
            stat = x[..., :N.prms_channels(n)] if kind == "prms_norm" else x
            mean_square = r(storage_sum(r(stat * stat), r) / stat.shape[-1])
            return r(r(x / r(np.sqrt(r(mean_square + N.RMS_EPS)))) * p.get("weight", 1.0))
        return super().norm(norm_params, x)


class StateInStorage(MixedPrecision, R.SelfAttention):
    """The RK state z and every stage sum z_0 + h sum_j a_ij k_j held in S: each rounded."""

    def integrate(self, prepared, x, kv=None, *, checkpoint=None, trajectory: bool = True) -> list:
        cfg, r = self.config, self.to_storage
        f = lambda t, z: self.evaluate(prepared, t, r(z), kv)  # noqa: E731 (a stage sum rounded as f reads it)
        states, past = [r(x)], ()
        for n, t0 in enumerate(RK.step_times(cfg.ode_steps)):
            if cfg.ode_solver in TABLEAUS:
                states.append(r(RK.rk_step(f, t0, 1.0 / cfg.ode_steps, states[-1], TABLEAUS[cfg.ode_solver],
                                           self.solution_gate(prepared))))
            else:  # a multistep solver's state and past evaluations (or speed) each rounded
                y, past = multistep(f, t0, 1.0 / cfg.ode_steps, states[-1], solver_of(cfg), past, n)
                states.append(r(y))
                past = tuple(r(p) for p in past)
        return states if trajectory else states[-1:]


class ProjectionSumsInStorage(MixedPrecision, R.SelfAttention):
    """Every matrix product of the projections (q, k, v and the output) accumulated in S; BitLinear's
    products, sums of integer levels, are left as they are."""

    def _linear(self, x, w):
        if self.config.use_bitnet:
            return super()._linear(x, w)
        r = self.to_storage
        return storage_sum(r(x[..., None, :] * w), r)[..., 0]  # (..., out, in) products, summed over in

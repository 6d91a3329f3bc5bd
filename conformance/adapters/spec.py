"""The spec itself as a backend: ode_ref run on each case, in float64 and, on request, under the
half-precision policy."""

from __future__ import annotations

from typing import Optional

import numpy as np

import ode_ref as R
from ode_ref.precision import HALF_DTYPES, half_attention, half_block, half_func, round_to

from ..cases import run_decode
from ..cases.half import numpy_dtype
from ..cases.stages import spec_stages


class SpecAdapter:
    """ode_ref itself; against the frozen files it catches drift in the spec.

    In float16 and bfloat16 it runs the spec under the mixed-precision policy
    (ode_ref.precision: half_block, half_func, and prefill / decode_step with half_attention),
    taking and returning arrays of that dtype. Those rows are not in its default dtypes: the half
    goldens are this very run, so the spec against them is exact by construction. The mutation
    battery (mutants.py) runs them, where a mutant's stage runs under the policy."""

    name = "spec"
    dtypes = ("float64",)

    def supports(self, config, dtype) -> Optional[str]:
        if dtype in HALF_DTYPES and isinstance(config, R.ODEEncoderConfig):
            return "the half-precision policy (ode_ref.precision) covers the ODE attention block, not the ODE Transformer encoder"
        if dtype in HALF_DTYPES and isinstance(config, R.LMConfig):
            return "the half-precision policy (ode_ref.precision) covers the ODE attention block, not the language model"
        return None

    variant: Optional[type] = None  # a variant of the spec's SelfAttention (ode_ref.variants) whose stages run; None: the spec's own

    def _attention(self, config):
        return None if self.variant is None else self.variant(config)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_block(params, x, config, padding_mask, dtype=dtype, attention=self._attention(config),
                                      return_trajectory=True)[1], dtype)
        return R.ode_block(params, x, config, padding_mask, attention=self._attention(config), return_trajectory=True)[1]

    def run_block(self, config, params, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_block(params, x, config, padding_mask, dtype=dtype, attention=self._attention(config)), dtype)
        return R.ode_block(params, x, config, padding_mask, attention=self._attention(config))

    def run_func(self, config, params, t, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_func(params, t, x, config, padding_mask, dtype=dtype, attention=self._attention(config)), dtype)
        return R.ode_func(params, t, x, config, padding_mask, attention=self._attention(config))

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        if dtype in HALF_DTYPES:  # the prefill's and each token's z(1) rounded to dtype: no z is fed back
            params, x = _float32_of(params, x)
            attention = half_attention(config, dtype, self._attention(config))
            return _stored(round_to(run_decode(config, params, x, padding_mask, prompt, attention=attention), dtype), dtype)
        return run_decode(config, params, x, padding_mask, prompt, attention=self._attention(config))

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        if dtype in HALF_DTYPES:
            raise ValueError(f"dtype: the backward pass runs in float32 or float64; got {dtype!r} (the half-precision "
                             "policy is the forward pass's)")
        return R.ode_block_vjp(params, x, config, z1_bar, padding_mask)

    def run_encoder(self, config, params, x, padding_mask, dtype):
        """The ODE Transformer's encoder stack (ode_ref.ode_encoder; encoder_cases.py)."""
        return R.ode_encoder(params, x, config, padding_mask)

    def run_lm(self, config, params, ids, attention_mask, dtype):
        """The language model's logits (ode_ref.lm_logits; lm_cases.py), in dtype."""
        return R.lm_logits(params, ids, config, attention_mask, dtype=numpy_dtype(dtype))

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (cases/stages.py), through this adapter's attention."""
        return spec_stages(config, params, x, padding_mask, self.variant or R.SelfAttention)


def _float32_of(params: dict, x):
    """(params, x) of a half dtype as float32 arrays holding the same values (exact)."""
    return {k: np.asarray(v, np.float32) for k, v in params.items()}, np.asarray(x, np.float32)


def _stored(a, dtype: str):
    """a (float32 holding dtype values) as an array of dtype: NumPy float16 or ml_dtypes.bfloat16."""
    return np.asarray(a, np.float32).astype(numpy_dtype(dtype))

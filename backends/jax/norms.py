"""The six pre-norms in JAX: the spec's formulas (ode_ref.norms.Norms) over jax.numpy, with the
spec's names; this file writes again only what JAX does otherwise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import erf

from ode_ref import norms as spec
from ode_ref.norms import norm_table, prms_channels  # noqa: F401  (the spec's names, mirrored)


class Norms(spec.Norms):
    """The spec's norms over jax.numpy."""

    xp = jnp

    def pow2_scale(self, x):
        """The spec's s, bit for bit, from the exponent bits of max|x|: 2^clip(e, 0, top), e the
        unbiased exponent (a subnormal's or 0's: s = 1; Inf's or NaN's: s = 1, as frexp gives 0 for
        them). frexp and ldexp would be a third of a block's traced operations, and XLA's exp2 is
        not exact at integers. Under stop_gradient: s is piecewise constant, its derivative zero."""
        m = jax.lax.stop_gradient(jnp.abs(x).max(axis=-1, keepdims=True))
        info, uint = jnp.finfo(m.dtype), jnp.dtype(f"uint{8 * m.dtype.itemsize}")
        bias, ones = info.maxexp - 1, 2 * info.maxexp - 1  # ones: the exponent field of Inf and NaN
        # the sign bit dropped: XLA's max may give -Inf for a row of NaN, whose frexp exponent is 0 too
        biased = (jax.lax.bitcast_convert_type(m, uint) >> info.nmant) & ones
        e = jnp.where(biased == ones, 0, biased.astype(jnp.int32) - bias)
        return jax.lax.bitcast_convert_type((jnp.clip(e, 0, info.maxexp - 2) + bias).astype(uint) << info.nmant, m.dtype)

    def erf(self, x):
        """jax.scipy's erf (the spec's calls libm's per element, outside any trace)."""
        return erf(x)


JAX_NORMS = Norms()
pow2_scale, layer_norm, rms_norm, prms_norm, flash_norm, dynamic_tanh, derf = JAX_NORMS.functions()
NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)

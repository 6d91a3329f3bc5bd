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
        """The spec's s from the exponent bits of max|x|: 2^clip(e, 0, top), e the unbiased exponent
        (0's and a subnormal's: s = 1; Inf's and NaN's: s = 1, frexp giving them the exponent 0),
        bit for bit the spec's for the max XLA computes (on CPU it may pass over a NaN beside finite
        values, where the spec's max is NaN: s differs, the token's statistics are NaN either way).
        The spec's frexp and ldexp trace into half again as many operations in a forward program,
        and XLA's exp2 is not exact at every integer. x under stop_gradient: s is piecewise constant."""
        m = jnp.abs(jax.lax.stop_gradient(x)).max(axis=-1, keepdims=True)
        info, uint = jnp.finfo(m.dtype), jnp.dtype(f"uint{8 * m.dtype.itemsize}")
        bias = info.maxexp - 1
        ones = 2 * info.maxexp - 1  # the exponent field of Inf and NaN
        top = info.maxexp - 2  # s <= 2^126 in float32: 1 / s stays a normal number
        # the sign bit masked off: XLA's max may give -Inf for a row of NaN (frexp's exponent 0, as for NaN)
        biased = (jax.lax.bitcast_convert_type(m, uint) >> info.nmant) & ones
        e = jnp.where(biased == ones, 0, biased.astype(jnp.int32) - bias)
        return jax.lax.bitcast_convert_type((jnp.clip(e, 0, top) + bias).astype(uint) << info.nmant, m.dtype)

    def erf(self, x):
        """jax.scipy's erf (the spec's calls libm's per element, outside any trace)."""
        return erf(x)


JAX_NORMS = Norms()
pow2_scale, layer_norm, rms_norm, prms_norm, flash_norm, dynamic_tanh, derf = JAX_NORMS.functions()
NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)

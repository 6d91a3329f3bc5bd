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
        """The spec's, on x under stop_gradient: frexp has no derivative, and s is piecewise
        constant in x, so its derivative is zero anyway."""
        return super().pow2_scale(jax.lax.stop_gradient(x))

    def erf(self, x):
        """jax.scipy's erf (the spec's calls libm's per element, outside any trace)."""
        return erf(x)


JAX_NORMS = Norms()
pow2_scale, layer_norm, rms_norm, prms_norm, flash_norm, dynamic_tanh, derf = JAX_NORMS.functions()
NORMS = norm_table(globals())


def apply_norm(norm_type: str, norm_params: dict, x):
    return NORMS[norm_type](x, **norm_params)

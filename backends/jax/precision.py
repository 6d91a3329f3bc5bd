"""The half-precision policy in JAX; port of ode_ref/precision.py.

An input x in float16 or bfloat16 (S) runs the block under the spec's policy: the spec's
MixedPrecision mixin over this port's SelfAttention (or a variant of it), computing in float32
arrays between the rounding points, with to_storage(a) = a.astype(S).astype(float32) (round to
nearest even, ode_ref.round_to's values). The parameters, whatever their float dtype, are rounded
to S where the policy says (weights); z(1) (and each state of a trajectory) is returned in S, and
a KVCache holds k and v in S. The choice is made from x's dtype while tracing, so under jit a half
input is one more compilation of its own and the float32 and float64 ones are unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp

from ode_ref.config import dtype_name
from ode_ref.precision import HALF_DTYPES, MixedPrecision, policy_view

COMPUTE = jnp.float32  # what the policy computes in between its rounding points


class JaxMixedPrecision(MixedPrecision):
    """The spec's policy over this port's stages; storage_dtype is the jnp dtype of storage."""

    storage_dtype = jnp.bfloat16

    def to_storage(self, a):
        return a.astype(self.storage_dtype).astype(COMPUTE)


def under_policy(attention, x):
    """(attention, x) for a float32 or float64 x; for a float16 or bfloat16 one, (a view of attention
    under the policy in x's dtype (policy_view), x in float32, exactly)."""
    name = dtype_name(x.dtype)
    if name not in HALF_DTYPES:
        return attention, x
    return policy_view(attention, JaxMixedPrecision, name, storage_dtype=x.dtype), x.astype(COMPUTE)


def in_storage(dtype, *arrays):
    """Each array (a tuple of arrays too) in dtype: the policy's outputs (float32 holding S values)
    back in S; for a float32 or float64 run, the arrays as they are."""
    return tuple(tuple(a.astype(dtype) for a in x) if isinstance(x, tuple) else x.astype(dtype) for x in arrays)

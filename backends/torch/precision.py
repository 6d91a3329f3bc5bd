"""The half-precision policy in PyTorch; port of ode_ref/precision.py.

A block whose parameters are float16 or bfloat16 (block.to(torch.bfloat16), or
ODEAttentionBlock.from_params(..., dtype=torch.float16)) runs under the spec's policy: its module
stores the parameters in that dtype S, and each call computes in float32 tensors between the
policy's rounding points, through the spec's MixedPrecision mixin over this port's SelfAttention
(or a variant of it), with to_storage(a) = a.to(S).to(float32), the same round to nearest even as
ode_ref.round_to. The state z, the stage sums and the gate are float32; z(1) is returned in S, and
a KVCache holds k and v in S. float32 and float64 modules run as they always did (under_policy
returns the module itself).
"""

from __future__ import annotations

import torch

from ode_ref.precision import HALF_DTYPES, MixedPrecision, policy_view

HALF = {getattr(torch, d): d for d in HALF_DTYPES}  # the storage dtypes, by spec name
COMPUTE = torch.float32  # what the policy computes in between its rounding points


class TorchMixedPrecision(MixedPrecision):
    """The spec's policy over this port's stages; storage_dtype is the torch dtype of storage."""

    storage_dtype: torch.dtype = torch.bfloat16

    def to_storage(self, a):
        return a.to(self.storage_dtype).to(COMPUTE)

    def gate_weights(self, params, x):
        """None when f is evaluated alone (the gate is the block's; attention.gate_weights)."""
        return None if params is None else super().gate_weights(params, x)

    def norm(self, norm_params: dict, z):
        """The mixin's rounding of the norm stage, which this port writes as the submodule `norm`
        (the seed's name): the mixin's method hides its attribute, so the module is read by key."""
        return self.to_storage(self._modules["norm"](norm_params, z))


def storage_of(attention) -> torch.dtype | None:
    """The module's storage dtype when it is float16 or bfloat16 (its parameters'), else None."""
    dtype = attention.qkv.weight.dtype
    return dtype if dtype in HALF else None


def under_policy(attention):
    """attention itself for a float32 or float64 module; for a float16 or bfloat16 one, a view of
    it under the policy (policy_view: the same parameters, so gradients reach the module's)."""
    dtype = storage_of(attention)
    if dtype is None:
        return attention
    return policy_view(attention, TorchMixedPrecision, HALF[dtype], storage_dtype=dtype)


def to_compute(a, attention):
    """a (a tensor in the module's dtype) as the policy computes it: float32 for a half module,
    itself otherwise (a value in S is exact in float32)."""
    return a if storage_of(attention) is None else a.to(COMPUTE)


def cache_in(cache, dtype: torch.dtype):
    """cache (a KVCache) with its k and v in dtype: S at rest, float32 while a step computes."""
    return cache._replace(k=tuple(a.to(dtype) for a in cache.k), v=tuple(a.to(dtype) for a in cache.v))

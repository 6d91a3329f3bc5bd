"""The torch port's array namespace (its SelfAttention's self.xp): torch under the NumPy names that
the spec's shared stages (ode_ref/attention.py, positions.py, norms.py, encoder_layer.py) and the
variants (variants.py) call.

torch already takes NumPy's axis= and keepdims= (sum, mean, stack, concatenate), so most names
are torch's own function. Written here: what torch names otherwise (astype, permute_dims, cumsum's
axis, maximum with a number) and what creates an array, which is made on the module's device (a namespace per device)."""

from __future__ import annotations

import math

import torch


class Namespace:
    """NumPy's names over torch, creating arrays on `device`."""

    # the same call in torch and NumPy
    abs, exp, log, sqrt, tanh, where, logaddexp, isfinite = (staticmethod(f) for f in (
        torch.abs, torch.exp, torch.log, torch.sqrt, torch.tanh, torch.where, torch.logaddexp, torch.isfinite))
    sum, mean, stack, concatenate, broadcast_to, reshape, tril, finfo, swapaxes = (staticmethod(f) for f in (
        torch.sum, torch.mean, torch.stack, torch.concatenate, torch.broadcast_to, torch.reshape, torch.tril, torch.finfo,
        torch.swapaxes))
    inf = math.inf

    def __init__(self, device):
        self.device = device

    @staticmethod
    def astype(a, dtype):
        return a.to(dtype)

    @staticmethod
    def permute_dims(a, axes):
        return a.permute(axes)

    @staticmethod
    def maximum(a, b):
        """torch.maximum takes two tensors; a Python number b (the norms' smallest normal) clamps."""
        return torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, min=b)

    @staticmethod
    def cumsum(a, axis):
        return torch.cumsum(a, dim=axis)

    def asarray(self, value, dtype=None):
        return torch.as_tensor(value, dtype=dtype, device=self.device)

    def arange(self, n):
        return torch.arange(n, device=self.device)

    def ones(self, shape, dtype=None):
        return torch.ones(shape, dtype=dtype, device=self.device)

    def full(self, shape, fill_value):
        return torch.full(shape, fill_value, device=self.device)


_NAMESPACES: dict = {}  # a plain dict, not functools.lru_cache: torch.compile traces a dict's lookup as it is


def namespace(device: torch.device) -> Namespace:
    """The namespace of a device (one object per device)."""
    if device not in _NAMESPACES:
        _NAMESPACES[device] = Namespace(device)
    return _NAMESPACES[device]

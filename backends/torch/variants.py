"""The spec's variants in PyTorch: each ode_ref/variants.py class rebuilt over this port's
SelfAttention by ode_ref.variants.port_variant, under the same name. A user's variant of the spec's
SelfAttention ports the same way: port_variant(MyVariant, SelfAttention)."""

from __future__ import annotations

from ode_ref.variants import VARIANTS, port_variant

from .attention import SelfAttention

globals().update({v.__name__: port_variant(v, SelfAttention, __name__) for v in VARIANTS})
__all__ = [v.__name__ for v in VARIANTS]

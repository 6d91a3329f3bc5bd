"""The staged attention API's seven example variants (eight classes: LocalWindow came first) as
Flax modules. Each is the spec's class of the same name (ode_ref/variants.py), ported over the JAX
port by port_variant (the JAX package's own, odeattn.backends.jax.LocalWindowAttention and the
rest): the Flax SelfAttention whose stages are that class's, with the settings of its __init__ as
module fields (checked by the spec's own checks).
A user's variant of the spec's SelfAttention becomes a module the same way: flax_variant(
port_variant(MyVariant, odeattn.backends.jax.SelfAttention)).
"""

from __future__ import annotations

import inspect

from ode_ref.variants import VARIANTS

from .. import jax as ported
from .attention import SelfAttention


def flax_variant(stages: type) -> type:
    """A Flax SelfAttention whose stages are `stages` (a variant of the JAX port's SelfAttention):
    the keywords of its __init__ after config become fields with the same defaults."""
    settings = [p for p in inspect.signature(stages.__init__).parameters.values() if p.name not in ("self", "config")]
    namespace = {"__annotations__": {p.name: type(p.default) for p in settings}, **{p.name: p.default for p in settings},
                 "stages": stages, "settings": tuple(p.name for p in settings), "__module__": __name__,
                 "__doc__": stages.__doc__}
    return type(stages.__name__, (SelfAttention,), namespace)


globals().update({v.__name__: flax_variant(getattr(ported, v.__name__)) for v in VARIANTS})
__all__ = [v.__name__ for v in VARIANTS]

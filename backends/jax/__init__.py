"""JAX port of ode_ref: pure functions over a dict pytree of parameters with the spec's names.
Importing it changes no global JAX setting (x64 stays as the user set it)."""

from .attention import SelfAttention as SelfAttention
from .block import decode_step as decode_step, ode_block as ode_block, ode_block_jit as ode_block_jit
from .encoder import ode_encoder as ode_encoder
from .block import ode_func as ode_func, prefill as prefill
from ode_ref.variants import port_variants as _port_variants

globals().update(_port_variants(SelfAttention, __name__))  # the spec's example variants, ported, by name

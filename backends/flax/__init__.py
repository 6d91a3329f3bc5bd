"""Flax port: the staged attention API's SelfAttention and the ODE attention block as flax.linen
Modules, a face over the JAX port (odeattn.backends.jax), with the API's stage names and
signatures, Q/K/V in [batch, seq, heads, head_dim], a mutable 'cache' for decoding and a
`dropout` rng. Importing it changes no global JAX setting."""

from .attention import SelfAttention as SelfAttention
from .block import ODEAttentionBlock as ODEAttentionBlock
from .encoder import ODEEncoder as ODEEncoder
from .block import from_state_dict as from_state_dict, jit_decode as jit_decode, to_state_dict as to_state_dict
from .variants import *  # noqa: F403  (the spec's variants, in the API's style: variants.__all__)

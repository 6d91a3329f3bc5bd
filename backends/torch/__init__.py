"""PyTorch port of ode_ref: the seed's ODEFunc and ODEAttentionBlock, drop-in."""

from .attention import ODEFunc as ODEFunc, SelfAttention as SelfAttention
from .block import ODEAttentionBlock as ODEAttentionBlock
from .encoder import ODEEncoder as ODEEncoder, ODEEncoderLayer as ODEEncoderLayer
from .encoder import load_encoder_params as load_encoder_params
from .gemm import use_gemm as use_gemm
from .lm import ODELanguageModel as ODELanguageModel, lm_params_from_state_dict as lm_params_from_state_dict
from .params import load_params as load_params, params_to_state_dict as params_to_state_dict
from .params import state_dict_to_params as state_dict_to_params
from ode_ref.variants import port_variants as _port_variants

globals().update(_port_variants(SelfAttention, __name__))  # the spec's example variants, ported, by name

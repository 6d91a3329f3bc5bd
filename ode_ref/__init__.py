"""ode_ref: the NumPy specification of ODE attention. Its outputs are the golden truth."""

from .attention import Prepared as Prepared, SelfAttention as SelfAttention
from .attention import causal_mask as causal_mask, softmax as softmax
from .bitlinear import quantize_activation as quantize_activation
from .bitlinear import quantize_weight as quantize_weight, ternarize_weight as ternarize_weight
from .backward import ode_block_vjp as ode_block_vjp
from .block import check_input as check_input, ode_block as ode_block, ode_func as ode_func
from .block import decode_step as decode_step, prefill as prefill
from .cache import KVCache as KVCache
from .config import ENCODINGS as ENCODINGS, MAX_STEPS as MAX_STEPS, MODES as MODES, SOLVERS as SOLVERS, ODEConfig as ODEConfig
from .norms import NORM_PARAMS as NORM_PARAMS, NORM_TYPES as NORM_TYPES, apply_norm as apply_norm
from .params import check_params as check_params, init_params as init_params
from .precision import HALF_DTYPES as HALF_DTYPES, half_block as half_block, half_func as half_func, round_to as round_to
from .params import load_params as load_params, param_shapes as param_shapes, save_params as save_params
from .rk import integrate as integrate, rk_step as rk_step
from .tableaus import TABLEAUS as TABLEAUS, ButcherTableau as ButcherTableau
from .variants import VARIANTS as VARIANTS, port_variant as port_variant
from .variants import CoolerAttention as CoolerAttention, DropFirstHeadAttention as DropFirstHeadAttention
from .variants import LocalWindowAttention as LocalWindowAttention, RecentKeysAttention as RecentKeysAttention
from .variants import ScaledOutputAttention as ScaledOutputAttention, ScaledQueryAttention as ScaledQueryAttention
from .variants import TiedKeysAttention as TiedKeysAttention, UnitNormQKAttention as UnitNormQKAttention
from .encoder import ode_encoder as ode_encoder
from .encoder_backward import ode_encoder_vjp as ode_encoder_vjp
from .encoder_config import FAMILIES as FAMILIES, PROFILES as PROFILES, ODEEncoderConfig as ODEEncoderConfig
from .encoder_config import CORRECTOR as CORRECTOR, EMA_FAMILIES as EMA_FAMILIES
from .encoder_params import check_encoder_params as check_encoder_params, encoder_param_shapes as encoder_param_shapes
from .encoder_params import init_encoder_params as init_encoder_params
from .lm import LMConfig as LMConfig, init_lm_params as init_lm_params, lm_greedy as lm_greedy
from .lm import lm_logits as lm_logits, lm_param_shapes as lm_param_shapes

__version__ = "0.1.0"

"""The ODE Transformer's encoder stack as a flax.linen Module, over the JAX port's ode_encoder.

    encoder = ODEEncoder(config=cfg)
    variables = encoder.init(key, x)                      # or from_state_dict(cfg, params)
    z = encoder.apply(variables, x, padding_mask=m)       # evaluation, the spec
    z = encoder.apply(variables, x, padding_mask=m, deterministic=False, rngs={"dropout": key})

variables['params'] holds one leaf per released state_dict key ('layers.0.self_attn.in_proj_weight',
..., ode_ref/encoder_params.py), in the released layout (a weight is (out, in), not a Dense
kernel), so from_state_dict and to_state_dict only check and copy. Their init is the released
one: weight matrices Xavier-uniform, biases 0, the LayerNorms 1 and 0, alpha 1 (an ema family's
1/2), the corrector's weights their row means, a time-dependent stack's f_weight and f_bias 0 and
f_b 1e-4 N(0, 1) (its other matrices Xavier-uniform, where qkvflow draws haliax's normal init). The forward,
its checks and its dropout (a key of its own at every call, so every stage evaluation draws its
own masks) are the JAX port's.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.block import check_flag
from ode_ref.encoder_config import ODEEncoderConfig
from ode_ref.encoder_params import (ALPHA, HISTORY_WEIGHT, HISTORY_WEIGHT_C, alpha_init, check_encoder_params,
                                    encoder_param_shapes, lower_mean, temporal_init)

from ..jax import block as jax_block
from ..jax import encoder as jax_encoder
from .attention import dropout_rng


def _init(name: str, shape: tuple, cfg: ODEEncoderConfig):
    """The released init of a parameter by its name and shape (init_encoder_params')."""
    if name in (HISTORY_WEIGHT, HISTORY_WEIGHT_C):
        return lambda key, shape, dtype: jnp.asarray(lower_mean(shape[0]), dtype)  # row means: no draw
    if name == ALPHA:
        return nn.initializers.constant(alpha_init(cfg))
    if temporal_init(name):  # a time-dependent stack's f_weight, f_bias, f_b
        return nn.initializers.zeros if temporal_init(name) == "zeros" else nn.initializers.normal(1e-4)
    if len(shape) == 2:
        return nn.initializers.xavier_uniform()
    return nn.initializers.ones if name.endswith("weight") else nn.initializers.zeros


class ODEEncoder(nn.Module):
    config: Any  # an ODEEncoderConfig (or what ODEEncoderConfig.from_any takes: a dict)
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, padding_mask=None, *, deterministic: bool = True):
        """x (batch, seq, C) -> (batch, seq, C); padding_mask (batch, seq) bool, True = real token."""
        cfg = ODEEncoderConfig.from_any(self.config)
        check_flag("deterministic", deterministic)
        if not self.is_initializing():  # the spec's error for params of another config, not Flax's
            check_encoder_params(dict(self.variables.get("params", {})), cfg)
        params = {name: self.param(name, _init(name, shape, cfg), shape, self.param_dtype)
                  for name, shape in encoder_param_shapes(cfg).items()}
        rng = dropout_rng(self, deterministic, max(cfg.dropout, cfg.attention_dropout, cfg.activation_dropout))
        return jax_encoder.ode_encoder(params, x, cfg, padding_mask, dropout_rng=rng)


def from_state_dict(config, params) -> dict:
    """The variables for ODEEncoder.apply from params under the released keys (NumPy or JAX
    arrays), after the spec's check against config."""
    check_encoder_params(params, config)
    return {"params": {k: v if isinstance(v, jax.Array) else jax_block._as_jax(np.asarray(v), f"params[{k!r}]")
                       for k, v in params.items()}}


def to_state_dict(variables) -> dict:
    """The parameters of variables (or of variables['params']) under the released keys."""
    return dict(variables.get("params", variables))

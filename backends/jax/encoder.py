"""The ODE Transformer's encoder in JAX; port of ode_ref/encoder.py.

    ode_encoder(params, x, config, padding_mask=None, *, dropout_rng=None)   (batch, seq, C) -> the same

params is a dict pytree with the released state_dict keys (ode_ref/encoder_params.py). The block,
the stack, the layer's orchestration and its primitives are the spec's (ode_ref.encoder
.ODEEncoderStages) over jax.numpy, but those JaxEncoderStages writes again. ode_encoder checks its
inputs where they are Python values (a traced padding mask's values cannot be: its shape is
checked, not its all-padded rows), then runs one jitted function, the config static.

dropout_rng: None (evaluation, the spec), or a key: training, each dropout drawing from its own
key, folded in by call order, so every stage evaluation of a block draws its own masks, as released.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ode_ref.encoder import ODEEncoderStages, check_encoder_input
from ode_ref.encoder_config import ODEEncoderConfig
from ode_ref.encoder_params import check_encoder_params

from .block import _as_jax, _float_dtypes
from .norms import layer_norm


class JaxEncoderStages(ODEEncoderStages):
    """The spec's stages over jax.numpy; written again: what JAX computes otherwise (its norms,
    softmax, relu and sigmoid, dropout drawn from a key)."""

    xp = jnp

    def __init__(self, config, dropout_rng=None):
        super().__init__(config)
        self.dropout_rng, self.draws = dropout_rng, 0

    def layer_norm(self, x, weight, bias):
        return layer_norm(x, weight, bias)

    def softmax(self, scores):
        return jax.nn.softmax(scores, axis=-1)

    def relu(self, x):
        return jax.nn.relu(x)  # its derivative at 0 is 0 (jnp.maximum's splits it in halves)

    def dropout(self, x, p: float):
        if self.dropout_rng is None or p == 0.0:
            return x
        self.draws += 1
        keep = jax.random.bernoulli(jax.random.fold_in(self.dropout_rng, self.draws), 1.0 - p, x.shape)
        return jnp.where(keep, x / (1.0 - p), jnp.zeros((), x.dtype))

    def sigmoid(self, x):
        return jax.nn.sigmoid(x)


@functools.partial(jax.jit, static_argnames=("config",))
def _encoder(params, x, padding_mask, dropout_rng, config):
    params = {k: jnp.asarray(v, x.dtype) for k, v in params.items()}
    return JaxEncoderStages(config, dropout_rng).encoder(params, x, padding_mask)



def ode_encoder(params, x, config, padding_mask=None, *, dropout_rng=None):
    """The encoder stack on x (batch, seq, C); padding_mask (batch, seq) bool, True = real token."""
    cfg = ODEEncoderConfig.from_any(config)
    check_encoder_params(params, cfg)
    x = _as_jax(x, "x", _float_dtypes())
    padding_mask = None if padding_mask is None else _as_jax(padding_mask, "padding_mask")
    check_encoder_input(x, cfg, padding_mask, concrete=not isinstance(padding_mask, jax.core.Tracer),
                        array_type=jax.Array, float_dtypes=_float_dtypes(), bool_dtype=jnp.bool_)
    return _encoder(params, x, padding_mask, dropout_rng, cfg)

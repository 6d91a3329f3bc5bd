"""The ODE Transformer's encoder: RK blocks whose F is a whole encoder layer, stacked.

    ode_encoder(params, x, config, padding_mask=None)   (batch, seq, C) -> (batch, seq, C)

A block takes one layer L (encoder_layer.py), evaluated once per stage with the same weights, and
steps once with step size 1. The stage values k_i are, by the config's profile,

    paper     k_i = F(Y_i) = L(Y_i) - Y_i        (the paper's F: the layer without its input)
    released  k_i = L(Y_i)                        (the released code's: the layer's output)

with the stage inputs Y_i = y + sum_j a_ij k_j of the family's tableau, and the block's output
y + sum_i w_i k_i:

    family        tableau (tableaus.py)                       w
    euler         EULER                                        (1)
    rk2           HEUN                                         (1/2, 1/2)
    rk3           RK3_KUTTA (paper), RK3_RELEASED (released)   (1/6, 2/3, 1/6)
    rk4           RK4_CLASSIC                                  (1/6, 1/3, 1/3, 1/6)
    rk2_gated     RK2_GATED (Heun's stages)                    (g, 1 - g), g = sigmoid(gate_linear([k_1; k_2])) per token
    rk2_weighted  HEUN's stages                                (alpha[0], alpha[1]), learnt

So under "released" every stage and the output carry y again: its RK2 is y + (L(y) + L(y + L(y))) / 2,
its RK3's third stage input is y + k_2 (the released line y - k_2 + 2 k_2, which means y - k_1 + 2 k_2).
The arithmetic is rk.py's: y + (1.0 * w_i) * k_i in index order; the released code's (L1 + L2) / 2
and y - L2 + 2 L2 give the same values up to rounding. After the blocks, pre-norm applies the
final layer_norm. The stack's gate_linear and alpha are shared by every block, as released.
"""

from __future__ import annotations

import numpy as np

from .attention import sigmoid
from .block import check_input
from .encoder_config import ODEEncoderConfig
from .encoder_layer import EncoderStages
from .encoder_params import ALPHA, FINAL_NORM, GATE_BIAS, GATE_WEIGHT, check_encoder_params, layer_prefix
from .rk import _combine
from .tableaus import EULER, HEUN, RK2_GATED, RK3_KUTTA, RK3_RELEASED, RK4_CLASSIC, ButcherTableau

FAMILY_TABLEAUS = {"euler": EULER, "rk2": HEUN, "rk3": RK3_KUTTA, "rk4": RK4_CLASSIC,
                   "rk2_gated": RK2_GATED, "rk2_weighted": HEUN}


def block_tableau(config) -> ButcherTableau:
    """The tableau of the config's family under its profile (only rk3 differs between them)."""
    cfg = ODEEncoderConfig.from_any(config)
    if cfg.family == "rk3" and cfg.profile == "released":
        return RK3_RELEASED
    return FAMILY_TABLEAUS[cfg.family]


class ODEEncoderStages(EncoderStages):
    """The block and the stack over the layer, written once; a port supplies sigmoid and concat."""

    def stage(self, params: dict, prefix: str, key_mask):
        """k(Y): the profile's stage value of the layer under prefix."""
        layer = lambda z: self.layer(params, prefix, z, key_mask)  # noqa: E731
        if self.config.profile == "released":
            return layer
        return lambda z: layer(z) - z

    def stage_weights(self, params: dict, ks: list):
        """The learnt weights (w_1, w_2) of rk2_gated ((g, 1 - g), g (batch, seq, 1)) and
        rk2_weighted (alpha[0], alpha[1]); None for a family of constant weights."""
        family = self.config.family
        if family == "rk2_gated":
            g = self.sigmoid(self.linear(self.concat(ks[0], ks[1]), params[GATE_WEIGHT], params[GATE_BIAS]))
            return g, 1.0 - g
        if family == "rk2_weighted":
            return self.item(params[ALPHA], 0), self.item(params[ALPHA], 1)
        return None

    def block(self, params: dict, i: int, y, key_mask):
        """One RK block with layer i: y (batch, seq, C) -> y + sum_i w_i k_i (module docstring)."""
        stage, tableau = self.stage(params, layer_prefix(i), key_mask), block_tableau(self.config)
        ks = []
        for a_i in tableau.a:
            ks.append(stage(_combine(y, 1.0, a_i, ks)))
        weights = self.stage_weights(params, ks)
        return _combine(y, 1.0, tableau.b, ks) if weights is None else y + weights[0] * ks[0] + weights[1] * ks[1]

    def encoder(self, params: dict, x, padding_mask=None):
        """The stack: encoder_layers blocks, then the final layer_norm when pre-norm."""
        key_mask = self.key_mask(padding_mask)
        for i in range(self.config.encoder_layers):
            x = self.block(params, i, x, key_mask)
        if self.config.encoder_normalize_before:
            x = self.layer_norm(x, params[FINAL_NORM + "weight"], params[FINAL_NORM + "bias"])
        return x

    # ---- primitives of the learnt weights ----------------------------------------------------
    def sigmoid(self, x):
        return sigmoid(x)

    def concat(self, a, b):
        """[a; b] over the last axis: (batch, seq, C) twice -> (batch, seq, 2C)."""
        return self.xp.concatenate([a, b], axis=-1)


def check_encoder_input(x, config, padding_mask=None, *, concrete: bool = True, **port) -> None:
    """check_input's checks with the stack's width, and (when the mask's values are known, not
    traced: concrete) every sequence holding a real token (with every key padded a softmax row
    would be 0 / 0). port: check_input's array_type etc."""
    cfg = ODEEncoderConfig.from_any(config)
    check_input(x, {"hidden_size": cfg.encoder_embed_dim, "num_heads": 1}, padding_mask, **port)
    if padding_mask is not None and concrete and not bool(np.asarray(padding_mask).any(axis=-1).all()):
        empty = [int(b) for b in np.flatnonzero(~np.asarray(padding_mask).any(axis=-1))]
        raise ValueError(f"padding_mask: expected at least one real token (True) per sequence; sequence(s) {empty} have none")


def ode_encoder(params, x, config, padding_mask=None):
    """The encoder stack on x (batch, seq, C), float32 or float64; padding_mask (batch, seq) bool,
    True = real token, or None. Returns (batch, seq, C), padded positions included (not zeroed)."""
    cfg = ODEEncoderConfig.from_any(config)
    check_encoder_params(params, cfg)
    check_encoder_input(x, cfg, padding_mask)
    params = {k: np.asarray(v, dtype=x.dtype) for k, v in params.items()}
    return ODEEncoderStages(cfg).encoder(params, x, padding_mask)

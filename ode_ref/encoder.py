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

    rk2_ema       HEUN's stages                                (a(1-a), a), a learnt: PCformer's predictor
    rk3_ema       RK3_KUTTA (both profiles, as released)       (a(1-a)^2, a(1-a), a)
    rk4_ema       RK4_CLASSIC                                  (a(1-a)^3, a(1-a)^2, a(1-a), a)

So under "released" every stage and the output carry y again: its RK2 is y + (L(y) + L(y + L(y))) / 2,
its RK3's third stage input is y + k_2 (the released line y - k_2 + 2 k_2, which means y - k_1 + 2 k_2).
The arithmetic is rk.py's: y + (1.0 * w_i) * k_i in index order; the released code's (L1 + L2) / 2
and y - L2 + 2 L2 give the same values up to rounding. After the blocks, pre-norm applies the
final layer_norm. The stack's gate_linear and alpha are shared by every block, as released (an
ema family's alpha may be one per layer: layer_wise). An ema weight a (1-a)^m is a times m factors
(1 - a), multiplied in that order (the released code's torch.pow gives the same up to rounding).

PCformer's corrector (encoder_history_type, its NMT encoder's RKPredictorMultistepCorrectorHistory)
keeps a history h_0 = x, h_1, ... across the stack. After layer n's block gives the prediction P
(c = n + 2 entries once it is added, W = history.weight, W_c = history.weight_c):

    pre-norm    h_{n+1} = LNp_n(P)                   LNp = history.rouge_predictions_norm
                u = sum_m W[c-1, m] h_m              (m = 0 .. c-1, in order)
                h_{n+1} = LN_n(L_n(u))               the prediction's entry replaced; LN = history.layer_norms
                y = sum_m W_c[c-1, m] h_m
    post-norm   h_{n+1} = P
                y = LN_n(sum_m W_c[c-1, m] h_m)

The released post-norm code also computes u = LN_n(sum W h) and L_n(u), then discards them (its
update() does nothing after post-norm): the spec skips that dead work, so W is read pre-norm only.
The NMT code reads weight_c without defining it (its definition is commented out; only the LM code
has it): the spec takes the LM's, a parameter initialised like weight, and so needs it in a
checkpoint. Cached decoding is not specified: this is an encoder (no decoder cases).
"""

from __future__ import annotations

import numpy as np

from .block import check_input
from .encoder_config import EMA_FAMILIES, ODEEncoderConfig
from .encoder_params import (ALPHA, FINAL_NORM, GATE_BIAS, GATE_WEIGHT, HISTORY_NORM, HISTORY_WEIGHT, HISTORY_WEIGHT_C,
                             PREDICTION_NORM, check_encoder_params, layer_prefix)
from .rk import _combine
from .temporal import TemporalStages
from .tableaus import EULER, HEUN, RK2_GATED, RK3_KUTTA, RK3_RELEASED, RK4_CLASSIC, ButcherTableau

FAMILY_TABLEAUS = {"euler": EULER, "rk2": HEUN, "rk3": RK3_KUTTA, "rk4": RK4_CLASSIC,
                   "rk2_gated": RK2_GATED, "rk2_weighted": HEUN, "rk2_ema": HEUN, "rk3_ema": RK3_KUTTA, "rk4_ema": RK4_CLASSIC}


def block_tableau(config) -> ButcherTableau:
    """The tableau of the config's family under its profile (only rk3 differs between them)."""
    cfg = ODEEncoderConfig.from_any(config)
    if cfg.family == "rk3" and cfg.profile == "released":
        return RK3_RELEASED
    return FAMILY_TABLEAUS[cfg.family]


class ODEEncoderStages(TemporalStages):
    """The block and the stack over the layer (qkvflow's stack too: temporal.py), written once; a port
    overrides the primitives its framework computes otherwise (encoder_layer.py's, concat, and
    temporal.py's constant, reshape and causal_triangle)."""

    def stage(self, params: dict, prefix: str, key_mask):
        """k(Y): the profile's stage value of the layer under prefix."""
        layer = lambda z: self.layer(params, prefix, z, key_mask)  # noqa: E731
        if self.config.profile == "released":
            return layer
        return lambda z: layer(z) - z

    def stage_weights(self, params: dict, ks: list, i: int = 0):
        """The learnt weights (w_1, ...) of block i: rk2_gated's ((g, 1 - g), g (batch, seq, 1)),
        rk2_weighted's (alpha[0], alpha[1]), an ema family's (ema_weights); None for a family of
        constant weights."""
        family = self.config.family
        if family == "rk2_gated":
            g = self.sigmoid(self.linear(self.concat(ks[0], ks[1]), params[GATE_WEIGHT], params[GATE_BIAS]))
            return g, 1.0 - g
        if family == "rk2_weighted":
            return self.item(params[ALPHA], 0), self.item(params[ALPHA], 1)
        if family in EMA_FAMILIES:
            return self.ema_weights(self.item(params[ALPHA], i) if self.config.layer_wise else params[ALPHA], len(ks))
        return None

    def ema_weights(self, a, stages: int) -> list:
        """(a (1-a)^(s-1), ..., a (1-a), a) for s stages; a (1,) or (C,)."""
        q, weights = 1.0 - a, [a]
        for _ in range(stages - 1):
            weights.insert(0, weights[0] * q)
        return weights

    def block(self, params: dict, i: int, y, key_mask):
        """One RK block with layer i: y (batch, seq, C) -> y + sum_i w_i k_i (module docstring)."""
        stage, tableau = self.stage(params, layer_prefix(i), key_mask), block_tableau(self.config)
        ks = []
        for a_i in tableau.a:
            ks.append(stage(_combine(y, 1.0, a_i, ks)))
        weights = self.stage_weights(params, ks, i)
        if weights is None:
            return _combine(y, 1.0, tableau.b, ks)
        for w, k in zip(weights, ks):
            y = y + w * k
        return y

    def encoder(self, params: dict, x, padding_mask=None):
        """The stack: encoder_layers blocks (each followed by PCformer's corrector when set), then
        the final layer_norm when pre-norm; qkvflow's time-dependent stack when time_embed_dim > 0."""
        if self.config.temporal:
            return self.temporal_stack(params, x, padding_mask)
        key_mask = self.key_mask(padding_mask)
        history = [x]
        for i in range(self.config.encoder_layers):
            x = self.block(params, i, x, key_mask)
            if self.config.corrector:
                x = self.correct(params, i, x, history, key_mask)
        if self.config.encoder_normalize_before:
            x = self.layer_norm(x, params[FINAL_NORM + "weight"], params[FINAL_NORM + "bias"])
        return x

    def correct(self, params: dict, i: int, prediction, history: list, key_mask):
        """PCformer's corrector after block i (module docstring): adds the prediction to history
        (in place) and returns the block's corrected output."""
        norm = lambda name, z: self.layer_norm(z, params[f"{name}{i}.weight"], params[f"{name}{i}.bias"])  # noqa: E731
        pre = self.config.encoder_normalize_before
        history.append(norm(PREDICTION_NORM, prediction) if pre else prediction)
        if pre:
            u = self.history_sum(params[HISTORY_WEIGHT], history)
            history[-1] = norm(HISTORY_NORM, self.layer(params, layer_prefix(i), u, key_mask))
        y = self.history_sum(params[HISTORY_WEIGHT_C], history)
        return y if pre else norm(HISTORY_NORM, y)

    def history_sum(self, weight, history: list):
        """sum_m weight[c-1, m] h_m over the c entries of history, in order."""
        row = self.item(weight, len(history) - 1)
        total = self.item(row, 0) * history[0]
        for m in range(1, len(history)):
            total = total + self.item(row, m) * history[m]
        return total

    # ---- primitives of the learnt weights ----------------------------------------------------
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

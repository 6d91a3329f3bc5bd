"""The mutation battery's bugs in the ODE Transformer's encoder and its successors (the encoder
cases): each a replacement for one of ode_ref.encoder's or encoder_layer's methods, or the
config's, that mutants.py patches in (its MUTANTS name them)."""

from __future__ import annotations

import numpy as np

from ode_ref.encoder import ODEEncoderStages
from ode_ref.encoder_params import GATE_BIAS, GATE_WEIGHT, TEMPORAL_BLOCK, temporal_linears
from ode_ref.temporal import EMBED_SCALE, MAX_PERIOD


def _gate_stages_swapped(self, params, ks, i=0):
    if self.config.family != "rk2_gated":
        return _SPEC_STAGE_WEIGHTS(self, params, ks, i)
    g = self.sigmoid(self.linear(self.concat(ks[1], ks[0]), params[GATE_WEIGHT], params[GATE_BIAS]))  # bug: [k_2; k_1]
    return g, 1.0 - g


def _released_residual_in_paper(self, params, prefix, key_mask):
    return lambda z: self.layer(params, prefix, z, key_mask)  # bug: the stage L(y) under both profiles, not L(y) - y


def _post_norm_applied_pre(self, params, norm, x, fn, factor=1.0):
    h = self.layer_norm(x, params[norm + "weight"], params[norm + "bias"])
    return x + factor * self.dropout(fn(h), self.config.dropout)  # bug: x + fn(norm(x)) whatever encoder_normalize_before says


def _ffn_bias_dropped(self, params, prefix, x):
    h = self.relu(self.linear(x, params[prefix + "fc1.weight"], params[prefix + "fc1.bias"]))
    return self.linear(h, params[prefix + "fc2.weight"], 0.0 * params[prefix + "fc2.bias"])  # bug: fc2's bias dropped


def _ema_power_off_by_one(self, a, stages):
    q, weights = 1.0 - a, [a * (1.0 - a)]  # bug: a (1-a)^(s-i) for stage i (1-based); the last gets a (1-a), not a
    for _ in range(stages - 1):
        weights.insert(0, weights[0] * q)
    return weights


def _history_weights_transposed(self, weight, history):
    column = self.xp.swapaxes(weight, 0, 1)[len(history) - 1]  # bug: weight[m, c-1], not weight[c-1, m]
    total = column[0] * history[0]
    for m in range(1, len(history)):
        total = total + column[m] * history[m]
    return total


def _macaron_second_half_dropped(self):
    return (0.5, 1.0) if self.macaron else (1.0, 1.0)  # bug: FFN_b whole under macaron_profile "paper" too


_SPEC_STAGE_WEIGHTS = ODEEncoderStages.stage_weights


def _t_at_step_start(steps):
    return [k / steps for k in range(steps)]  # bug: t = k h, the step's start (qkvflow evaluates at its end, (k + 1) h)


def _embedding_with_2pi(t, dim):
    w = 2 * np.pi * np.exp(-np.log(MAX_PERIOD) * np.arange(dim) / dim)  # bug: 2 pi in the angle (qkvflow's fixed embedding has none)
    angles = (t * EMBED_SCALE) * w
    return np.concatenate([[t], np.sin(angles), np.cos(angles)])


def _weight_as_out_in(self, params, name, x, e):
    prefix = TEMPORAL_BLOCK + name
    n_in, n_out = temporal_linears(self.config)[name]
    tau = self.time_features(params, prefix, e)
    w = self.linear(tau, params[prefix + "f_W.weight"], params[prefix + "f_W.bias"])
    w = self.transpose_last(self.reshape(w, (n_out, n_in)))  # bug: f_W's rows read as (out, in), torch's Linear layout
    return self.matmul(x, w) + self.matmul(tau, params[prefix + "f_b"])

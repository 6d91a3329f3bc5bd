"""Time-dependent weights: qkvflow's Neural ODE Transformer as the encoder stack (time_embed_dim > 0).

Tong et al., "Neural ODE Transformers: Analyzing Internal Dynamics and Adaptive Fine-tuning", ICLR
2025, arXiv 2503.01329; code SDML-KU/qkvflow, qkvflow/nn/dynamic.py and time_embed.py. One block
is shared by every step, and f is the first here that reads t:

    z_{k+1} = z_k + h f(z_k, t_{k+1}),   t_{k+1} = (k + 1) h,  h = 1 / steps     Euler, t at the step's end
    f(z, t) = Attn_t(LN^a_t z) + MLP_t(LN^m_t z)                                  attention and MLP in parallel
    z(1) -> ln_f                                                                   a plain LayerNorm

    e(t)       = [t, sin(1000 t w_0), ..., sin(1000 t w_{d-1}), cos(1000 t w_0), ...],  w_i = 10000^(-i/d)
                 (d = sinusoidal_dim; no 2 pi, as released)
    tau_P(t)   = lin2(silu(lin1(e(t))))                   every temporal layer P has its own small MLP
    linear P   W = reshape(f_W(tau), (in, out)), y = x W + tau f_b      (the bias is tau f_b alone)
    norm P     LayerNorm(z) * (tau f_weight^T + 1) + tau f_bias^T       (eps 1e-5)
    Attn_t     c_proj(heads' causal attention(c_attn(x)))               GPT-2's: q k^T / sqrt(head_dim)
    MLP_t      c_proj(gelu_tanh(c_fc(x)))                               GPT-2's gelu_new

A real query at slot i sees the real keys at slots j <= i (itself among them); a padded query sees
every real key (each sequence holds one, so no row is empty, and no query sees a padded key): a
padded token's value is held at 0, so not even a NaN there reaches a real token, as in the encoder.
e(t) is known before any input: the spec computes it in float64 and rounds it once to the working
dtype, so every port holds the same bits; qkvflow computes it in the working dtype, where
sin(1000 t w) near an argument of 1000 carries the rounding of t and of the argument, about 1e-4.
The step count is free: the same weights run at any
encoder_layers, as qkvflow's evaluate_at(dt) does.
"""

from __future__ import annotations

import functools

import numpy as np

from .attention import causal_mask
from .encoder_layer import EncoderStages
from .encoder_params import TEMPORAL_BLOCK, TEMPORAL_FINAL_NORM, temporal_linears

EMBED_SCALE, MAX_PERIOD = 1000.0, 10000.0  # qkvflow's SinusoidalPosEmb(scale=1000, max_period=10000)
GELU_C, GELU_CUBIC = float(np.sqrt(2.0 / np.pi)), 0.044715  # gelu_new's sqrt(2 / pi) and its cube's factor


def step_ends(steps: int) -> list[float]:
    """t at each Euler step's end: (k + 1) / steps for k = 0 .. steps - 1 (float64)."""
    return [(k + 1) / steps for k in range(steps)]


def time_embedding(t: float, dim: int) -> np.ndarray:
    """e(t), float64, shape (2 dim + 1,) (module docstring)."""
    w = np.exp(-np.log(MAX_PERIOD) * np.arange(dim) / dim)
    angles = (t * EMBED_SCALE) * w
    return np.concatenate([[t], np.sin(angles), np.cos(angles)])


class TemporalStages(EncoderStages):
    """qkvflow's block and stack over params (encoder_params.py's names), written once; a port
    overrides the primitives below where its framework differs (constant, reshape, causal_triangle)."""

    def temporal_stack(self, params: dict, x, padding_mask=None):
        """z(1) after ln_f: encoder_layers Euler steps of the shared block, t at each step's end."""
        states, _ = self.temporal_states(params, x, self.causal_key_mask(x, padding_mask))
        return self.layer_norm(states[-1], params[TEMPORAL_FINAL_NORM + "weight"], params[TEMPORAL_FINAL_NORM + "bias"])

    def temporal_states(self, params: dict, x, key_mask) -> tuple[list, list]:
        """([z_0 = x, z_1, ..., z_steps], [e(t_1), ...] each (1, S)): the Euler steps, h = 1 / steps."""
        steps = self.config.encoder_layers
        states, es = [x], [self.constant(time_embedding(t, self.config.sinusoidal_dim)[None, :], x) for t in step_ends(steps)]
        for e in es:
            states.append(states[-1] + (1.0 / steps) * self.temporal_f(params, states[-1], e, key_mask))
        return states, es

    def temporal_f(self, params: dict, z, e, key_mask):
        """f(z, t) = Attn_t(LN^a_t z) + MLP_t(LN^m_t z), e = e(t) (1, S); each output through the
        residual dropout, as released."""
        linear = lambda name, h: self.temporal_linear(params, name, h, e)  # noqa: E731
        attn = linear("attn.c_proj.", self.attend(linear("attn.c_attn.", self.temporal_norm(params, "attn_ln.", z, e)),
                                                  key_mask))
        mlp = linear("mlp.c_proj.", self.gelu_tanh(linear("mlp.c_fc.", self.temporal_norm(params, "mlp_ln.", z, e))))
        return self.dropout(attn, self.config.dropout) + self.dropout(mlp, self.config.dropout)

    @functools.cached_property
    def linear_widths(self) -> dict:
        """(in, out) of each temporal linear layer (encoder_params.temporal_linears), read once."""
        return temporal_linears(self.config)

    def time_features(self, params: dict, prefix: str, e):
        """tau = lin2(silu(lin1(e))): (1, S) -> (1, T), the temporal layer under prefix's own."""
        h = self.linear(e, params[prefix + "lin1.weight"], params[prefix + "lin1.bias"])
        return self.linear(h * self.sigmoid(h), params[prefix + "lin2.weight"], params[prefix + "lin2.bias"])

    def temporal_linear(self, params: dict, name: str, x, e):
        """x W(t) + tau f_b, W(t) = f_W(tau) as (in, out): (..., in) -> (..., out)."""
        prefix = TEMPORAL_BLOCK + name
        n_in, n_out = self.linear_widths[name]
        tau = self.time_features(params, prefix, e)
        w = self.reshape(self.linear(tau, params[prefix + "f_W.weight"], params[prefix + "f_W.bias"]), (n_in, n_out))
        return self.matmul(x, w) + self.matmul(tau, params[prefix + "f_b"])

    def temporal_norm(self, params: dict, name: str, z, e):
        """LayerNorm(z) with weight tau f_weight^T + 1 and bias tau f_bias^T."""
        prefix, c = TEMPORAL_BLOCK + name, (self.config.encoder_embed_dim,)
        tau = self.time_features(params, prefix, e)
        weight = self.linear(tau, params[prefix + "f_weight"], self.constant(np.ones(c), z))
        bias = self.linear(tau, params[prefix + "f_bias"], self.constant(np.zeros(c), z))
        return self.layer_norm(z, self.reshape(weight, c), self.reshape(bias, c))

    def gelu_tanh(self, x):
        """GPT-2's gelu_new: x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2, as jax.nn.gelu(approximate=True)."""
        return x * (0.5 * (1.0 + self.xp.tanh(GELU_C * (x + GELU_CUBIC * (x * x * x)))))

    def causal_key_mask(self, x, padding_mask=None):
        """bool (batch or 1, 1, seq, seq): a real query at slot i sees the real keys at j <= i, a
        padded one every real key (module docstring)."""
        seen = self.causal_triangle(x)
        if padding_mask is None:
            return seen[None, None]
        real = padding_mask[:, None, None, :]
        return real & (seen | ~self.transpose_last(real))

    # ---- primitives, in each port's arrays ---------------------------------------------------
    def constant(self, value: np.ndarray, like):
        """value (NumPy, float64) as an array of like's dtype (and device)."""
        return self.xp.asarray(value, dtype=like.dtype)

    def reshape(self, a, shape: tuple):
        return a.reshape(shape)

    def causal_triangle(self, x):
        """bool (seq, seq) for x (batch, seq, C): True where key j <= query i."""
        return causal_mask(x.shape[1], self.xp)

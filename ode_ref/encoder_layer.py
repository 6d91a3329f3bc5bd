"""The ODE Transformer's F: a whole Transformer encoder layer L(y), as fairseq's encoder layer.

    attention sublayer  x = x + dropout(self_attn(norm0(x)))     pre-norm
                        x = norm0(x + dropout(self_attn(x)))     post-norm (fairseq's default)
    FFN sublayer        the same with ffn(x) = fc2(dropout(relu(fc1(x)))) and norm1
    self_attn           q, k, v = split(x @ in_proj_weight^T + in_proj_bias), rows q, k, v;
                        q = q * head_dim ** -0.5 (after the bias); scores q k^T with each padded
                        key -inf; softmax over keys; dropout; @ v; merge heads; out_proj (bias)

x is (batch, seq, C) here (fairseq's is (seq, batch, C)). Padded queries are computed like real ones
and not zeroed, as released: no real token ever reads them (their keys are -inf, their values held
at 0, so a NaN or Inf in a padded token stays in padded tokens). The norms are
LayerNorm, eps 1e-5, affine (norms.layer_norm).

The orchestration (layer, sublayer, self_attn, ffn) is written once, here, over a flat parameter
dict with the released state_dict keys (encoder_params.py), and run by every port: a port
subclasses EncoderStages, sets its array namespace xp, and overrides only the primitives its framework
computes otherwise (linear ... dropout); the others are written here over self.xp with NumPy's names.
"""

from __future__ import annotations

import numpy as np

from .attention import sigmoid, softmax
from .encoder_config import ODEEncoderConfig
from .norms import layer_norm


class EncoderStages:
    """The encoder layer's stages over params (name -> array). A port overrides the primitives."""

    xp = np  # the array namespace: jax.numpy in JAX, backends/torch/xp.py in PyTorch

    def __init__(self, config):
        self.config = ODEEncoderConfig.from_any(config)
        self.training = False  # the spec is evaluation; a port's module sets it (dropout)

    # ---- the layer L, written once -----------------------------------------------------------
    def layer(self, params: dict, prefix: str, x, key_mask):
        """L(x): (batch, seq, C) -> (batch, seq, C) with the parameters under prefix ('layers.0.').
        key_mask: a port's form of the padded keys (key_mask below), or None. A Macaron layer
        (encoder_config.py) first adds its FFN_a (macaron_fc1, macaron_fc2, layer_norms.2)."""
        factor_a, factor_b = self.config.ffn_factors
        if self.config.macaron:
            x = self.sublayer(params, prefix + "layer_norms.2.", x, lambda h: self.ffn(params, prefix + "macaron_", h),
                              factor_a)
        x = self.sublayer(params, prefix + "layer_norms.0.", x,
                          lambda h: self.self_attn(params, prefix + "self_attn.", h, key_mask))
        return self.sublayer(params, prefix + "layer_norms.1.", x, lambda h: self.ffn(params, prefix, h), factor_b)

    def sublayer(self, params: dict, norm: str, x, fn, factor: float = 1.0):
        """x + factor dropout(fn(norm(x))) (pre-norm) or norm(x + factor dropout(fn(x))) (post-norm);
        a factor of 1 multiplies nothing."""
        norm_of = lambda z: self.layer_norm(z, params[norm + "weight"], params[norm + "bias"])  # noqa: E731
        scaled = lambda h: h if factor == 1.0 else factor * h  # noqa: E731
        if self.config.encoder_normalize_before:
            return x + scaled(self.dropout(fn(norm_of(x)), self.config.dropout))
        return norm_of(x + scaled(self.dropout(fn(x), self.config.dropout)))

    def self_attn(self, params: dict, prefix: str, x, key_mask):
        """Multi-head self-attention with the fused input projection: (batch, seq, C) -> the same."""
        qkv = self.linear(x, params[prefix + "in_proj_weight"], params[prefix + "in_proj_bias"])  # (b, t, 3C)
        return self.linear(self.attend(qkv, key_mask), params[prefix + "out_proj.weight"], params[prefix + "out_proj.bias"])

    def attend(self, qkv, key_mask):
        """The heads' attention between the projections: qkv (batch, seq, 3C), thirds q, k, v, each
        head's columns together -> the heads merged (batch, seq, C)."""
        q, k, v = self.split_qkv(qkv)  # (batch, seq, C) each
        q = q * self.config.scale  # after the bias, as released
        q, k, v = (self.split_heads(a) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        k, v = self.cache_kv(k, v)  # decoding (ode_ref/lm_layer.py): every key so far; else as they are
        scores = self.fill_padded_keys(self.matmul(q, self.transpose_last(k)), key_mask)  # (b, h, seq_q, seq_k)
        weights = self.dropout(self.softmax(scores), self.config.attention_dropout)
        return self.merge_heads(self.matmul(weights, self.hold_padded_values(v, key_mask)))  # (batch, seq, C)

    def ffn(self, params: dict, prefix: str, x):
        """fc2(dropout(relu(fc1(x)))): (batch, seq, C) -> (batch, seq, ffn_dim) -> (batch, seq, C)."""
        h = self.relu(self.linear(x, params[prefix + "fc1.weight"], params[prefix + "fc1.bias"]))
        h = self.dropout(h, self.config.activation_dropout)
        return self.linear(h, params[prefix + "fc2.weight"], params[prefix + "fc2.bias"])

    def cache_kv(self, k, v):
        """The keys and values the queries attend to: here k, v themselves. A decoder's cache
        (ode_ref/lm_layer.py) records them, or appends them to the past ones."""
        return k, v

    # ---- primitives, in each port's arrays ---------------------------------------------------
    def key_mask(self, padding_mask):
        """The padded keys as self_attn's fill takes them: here bool (batch, 1, 1, seq), True = real
        key; None without a padding mask."""
        return None if padding_mask is None else padding_mask[:, None, None, :]

    def fill_padded_keys(self, scores, key_mask):
        """scores with each padded key's score -inf (before the softmax, as released)."""
        return scores if key_mask is None else self.xp.where(key_mask, scores, -self.xp.inf)

    def hold_padded_values(self, v, key_mask):
        """v (batch, heads, seq, head_dim) with each padded key's value 0. Its weight is exactly 0
        already, but 0 * NaN is NaN in weights @ v: held at 0, a NaN or Inf in a padded token never
        reaches a real one, and a finite run keeps its bits (0 * v and 0 * 0 add the same zero). A
        mask per query (a decoder's, (batch, 1, seq_q, seq_k)) holds the keys that no query sees."""
        if key_mask is None:
            return v
        return self.xp.where(self.transpose_last(key_mask.any(axis=-2, keepdims=True)), v, 0)  # 0: v's dtype

    def split_qkv(self, qkv):
        """(batch, seq, 3C) -> its q, k, v thirds over the last axis, in that order."""
        c = self.config.encoder_embed_dim
        return qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]

    def item(self, a, i: int):
        """a[i] of a vector parameter, a scalar (rk2_weighted's alpha)."""
        return a[i]

    def linear(self, x, weight, bias):
        """x @ weight^T + bias: (..., in) -> (..., out), weight (out, in)."""
        return x @ weight.T + bias

    def layer_norm(self, x, weight, bias):
        return layer_norm(x, weight, bias)

    def softmax(self, scores):
        return softmax(scores)

    def relu(self, x):
        return self.xp.maximum(x, 0)  # 0: x's dtype

    def sigmoid(self, x):
        return sigmoid(x)

    def matmul(self, a, b):
        return a @ b

    def transpose_last(self, a):
        return self.xp.swapaxes(a, -1, -2)

    def split_heads(self, a):
        """(batch, seq, C) -> (batch, heads, seq, head_dim)."""
        b, t, _ = a.shape
        return self.xp.permute_dims(a.reshape(b, t, self.config.encoder_attention_heads, self.config.head_dim), (0, 2, 1, 3))

    def merge_heads(self, a):
        """(batch, heads, seq, head_dim) -> (batch, seq, C)."""
        b, _, t, _ = a.shape
        return self.xp.permute_dims(a, (0, 2, 1, 3)).reshape(b, t, self.config.encoder_embed_dim)

    def dropout(self, x, p: float):
        """Identity: the spec is evaluation. A port drops with probability p when training, a new
        draw at every call, so every stage evaluation of a block draws its own masks."""
        return x

"""The encoder stack's backward pass, hand-written: ode_encoder_vjp, one VJP per forward function.

    ode_encoder_vjp(params, x, config, z_bar, padding_mask=None) -> (x_bar, params_bar)

The vector-Jacobian product of z = ode_encoder(params, x, config, padding_mask) for a cotangent
z_bar (batch, seq, C): x_bar has x's shape, params_bar every parameter name (the released keys)
with its shape. Each function of encoder_layer.py and encoder.py has its VJP here, in the same
order reversed; the forward values each needs are recomputed by the spec's own stages. A layer's
parameters collect their gradients over every stage that evaluates it, gate_linear and alpha
over every block. The layer norms' VJP is norms.layer_norm_vjp; the softmax's backward.softmax_vjp.
"""

from __future__ import annotations

import numpy as np

from .backward import softmax_vjp
from .bitlinear import linear_vjp
from .encoder import ODEEncoderStages, block_tableau, check_encoder_input
from .encoder_config import ODEEncoderConfig
from .encoder_params import ALPHA, FINAL_NORM, GATE_BIAS, GATE_WEIGHT, check_encoder_params, layer_prefix
from .norms import layer_norm_vjp
from .rk import _combine, add_grads


def _linear_vjp(y_bar, x, weight, prefix: str) -> tuple:
    """(x_bar, {prefix + 'weight', prefix + 'bias'}) of x @ weight^T + bias."""
    x_bar, w_bar = linear_vjp(y_bar, x, weight)
    return x_bar, {prefix + "weight": w_bar, prefix + "bias": y_bar.reshape(-1, y_bar.shape[-1]).sum(axis=0)}


def _norm_vjp(params, norm: str, x, y_bar) -> tuple:
    x_bar, grads = layer_norm_vjp(y_bar, x, params[norm + "weight"], params[norm + "bias"])
    return x_bar, {norm + k: v for k, v in grads.items()}


def self_attn_vjp(s: ODEEncoderStages, params, prefix: str, x, key_mask, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.self_attn for y_bar (batch, seq, C)."""
    scale = s.config.scale
    qkv = s.linear(x, params[prefix + "in_proj_weight"], params[prefix + "in_proj_bias"])
    q, k, v = (s.split_heads(a) for a in s.split_qkv(qkv))
    q = q * scale
    a = s.softmax(s.fill_padded_keys(q @ s.transpose_last(k), key_mask))  # (batch, heads, seq_q, seq_k)
    merged = s.merge_heads(a @ v)
    # reverse: out_proj, merge_heads, the weights times v, softmax, the fill, q k^T, the scale, split
    merged_bar, grads = _linear_vjp(y_bar, merged, params[prefix + "out_proj.weight"], prefix + "out_proj.")
    o_bar = s.split_heads(merged_bar)
    v_bar = s.transpose_last(a) @ o_bar
    scores_bar = softmax_vjp(o_bar @ s.transpose_last(v), a)  # a padded key's weight is 0: no gradient
    q_bar, k_bar = scores_bar @ k * scale, s.transpose_last(scores_bar) @ q
    qkv_bar = np.concatenate([s.merge_heads(g) for g in (q_bar, k_bar, v_bar)], axis=-1)
    x_bar, w_bar = linear_vjp(qkv_bar, x, params[prefix + "in_proj_weight"])
    grads[prefix + "in_proj_weight"] = w_bar
    grads[prefix + "in_proj_bias"] = qkv_bar.reshape(-1, qkv_bar.shape[-1]).sum(axis=0)
    return x_bar, grads


def ffn_vjp(s: ODEEncoderStages, params, prefix: str, x, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.ffn."""
    pre = s.linear(x, params[prefix + "fc1.weight"], params[prefix + "fc1.bias"])
    h_bar, grads = _linear_vjp(y_bar, s.relu(pre), params[prefix + "fc2.weight"], prefix + "fc2.")
    x_bar, fc1 = _linear_vjp(h_bar * (pre > 0), x, params[prefix + "fc1.weight"], prefix + "fc1.")
    return x_bar, {**grads, **fc1}


def sublayer_vjp(s: ODEEncoderStages, params, norm: str, x, fn, fn_vjp, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.sublayer: fn(h) its function, fn_vjp(h, h_bar) its VJP."""
    if s.config.encoder_normalize_before:  # x + fn(norm(x))
        h = s.layer_norm(x, params[norm + "weight"], params[norm + "bias"])
        h_bar, grads = fn_vjp(h, y_bar)
        x_bar, norm_grads = _norm_vjp(params, norm, x, h_bar)
        return y_bar + x_bar, {**grads, **norm_grads}
    u = x + fn(x)  # norm(x + fn(x))
    u_bar, norm_grads = _norm_vjp(params, norm, u, y_bar)
    x_bar, grads = fn_vjp(x, u_bar)
    return u_bar + x_bar, {**grads, **norm_grads}


def layer_vjp(s: ODEEncoderStages, params, prefix: str, x, key_mask, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.layer, L(x), under prefix."""
    attention = lambda h: s.self_attn(params, prefix + "self_attn.", h, key_mask)  # noqa: E731
    attention_vjp = lambda h, h_bar: self_attn_vjp(s, params, prefix + "self_attn.", h, key_mask, h_bar)  # noqa: E731
    mid = s.sublayer(params, prefix + "layer_norms.0.", x, attention)
    mid_bar, ffn_grads = sublayer_vjp(s, params, prefix + "layer_norms.1.", mid, lambda h: s.ffn(params, prefix, h),
                                      lambda h, h_bar: ffn_vjp(s, params, prefix, h, h_bar), y_bar)
    x_bar, attn_grads = sublayer_vjp(s, params, prefix + "layer_norms.0.", x, attention, attention_vjp, mid_bar)
    return x_bar, {**ffn_grads, **attn_grads}


def stage_weights_vjp(s: ODEEncoderStages, params, ks, w_bar) -> tuple:
    """(k_bars, grads) of ODEEncoderStages.stage_weights for (w_1_bar, w_2_bar)."""
    if s.config.family == "rk2_weighted":
        return [0.0, 0.0], {ALPHA: np.array([w_bar[0].sum(), w_bar[1].sum()])}
    both = np.concatenate(ks[:2], axis=-1)  # rk2_gated: w = (g, 1 - g)
    g = s.sigmoid(s.linear(both, params[GATE_WEIGHT], params[GATE_BIAS]))
    u_bar = ((w_bar[0] - w_bar[1]).sum(axis=-1, keepdims=True)) * g * (1.0 - g)  # (batch, seq, 1)
    both_bar, grads = _linear_vjp(u_bar, both, params[GATE_WEIGHT], "gate_linear.")
    c = ks[0].shape[-1]
    return [both_bar[..., :c], both_bar[..., c:]], grads


def block_vjp(s: ODEEncoderStages, params, i: int, y, key_mask, y_bar) -> tuple:
    """(y_bar of the block's input, grads) of ODEEncoderStages.block: the stages recomputed
    forward, then reversed: k_i gets w_i y_bar (and, for learnt weights, their cotangent), and a
    stage input's cotangent flows to y and, through a_ij, to the earlier k_j."""
    prefix, tableau = layer_prefix(i), block_tableau(s.config)
    paper = s.config.profile == "paper"
    ys, ks = [], []
    for a_i in tableau.a:
        ys.append(_combine(y, 1.0, a_i, ks))
        ks.append(s.stage(params, prefix, key_mask)(ys[-1]))
    weights = s.stage_weights(params, ks)
    grads: dict = {}
    if weights is None:
        k_bars = [b_i * y_bar for b_i in tableau.b]
    else:
        extra, grads = stage_weights_vjp(s, params, ks, (y_bar * ks[0], y_bar * ks[1]))
        k_bars = [weights[0] * y_bar + extra[0], weights[1] * y_bar + extra[1]]
    out_bar = y_bar
    for j in reversed(range(tableau.num_stages)):
        stage_bar, layer_grads = layer_vjp(s, params, prefix, ys[j], key_mask, k_bars[j])
        if paper:  # k = L(Y) - Y
            stage_bar = stage_bar - k_bars[j]
        grads = add_grads(grads, layer_grads)
        out_bar = out_bar + stage_bar
        for m, a_jm in enumerate(tableau.a[j]):
            if a_jm != 0.0:
                k_bars[m] = k_bars[m] + a_jm * stage_bar
    return out_bar, grads


def ode_encoder_vjp(params, x, config, z_bar, padding_mask=None) -> tuple:
    """(x_bar, params_bar) of z = ode_encoder(params, x, config, padding_mask) for the cotangent
    z_bar (batch, seq, C) like x; params_bar in encoder_param_shapes' order."""
    cfg = ODEEncoderConfig.from_any(config)
    check_encoder_params(params, cfg)
    check_encoder_input(x, cfg, padding_mask)
    if not isinstance(z_bar, np.ndarray) or z_bar.shape != x.shape or z_bar.dtype != x.dtype:
        got = (z_bar.shape, z_bar.dtype) if isinstance(z_bar, np.ndarray) else type(z_bar).__name__
        raise ValueError(f"z_bar: expected a NumPy array of x's shape {x.shape} and dtype {x.dtype}; got {got}")
    params = {k: np.asarray(v, dtype=x.dtype) for k, v in params.items()}
    s = ODEEncoderStages(cfg)
    key_mask = s.key_mask(padding_mask)
    states = [x]
    for i in range(cfg.encoder_layers):
        states.append(s.block(params, i, states[-1], key_mask))
    grads: dict = {}
    if cfg.encoder_normalize_before:
        z_bar, grads = _norm_vjp(params, FINAL_NORM, states[-1], z_bar)
    for i in reversed(range(cfg.encoder_layers)):
        z_bar, block_grads = block_vjp(s, params, i, states[i], key_mask, z_bar)
        grads = add_grads(grads, block_grads)
    return z_bar, {name: np.asarray(grads[name]).reshape(np.shape(params[name])) for name in params}

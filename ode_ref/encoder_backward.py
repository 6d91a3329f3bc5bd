"""The encoder stack's backward pass, hand-written: ode_encoder_vjp, one VJP per forward function.

    ode_encoder_vjp(params, x, config, z_bar, padding_mask=None) -> (x_bar, params_bar)

The vector-Jacobian product of z = ode_encoder(params, x, config, padding_mask) for a cotangent
z_bar (batch, seq, C): x_bar has x's shape, params_bar every parameter name (the released keys)
with its shape. Each function of encoder_layer.py and encoder.py has its VJP here, in the same
order reversed; the forward values each needs are recomputed by the spec's own stages. A layer's
parameters collect their gradients over every stage that evaluates it, gate_linear and alpha
over every block. The layer norms' VJP is norms.layer_norm_vjp; the softmax's backward.softmax_vjp.
qkvflow's time-dependent stack (temporal.py) has its VJPs at the end, each weight collecting its
gradient over every step; e(t) is a constant.
"""

from __future__ import annotations

import numpy as np

from .backward import softmax_vjp
from .bitlinear import linear_vjp
from .encoder import ODEEncoderStages, block_tableau, check_encoder_input
from .encoder_config import EMA_FAMILIES, ODEEncoderConfig
from .encoder_params import (ALPHA, FINAL_NORM, GATE_BIAS, GATE_WEIGHT, HISTORY_NORM, HISTORY_WEIGHT, HISTORY_WEIGHT_C,
                             PREDICTION_NORM, TEMPORAL_BLOCK, TEMPORAL_FINAL_NORM, check_encoder_params, layer_prefix)
from .norms import layer_norm_vjp
from .rk import _combine, add_grads
from .temporal import GELU_C, GELU_CUBIC


def _linear_vjp(y_bar, x, weight, prefix: str) -> tuple:
    """(x_bar, {prefix + 'weight', prefix + 'bias'}) of x @ weight^T + bias."""
    x_bar, w_bar = linear_vjp(y_bar, x, weight)
    return x_bar, {prefix + "weight": w_bar, prefix + "bias": y_bar.reshape(-1, y_bar.shape[-1]).sum(axis=0)}


def _row(like, i: int, value):
    """An array of like's shape, zero but its row i, which is value."""
    out = np.zeros_like(like)
    out[i] = value
    return out


def _norm_vjp(params, norm: str, x, y_bar) -> tuple:
    x_bar, grads = layer_norm_vjp(y_bar, x, params[norm + "weight"], params[norm + "bias"])
    return x_bar, {norm + k: v for k, v in grads.items()}


def attend_vjp(s: ODEEncoderStages, qkv, key_mask, merged_bar):
    """qkv_bar of EncoderStages.attend for merged_bar (batch, seq, C): the weights times v, the
    softmax, the fill, q k^T, the scale and the split, reversed."""
    scale = s.config.scale
    q, k, v = (s.split_heads(a) for a in s.split_qkv(qkv))
    q = q * scale
    a = s.softmax(s.fill_padded_keys(q @ s.transpose_last(k), key_mask))  # (batch, heads, seq_q, seq_k)
    o_bar = s.split_heads(merged_bar)
    v_bar = s.transpose_last(a) @ o_bar
    scores_bar = softmax_vjp(o_bar @ s.transpose_last(v), a)  # a padded key's weight is 0: no gradient
    q_bar, k_bar = scores_bar @ k * scale, s.transpose_last(scores_bar) @ q
    return np.concatenate([s.merge_heads(g) for g in (q_bar, k_bar, v_bar)], axis=-1)


def self_attn_vjp(s: ODEEncoderStages, params, prefix: str, x, key_mask, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.self_attn for y_bar (batch, seq, C)."""
    qkv = s.linear(x, params[prefix + "in_proj_weight"], params[prefix + "in_proj_bias"])
    merged = s.attend(qkv, key_mask)
    merged_bar, grads = _linear_vjp(y_bar, merged, params[prefix + "out_proj.weight"], prefix + "out_proj.")
    qkv_bar = attend_vjp(s, qkv, key_mask, merged_bar)
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


def sublayer_vjp(s: ODEEncoderStages, params, norm: str, x, fn, fn_vjp, y_bar, factor: float = 1.0) -> tuple:
    """(x_bar, grads) of EncoderStages.sublayer: fn(h) its function, fn_vjp(h, h_bar) its VJP."""
    if s.config.encoder_normalize_before:  # x + factor fn(norm(x))
        h = s.layer_norm(x, params[norm + "weight"], params[norm + "bias"])
        h_bar, grads = fn_vjp(h, factor * y_bar)
        x_bar, norm_grads = _norm_vjp(params, norm, x, h_bar)
        return y_bar + x_bar, {**grads, **norm_grads}
    u = x + factor * fn(x)  # norm(x + factor fn(x))
    u_bar, norm_grads = _norm_vjp(params, norm, u, y_bar)
    x_bar, grads = fn_vjp(x, factor * u_bar)
    return u_bar + x_bar, {**grads, **norm_grads}


def layer_vjp(s: ODEEncoderStages, params, prefix: str, x, key_mask, y_bar) -> tuple:
    """(x_bar, grads) of EncoderStages.layer, L(x), under prefix: its sublayers reversed."""
    attention = lambda h: s.self_attn(params, prefix + "self_attn.", h, key_mask)  # noqa: E731
    attention_vjp = lambda h, h_bar: self_attn_vjp(s, params, prefix + "self_attn.", h, key_mask, h_bar)  # noqa: E731
    ffn = lambda p: (lambda h: s.ffn(params, p, h), lambda h, h_bar: ffn_vjp(s, params, p, h, h_bar))  # noqa: E731
    factor_a, factor_b = s.config.ffn_factors
    sublayers = [("layer_norms.2.", *ffn(prefix + "macaron_"), factor_a)] if s.config.macaron else []
    sublayers += [("layer_norms.0.", attention, attention_vjp, 1.0), ("layer_norms.1.", *ffn(prefix), factor_b)]
    inputs = [x]
    for norm, fn, _, factor in sublayers[:-1]:
        inputs.append(s.sublayer(params, prefix + norm, inputs[-1], fn, factor))
    grads: dict = {}
    for (norm, fn, fn_vjp, factor), h in reversed(list(zip(sublayers, inputs))):
        y_bar, more = sublayer_vjp(s, params, prefix + norm, h, fn, fn_vjp, y_bar, factor)
        grads.update(more)
    return y_bar, grads


def stage_weights_vjp(s: ODEEncoderStages, params, ks, w_bar, i: int = 0) -> tuple:
    """(k_bars, grads) of ODEEncoderStages.stage_weights of block i for (w_1_bar, ...), each
    y_bar * k_j: the cotangents the weights' own inputs get (the gate's stage values; none for
    alpha) and the weights' parameters'."""
    if s.config.family == "rk2_weighted":
        return [0.0, 0.0], {ALPHA: np.array([w_bar[0].sum(), w_bar[1].sum()])}
    if s.config.family in EMA_FAMILIES:  # w_j = a q^m, q = 1 - a: dw_j/da = q^m - m a q^(m-1)
        a = params[ALPHA][i] if s.config.layer_wise else params[ALPHA]
        stages = len(ks)
        a_bar = sum(wb.reshape(-1, wb.shape[-1]).sum(axis=0) * ((1 - a) ** m - m * a * (1 - a) ** max(m - 1, 0))
                    for wb, m in zip(w_bar, range(stages - 1, -1, -1)))  # (C,) per channel
        if s.config.alpha_type == "scalar":
            a_bar = np.array([a_bar.sum()])
        if s.config.layer_wise:
            a_bar = _row(params[ALPHA], i, a_bar)
        return [0.0] * stages, {ALPHA: a_bar}
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
    weights = s.stage_weights(params, ks, i)
    grads: dict = {}
    if weights is None:
        k_bars = [b_i * y_bar for b_i in tableau.b]
    else:
        extra, grads = stage_weights_vjp(s, params, ks, [y_bar * k for k in ks], i)
        k_bars = [w * y_bar + e for w, e in zip(weights, extra)]
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
    z_bar, grads = (temporal_stack_vjp if cfg.temporal else stack_vjp)(s, params, x, padding_mask, z_bar)
    return z_bar, {name: np.asarray(grads.get(name, np.zeros_like(params[name]))).reshape(np.shape(params[name]))
                   for name in params}


def stack_vjp(s: ODEEncoderStages, params, x, padding_mask, z_bar) -> tuple:
    """(x_bar, grads) of ODEEncoderStages.encoder's stack of blocks (each with PCformer's corrector
    when set), then its final norm, reversed."""
    cfg = s.config
    key_mask = s.key_mask(padding_mask)
    states, predictions, history = [x], [], [x]
    for i in range(cfg.encoder_layers):
        predictions.append(s.block(params, i, states[-1], key_mask))
        states.append(s.correct(params, i, predictions[-1], history, key_mask) if cfg.corrector else predictions[-1])
    grads: dict = {}
    if cfg.encoder_normalize_before:
        z_bar, grads = _norm_vjp(params, FINAL_NORM, states[-1], z_bar)
    h_bars = [np.zeros_like(x) for _ in history]
    for i in reversed(range(cfg.encoder_layers)):
        if cfg.corrector:
            z_bar, more = correct_vjp(s, params, i, predictions[i], history, h_bars, key_mask, z_bar)
            grads = add_grads(grads, more)
        z_bar, block_grads = block_vjp(s, params, i, states[i], key_mask, z_bar)
        grads = add_grads(grads, block_grads)
    return z_bar + h_bars[0], grads  # h_0 = x


def correct_vjp(s: ODEEncoderStages, params, i: int, prediction, history: list, h_bars: list, key_mask, y_bar) -> tuple:
    """(prediction_bar, grads) of ODEEncoderStages.correct after block i for y_bar, its output's
    cotangent. history holds the final entries h_0 .. h_N; h_bars their cotangents so far, added
    to in place (entry i + 1's is complete here: every later layer's sums have given theirs)."""
    c, pre = i + 2, s.config.encoder_normalize_before
    hs = history[:c]
    grads = {HISTORY_WEIGHT: np.zeros_like(params[HISTORY_WEIGHT]), HISTORY_WEIGHT_C: np.zeros_like(params[HISTORY_WEIGHT_C])}
    norm = lambda name: f"{name}{i}."  # noqa: E731

    def sum_vjp(weight: str, entries: list, total_bar) -> list:
        """Cotangents of sum_m weight[c-1, m] entries[m]; weight's row c - 1 into grads."""
        grads[weight][c - 1, :c] = [(total_bar * h).sum() for h in entries]
        return [params[weight][c - 1, m] * total_bar for m in range(c)]

    total_bar = y_bar
    if not pre:  # y = LN_i(sum W_c h)
        total = s.history_sum(params[HISTORY_WEIGHT_C], hs)
        total_bar, more = _norm_vjp(params, norm(HISTORY_NORM), total, y_bar)
        grads.update(more)
    for m, bar in enumerate(sum_vjp(HISTORY_WEIGHT_C, hs, total_bar)):
        h_bars[m] = h_bars[m] + bar
    if not pre:  # h_{i+1} = P
        return h_bars[i + 1], grads
    # h_{i+1} = LN_i(L_i(u)), u = sum W [h_0 .. h_i, LNp_i(P)]
    predicted = s.layer_norm(prediction, params[norm(PREDICTION_NORM) + "weight"], params[norm(PREDICTION_NORM) + "bias"])
    u = s.history_sum(params[HISTORY_WEIGHT], hs[:-1] + [predicted])
    lu = s.layer(params, layer_prefix(i), u, key_mask)
    lu_bar, more = _norm_vjp(params, norm(HISTORY_NORM), lu, h_bars[i + 1])
    grads.update(more)
    u_bar, layer_grads = layer_vjp(s, params, layer_prefix(i), u, key_mask, lu_bar)
    grads = add_grads(grads, layer_grads)
    entry_bars = sum_vjp(HISTORY_WEIGHT, hs[:-1] + [predicted], u_bar)
    for m in range(c - 1):
        h_bars[m] = h_bars[m] + entry_bars[m]
    prediction_bar, more = _norm_vjp(params, norm(PREDICTION_NORM), prediction, entry_bars[-1])
    grads.update(more)
    return prediction_bar, grads


# ---- qkvflow's time-dependent stack (temporal.py) ------------------------------------------------
def time_features_vjp(s: ODEEncoderStages, params, prefix: str, e, tau_bar) -> dict:
    """grads of TemporalStages.time_features, tau = lin2(silu(lin1(e))), for tau_bar (1, T)."""
    h = s.linear(e, params[prefix + "lin1.weight"], params[prefix + "lin1.bias"])
    g = s.sigmoid(h)
    a_bar, grads = _linear_vjp(tau_bar, h * g, params[prefix + "lin2.weight"], prefix + "lin2.")
    _, lin1 = _linear_vjp(a_bar * (g + h * g * (1.0 - g)), e, params[prefix + "lin1.weight"], prefix + "lin1.")
    return {**grads, **lin1}


def temporal_linear_vjp(s: ODEEncoderStages, params, name: str, x, e, y_bar) -> tuple:
    """(x_bar, grads) of TemporalStages.temporal_linear, y = x W(t) + tau f_b."""
    prefix = TEMPORAL_BLOCK + name
    n_in, n_out = s.linear_widths[name]
    tau = s.time_features(params, prefix, e)
    w = s.linear(tau, params[prefix + "f_W.weight"], params[prefix + "f_W.bias"]).reshape(n_in, n_out)
    rows = y_bar.reshape(-1, n_out)
    w_bar = x.reshape(-1, n_in).T @ rows  # (in, out)
    summed = rows.sum(axis=0, keepdims=True)  # (1, out): the bias tau f_b is every row's
    tau_bar, grads = _linear_vjp(w_bar.reshape(1, -1), tau, params[prefix + "f_W.weight"], prefix + "f_W.")
    grads[prefix + "f_b"] = tau.T @ summed
    grads.update(time_features_vjp(s, params, prefix, e, tau_bar + summed @ params[prefix + "f_b"].T))
    return y_bar @ w.T, grads


def temporal_norm_vjp(s: ODEEncoderStages, params, name: str, z, e, y_bar) -> tuple:
    """(z_bar, grads) of TemporalStages.temporal_norm: LayerNorm with weight tau f_weight^T + 1, bias tau f_bias^T."""
    prefix = TEMPORAL_BLOCK + name
    tau = s.time_features(params, prefix, e)  # (1, T)
    weight, bias = (tau @ params[prefix + "f_weight"].T + 1.0)[0], (tau @ params[prefix + "f_bias"].T)[0]
    z_bar, norm = layer_norm_vjp(y_bar, z, weight, bias)
    grads = {prefix + "f_weight": np.outer(norm["weight"], tau), prefix + "f_bias": np.outer(norm["bias"], tau)}
    tau_bar = (norm["weight"] @ params[prefix + "f_weight"] + norm["bias"] @ params[prefix + "f_bias"])[None, :]
    grads.update(time_features_vjp(s, params, prefix, e, tau_bar))
    return z_bar, grads


def gelu_tanh_vjp(u, y_bar):
    """u_bar of TemporalStages.gelu_tanh."""
    t = np.tanh(GELU_C * (u + GELU_CUBIC * u**3))
    return y_bar * (0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * GELU_C * (1.0 + 3 * GELU_CUBIC * u * u))


def temporal_f_vjp(s: ODEEncoderStages, params, z, e, key_mask, f_bar) -> tuple:
    """(z_bar, grads) of TemporalStages.temporal_f: its two branches, each reversed."""
    lin = lambda n, h: s.temporal_linear(params, n, h, e)  # noqa: E731
    lin_vjp = lambda n, h, bar: temporal_linear_vjp(s, params, n, h, e, bar)  # noqa: E731
    h = s.temporal_norm(params, "attn_ln.", z, e)
    qkv = lin("attn.c_attn.", h)
    merged_bar, grads = lin_vjp("attn.c_proj.", s.attend(qkv, key_mask), f_bar)
    h_bar, more = lin_vjp("attn.c_attn.", h, attend_vjp(s, qkv, key_mask, merged_bar))
    z_bar, norm = temporal_norm_vjp(s, params, "attn_ln.", z, e, h_bar)
    grads.update(more, **norm)
    h = s.temporal_norm(params, "mlp_ln.", z, e)
    u = lin("mlp.c_fc.", h)
    g_bar, more = lin_vjp("mlp.c_proj.", s.gelu_tanh(u), f_bar)
    h_bar, fc = lin_vjp("mlp.c_fc.", h, gelu_tanh_vjp(u, g_bar))
    z_bar2, norm = temporal_norm_vjp(s, params, "mlp_ln.", z, e, h_bar)
    grads.update(more, **fc, **norm)
    return z_bar + z_bar2, grads


def temporal_stack_vjp(s: ODEEncoderStages, params, x, padding_mask, z_bar) -> tuple:
    """(x_bar, grads) of TemporalStages.temporal_stack: ln_f, then the Euler steps reversed."""
    key_mask = s.causal_key_mask(x, padding_mask)
    states, es = s.temporal_states(params, x, key_mask)
    z_bar, grads = _norm_vjp(params, TEMPORAL_FINAL_NORM, states[-1], z_bar)
    for z, e in reversed(list(zip(states, es))):
        step_bar, more = temporal_f_vjp(s, params, z, e, key_mask, (1.0 / s.config.encoder_layers) * z_bar)
        z_bar, grads = z_bar + step_bar, add_grads(grads, more)
    return z_bar, grads

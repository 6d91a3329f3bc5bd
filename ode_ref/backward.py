"""The block's backward pass, hand-written: ode_block_vjp, one VJP per forward function.

    ode_block_vjp(params, x, config, z1_bar, padding_mask=None) -> (x_bar, params_bar)

The vector-Jacobian product of z(1) = ode_block(params, x, config, padding_mask) for a cotangent
z1_bar (batch, seq, d_model): x_bar has x's shape, params_bar every parameter name with its shape.
It runs the default stages of attention.py in reverse (evaluate_vjp), each through the VJP written
beside its forward function (norms.py, bitlinear.py, positions.py, softmax_vjp here), and the RK
stepper in reverse (rk.rk_step_vjp), the gated RK2's gate included. BitLinear's gradient is the
seed's straight-through estimator: the identity through each quantiser (activations and weights),
the true gradient through its input's layer_norm. The masks, positions, RoPE tables and ALiBi
bias have no parameters: nothing flows into them.
"""

from __future__ import annotations

import numpy as np

from .attention import Prepared, masked_fill_min, sigmoid, softmax
from .bitlinear import bitlinear_vjp, linear_vjp
from .block import _checked, check_input
from .norms import apply_norm_vjp
from .params import GATE_BIAS, GATE_WEIGHT, NORM_PREFIX, OUT_PROJ, QKV
from .config import PAPE_ENCODINGS
from .params import POS_PREFIX
from .positions import apply_hope, apply_rope_vjp, bam_bias_vjp, content_bias_vjp, ssmax_factor_vjp, ssmax_lengths
from .rk import add_grads, rk_step_vjp, step_times
from .multistep import MultistepMethod, multistep_vjp, solver_of


def softmax_vjp(a_bar, a):
    """s_bar of a = softmax(s) over the last axis: a * (a_bar - sum(a_bar * a))."""
    return a * (a_bar - (a_bar * a).sum(axis=-1, keepdims=True))


def attn_vjp(config, q, k, v, mask, bias, y_bar):
    """(q_bar, k_bar, v_bar, bias_bar) of SelfAttention.attn for y_bar (batch, seq_q, heads,
    head_dim); bias_bar (batch, heads, seq_q, seq_k) is the scores' cotangent, the bias's. A
    masked score is a constant (the fill), so no gradient reaches it."""
    q, k, v, y_bar = (a.transpose(0, 2, 1, 3) for a in (q, k, v, y_bar))  # (batch, heads, seq, head_dim)
    scale = q.dtype.type(config.scale)
    s = (q @ k.transpose(0, 1, 3, 2)) * scale
    if bias is not None:
        s = s + bias
    a = softmax(masked_fill_min(s, mask))
    v_bar = a.transpose(0, 1, 3, 2) @ y_bar
    bias_bar = np.where(mask, softmax_vjp(y_bar @ v.transpose(0, 1, 3, 2), a), 0.0)
    s_bar = bias_bar * scale
    q_bar, k_bar = s_bar @ k, s_bar.transpose(0, 1, 3, 2) @ q
    return (*(g.transpose(0, 2, 1, 3) for g in (q_bar, k_bar, v_bar)), bias_bar)


def evaluate_vjp(attention, prepared: Prepared, t, z, f_bar):
    """(z_bar, grads) of f(t, z) = attention.evaluate(prepared, t, z) for the cotangent f_bar;
    grads: {'qkv', 'out_proj': the (quantised) weights' gradients, 'norm': {name: gradient}}.
    The forward stages are recomputed, keeping what the reverse needs."""
    cfg, p = attention.config, prepared
    linear = bitlinear_vjp if cfg.use_bitnet else linear_vjp
    h0 = attention.hide_padding(z, p.padding_mask)
    h = attention.norm(p.norm, h0)
    q, k, v = attention.project(p.qkv, h)
    q, k, v = attention.preprocess_qkv(q, k, v, t=t, positions=p.positions, rope=p.rope)
    # hide_nonfinite and poison_queries are the identity on finite k, v (this VJP's domain): left out
    raw = bias = p.bias  # raw: the score bias before SSMax's factor
    if cfg.position_encoding in PAPE_ENCODINGS:
        raw = bias = attention.content_bias(p.encoder, h0, p.positions, p.key_positions)
        bias = bias if p.ssmax is None else attention.ssmax_bias(bias, p.ssmax)
    elif p.ssmax is not None and bias is not None:  # prepare's bias is scaled: recompute it unscaled
        raw = (attention.bam_bias(p.encoder, p.positions, p.key_positions, z) if cfg.position_encoding == "bam"
               else attention.alibi_bias(p.positions, p.key_positions, z))
    q_in = q if p.ssmax is None else attention.ssmax_queries(q, p.ssmax)
    y = attention.postprocess_attn(attention.attn(q_in, k, v, p.mask, bias), p.padding_mask)
    # reverse: output_proj, merge_heads, postprocess_attn, attn, preprocess_qkv, project, norm, hide_padding
    merged_bar, out_proj_bar = linear(f_bar, attention.merge_heads(y), p.out_proj)
    y_bar = attention.postprocess_attn(merged_bar.reshape(y.shape), p.padding_mask)  # zeroing is its own transpose
    q_bar, k_bar, v_bar, bias_bar = attn_vjp(cfg, q_in, k, v, p.mask, bias, y_bar)
    encoder_bar, h0_extra = {}, 0.0
    if p.ssmax is not None:  # q and the bias were multiplied by the factor f
        f = p.ssmax  # (batch | 1, heads, seq_q, 1)
        f_bar = (q_bar * q).sum(axis=-1, keepdims=True).transpose(0, 2, 1, 3)
        q_bar = q_bar * f.transpose(0, 2, 1, 3)
        if raw is not None:
            f_bar, bias_bar = f_bar + (bias_bar * raw).sum(axis=-1, keepdims=True), bias_bar * f
        lengths = ssmax_lengths(p.positions, p.key_positions, cfg, p.key_positions.shape[-1])
        encoder_bar["ssmax.s"] = ssmax_factor_vjp(f_bar, lengths, z.dtype)
    if cfg.position_encoding == "bam":
        encoder_bar.update(bam_bias_vjp(bias_bar, p.encoder, p.positions, p.key_positions, cfg))
    if cfg.position_encoding in PAPE_ENCODINGS:
        h0_extra, grads = content_bias_vjp(bias_bar, h0, p.encoder, p.positions, p.key_positions, cfg)
        encoder_bar.update(grads)
    if p.rope is not None:  # hope's map is symmetric: its own transpose
        back = apply_hope if cfg.position_encoding == "hope" else apply_rope_vjp
        q_bar, k_bar = back(q_bar, *p.rope), back(k_bar, *p.rope)
    qkv_bar = np.stack([q_bar, k_bar, v_bar], axis=2).reshape(*h.shape[:2], 3 * cfg.hidden_size)
    h_bar, qkv_w_bar = linear(qkv_bar, h, p.qkv)
    h0_bar, norm_bar = apply_norm_vjp(cfg.norm_type, p.norm, h0, h_bar)
    grads = {"qkv": qkv_w_bar, "out_proj": out_proj_bar, "norm": norm_bar, "encoder": encoder_bar}
    return attention.hide_padding(h0_bar + h0_extra, p.padding_mask), grads


def gate_vjp(gate_params, g_bar, f1, f2):
    """(f1_bar, f2_bar, grads) of g = sigmoid([F1; F2] @ W_g^T + b_g) for g_bar (batch, seq, 1)."""
    w, b = gate_params
    both = np.concatenate([f1, f2], axis=-1)  # (batch, seq, 2 d_model)
    g = sigmoid(both @ w.T + b)
    u_bar = g_bar * g * (1.0 - g)
    both_bar, w_bar = linear_vjp(u_bar, both, w)
    d = f1.shape[-1]
    return both_bar[..., :d], both_bar[..., d:], {"gate_weight": w_bar, "gate_bias": u_bar.sum(axis=(0, 1))}


def ode_block_vjp(params, x, config, z1_bar, padding_mask=None):
    """(x_bar, params_bar) of z(1) = ode_block(params, x, config, padding_mask) for the cotangent
    z1_bar of z(1), (batch, seq, d_model) like x. The default SelfAttention (a variant's
    backward is its own port's autodiff)."""
    cfg, attention = _checked(params, x, config, padding_mask, None)
    check_input(z1_bar, cfg, name="z1_bar")
    if z1_bar.shape != x.shape or z1_bar.dtype != x.dtype:
        raise ValueError(f"z1_bar: expected x's shape {x.shape} and dtype {x.dtype}; got {z1_bar.shape} {z1_bar.dtype}")
    prepared = attention.prepare(params, x, padding_mask)
    states = attention.integrate(prepared, x)
    tableau, steps = solver_of(cfg), cfg.ode_steps

    def f(t, z):
        return attention.evaluate(prepared, t, z)

    def f_vjp(t, z, f_bar):
        return evaluate_vjp(attention, prepared, t, z, f_bar)

    if isinstance(tableau, MultistepMethod):
        z_bar, grads = multistep_vjp(f, f_vjp, tableau, steps, z1_bar, states)
        return z_bar, params_bar(params, grads)

    def gate_back(g_bar, f1, f2):
        return gate_vjp(prepared.gate, g_bar, f1, f2)

    z_bar, grads = z1_bar, {}
    for n, t0 in reversed(list(enumerate(step_times(steps)))):
        z_bar, step_grads = rk_step_vjp(f, f_vjp, t0, 1.0 / steps, states[n], tableau, z_bar,
                                        attention.solution_gate(prepared), gate_back)
        grads = add_grads(grads, step_grads)
    return z_bar, params_bar(params, grads)


def params_bar(params: dict, grads: dict) -> dict:
    """The gradients by parameter name, each with its parameter's shape and dtype: the quantised
    weights' gradients are the weights' (the straight-through estimator), the casts are the
    identity (BAM's thetas are worked in float64, as their forward is, and returned as given)."""
    out = {QKV: grads["qkv"], OUT_PROJ: grads["out_proj"]}
    out.update({NORM_PREFIX + name: g for name, g in grads["norm"].items()})
    out.update({POS_PREFIX + name: g for name, g in grads.get("encoder", {}).items()})
    if "gate_weight" in grads:
        out[GATE_WEIGHT], out[GATE_BIAS] = grads["gate_weight"], grads["gate_bias"]
    return {name: np.asarray(out[name]).reshape(np.shape(params[name])).astype(np.asarray(params[name]).dtype, copy=False)
            for name in params}

"""qkvflow's time-dependent weights (ode_ref/temporal.py): the stack against one written here from the
paper's and the released code's documented formulas (loops over tokens, heads and each weight's entries),
the embedding, t at each step's end, causality and padding, any step count on the same weights,
the released module paths as keys, and every refusal."""

import math

import numpy as np
import pytest

import ode_ref as R
from ode_ref.encoder_config import TEMPORAL_HOLDS
from ode_ref.temporal import step_ends, time_embedding
from odeattn.conformance.cases.encoder_cases import padding_of

C, H, FF, TE, SD = 8, 2, 12, 4, 2


def config(steps=3, **more):
    return R.ODEEncoderConfig(C, H, FF, encoder_layers=steps, encoder_normalize_before=True, time_embed_dim=TE,
                              sinusoidal_dim=SD, **more)


def inputs(cfg, seed=0):
    """The parameters, x (2, 5, C) and the encoder cases' padding (the last row's last 2 tokens)."""
    return R.init_encoder_params(cfg, seed, perturb=True), np.random.default_rng(seed).normal(size=(2, 5, C)), padding_of(2, 5)


# ---- written from the formulas: a token and a head at a time, W(t) as haliax's (in, out) array -----
def silu(x):
    return x / (1.0 + np.exp(-x))


def hand_tau(p, prefix, t):
    d = SD
    e = np.array([t] + [math.sin(1000 * t * 10000 ** (-i / d)) for i in range(d)]
                 + [math.cos(1000 * t * 10000 ** (-i / d)) for i in range(d)])
    return p[prefix + "lin2.weight"] @ silu(p[prefix + "lin1.weight"] @ e + p[prefix + "lin1.bias"]) + p[prefix + "lin2.bias"]


def hand_linear(p, prefix, x, t, n_in, n_out):
    """y_o = sum_i x_i W[i, o] + sum_k tau_k f_b[k, o], W[i, o] = f_W row i out + o (the (in, out) pair flattened)."""
    tau = hand_tau(p, prefix, t)
    f_w, f_bias = p[prefix + "f_W.weight"], p[prefix + "f_W.bias"]
    w = np.array([[f_w[i * n_out + o] @ tau + f_bias[i * n_out + o] for o in range(n_out)] for i in range(n_in)])
    return np.array([[sum(row[i] * w[i, o] for i in range(n_in)) for o in range(n_out)] for row in x]) + tau @ p[prefix + "f_b"]


def hand_norm(p, prefix, z, t):
    tau = hand_tau(p, prefix, t)
    mean = z.mean(-1, keepdims=True)
    normed = (z - mean) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    return normed * (p[prefix + "f_weight"] @ tau + 1.0) + p[prefix + "f_bias"] @ tau


def hand_f(p, z, mask, t):
    b, s, d = z.shape[0], z.shape[1], C // H
    out = np.zeros_like(z)
    for n in range(b):  # a real query sees the real keys j <= i; a padded one every real key
        qkv = hand_linear(p, "block.attn.c_attn.", hand_norm(p, "block.attn_ln.", z[n], t), t, C, 3 * C)
        heads = np.zeros((s, C))
        for h in range(H):
            q, k, v = (qkv[:, j * C + h * d:j * C + (h + 1) * d] for j in range(3))
            for i in range(s):
                seen = [j for j in range(s) if mask[n, j] and (j <= i or not mask[n, i])]
                scores = np.array([q[i] @ k[j] / math.sqrt(d) for j in seen])
                a = np.exp(scores - scores.max())
                heads[i, h * d:(h + 1) * d] = (a / a.sum()) @ v[seen]
        attn = hand_linear(p, "block.attn.c_proj.", heads, t, C, C)
        u = hand_linear(p, "block.mlp.c_fc.", hand_norm(p, "block.mlp_ln.", z[n], t), t, C, FF)
        gelu = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
        out[n] = attn + hand_linear(p, "block.mlp.c_proj.", gelu, t, FF, C)
    return out


def hand_stack(p, x, mask, steps):
    z = x
    for k in range(steps):
        z = z + hand_f(p, z, mask, (k + 1) / steps) / steps
    mean = z.mean(-1, keepdims=True)
    return (z - mean) / np.sqrt(z.var(-1, keepdims=True) + 1e-5) * p["ln_f.weight"] + p["ln_f.bias"]


@pytest.mark.parametrize("steps", [1, 3])
def test_the_stack_is_the_formulas(steps):
    cfg = config(steps)
    params, x, mask = inputs(cfg)
    np.testing.assert_allclose(R.ode_encoder(params, x, cfg, mask), hand_stack(params, x, mask, steps), rtol=0, atol=1e-12)


def test_the_embedding_and_the_step_times():
    e = time_embedding(0.25, 4)
    w = 10000.0 ** (-np.arange(4) / 4)
    assert e.shape == (9,) and e[0] == 0.25
    # no 2 pi in the angle; the two spellings of w differ by an ulp (2.2e-16), 250 times that in the angle
    np.testing.assert_allclose(e[1:5], np.sin(250.0 * w), rtol=0, atol=250 * 4.5e-16)
    np.testing.assert_allclose(e[5:], np.cos(250.0 * w), rtol=0, atol=250 * 4.5e-16)
    assert step_ends(4) == [0.25, 0.5, 0.75, 1.0]  # each step's end: the last evaluation at t = 1


def test_causal_and_padded_keys_unseen():
    """A later token, or a padded one (NaN or Inf, its value held at 0), changes no real earlier
    token's output, to the bit."""
    cfg = config()
    params, x, mask = inputs(cfg)
    z = R.ode_encoder(params, x, cfg, mask)
    moved = x.copy()
    moved[0, 3] += 1.0
    moved[1, 4], moved[1, 3] = np.nan, np.inf  # padded
    with np.errstate(invalid="ignore"):  # the padded token's own norm meets the NaN
        z2 = R.ode_encoder(params, moved, cfg, mask)
    np.testing.assert_array_equal(z2[0, :3], z[0, :3])
    np.testing.assert_array_equal(z2[1, :3], z[1, :3])
    assert not np.array_equal(z2[0, 3:], z[0, 3:])


def test_the_same_weights_run_at_any_step_count():
    """The parameters do not depend on encoder_layers: one set runs at 1, 2 and 5 steps, each its own
    z. (No convergence in the step count is asserted: e(t) holds sin(1000 t), of period 0.006 in t,
    so f changes faster in t than any step count here resolves.)"""
    params, x, mask = inputs(config(2))
    assert all(R.encoder_param_shapes(config(n)) == R.encoder_param_shapes(config(2)) for n in (1, 5))
    z = [R.ode_encoder(params, x, config(n), mask) for n in (1, 2, 5)]
    assert all(np.isfinite(a).all() for a in z) and min(np.abs(a - b).max() for a, b in zip(z, z[1:])) > 1e-3


def test_the_keys_are_the_released_module_paths():
    """qkvflow's NeuralOdeTransformer: block (attn_ln, attn.c_attn, attn.c_proj, mlp_ln, mlp.c_fc,
    mlp.c_proj) and ln_f; a TemporalLinear holds lin1, lin2, f_W and f_b, a TemporalLayerNorm lin1,
    lin2, f_weight and f_bias."""
    mlp = ["lin1.weight", "lin1.bias", "lin2.weight", "lin2.bias"]
    linear, norm = mlp + ["f_W.weight", "f_W.bias", "f_b"], mlp + ["f_weight", "f_bias"]
    expected = {f"block.{n}.{leaf}" for n in ("attn_ln", "mlp_ln") for leaf in norm}
    expected |= {f"block.{n}.{leaf}" for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj") for leaf in linear}
    shapes = R.encoder_param_shapes(config())
    assert set(shapes) == expected | {"ln_f.weight", "ln_f.bias"}
    assert shapes["block.attn.c_attn.f_W.weight"] == (C * 3 * C, TE) and shapes["block.mlp.c_fc.f_b"] == (TE, FF)
    assert shapes["block.attn_ln.lin1.weight"] == (TE, 2 * SD + 1) and shapes["block.mlp_ln.f_weight"] == (C, TE)
    released = R.init_encoder_params(config(), 0)
    assert not released["block.attn_ln.f_weight"].any() and 0 < np.abs(released["block.attn.c_attn.f_b"]).max() < 1e-3


@pytest.mark.parametrize("field", sorted(TEMPORAL_HOLDS))
def test_a_field_the_block_holds_is_refused_otherwise(field):
    other = {"family": "rk2", "profile": "released", "encoder_normalize_before": False, "macaron": True,
             "encoder_history_type": R.CORRECTOR, "attention_dropout": 0.1, "activation_dropout": 0.1}[field]
    with pytest.raises(ValueError, match=rf"^{field}: qkvflow's time-dependent block"):
        R.ODEEncoderConfig(C, H, FF, time_embed_dim=TE, **{**TEMPORAL_HOLDS, field: other})


@pytest.mark.parametrize("fields, message", [
    ({"time_embed_dim": -1}, r"^time_embed_dim: expected an integer >= 0; got -1"),
    ({"time_embed_dim": 2.0}, r"^time_embed_dim: expected an integer >= 0; got 2.0"),
    ({"sinusoidal_dim": 3}, r"^sinusoidal_dim: expected an even integer .*; got 3"),
    ({"sinusoidal_dim": 0}, r"^sinusoidal_dim: expected an integer >= 2; got 0"),
])
def test_bad_sizes_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        R.ODEEncoderConfig(C, H, FF, encoder_normalize_before=True, **fields)

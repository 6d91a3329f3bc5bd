"""The ODE Transformer's encoder (ode_ref.encoder*): the layer against a hand-written one, each
family's formula under both profiles written out by hand, the stack, the profiles' difference,
padding, the parameter names and init, and every refusal."""

import math
import types

import numpy as np
import pytest

import ode_ref as R
from ode_ref.encoder import ODEEncoderStages, block_tableau
from ode_ref.tableaus import ButcherTableau
from ode_ref.encoder_params import stack_params
from odeattn.conformance.cases.encoder_cases import SUCCESSOR_ROWS

C, H, FF = 8, 2, 12


def config(family="rk2", profile="paper", pre=False, layers=1, **more):
    return R.ODEEncoderConfig(C, H, FF, encoder_layers=layers, family=family, profile=profile,
                              encoder_normalize_before=pre, **more)


def inputs(cfg, seed=0, padded=True):
    params = R.init_encoder_params(cfg, seed, perturb=True)
    x = np.random.default_rng(seed).normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    if padded:
        mask[1, 3:] = False
    return params, x, mask


# ---- a hand-written layer: loops over batch and heads, the formulas as fairseq writes them ------
def hand_layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def hand_attention(p, x, mask):
    out = np.zeros_like(x)
    d = C // H
    for b in range(x.shape[0]):
        qkv = x[b] @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]  # (seq, 3C)
        heads = []
        for h in range(H):
            q = qkv[:, h * d:(h + 1) * d] * d**-0.5
            k = qkv[:, C + h * d:C + (h + 1) * d]
            v = qkv[:, 2 * C + h * d:2 * C + (h + 1) * d]
            s = q @ k.T
            s[:, ~mask[b]] = -np.inf
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ v)
        out[b] = np.concatenate(heads, -1) @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
    return out


def hand_layer(params, i, x, mask, pre, cfg=None):
    """fairseq's layer; with cfg.macaron, macaron-net's: residual + fc_factor * macaron FFN first
    (norm 2), fc_factor 0.5 on both FFNs, or on the first alone for the ODE Transformer's copy."""
    p = {k[len(f"layers.{i}."):]: v for k, v in params.items() if k.startswith(f"layers.{i}.")}
    ln = [lambda z, j=j: hand_layer_norm(z, p[f"layer_norms.{j}.weight"], p[f"layer_norms.{j}.bias"]) for j in (0, 1, 2)
          if f"layer_norms.{j}.weight" in p]
    ffn = lambda z, n="": np.maximum(z @ p[f"{n}fc1.weight"].T + p[f"{n}fc1.bias"], 0) @ p[f"{n}fc2.weight"].T + p[f"{n}fc2.bias"]  # noqa: E731
    macaron = cfg is not None and cfg.macaron
    factor = 0.5 if macaron and cfg.macaron_profile == "paper" else 1.0
    if pre:
        if macaron:
            x = x + 0.5 * ffn(ln[2](x), "macaron_")
        x = x + hand_attention(p, ln[0](x), mask)
        return x + factor * ffn(ln[1](x))
    if macaron:
        x = ln[2](x + 0.5 * ffn(x, "macaron_"))
    x = ln[0](x + hand_attention(p, x, mask))
    return ln[1](x + factor * ffn(x))


def hand_block(params, i, y, mask, cfg):
    """Each family's block as the paper (F) and the released code (L) write it."""
    L = lambda z: hand_layer(params, i, z, mask, cfg.encoder_normalize_before, cfg)  # noqa: E731
    k = L if cfg.profile == "released" else (lambda z: L(z) - z)
    fam = cfg.family
    if fam.endswith("_ema"):  # PCformer's predictor, its code's stage inputs and alpha * torch.pow(1 - alpha, m)
        a = params["alpha"][i] if cfg.layer_wise else params["alpha"]
        ks = [k(y)]
        inputs = {"rk2_ema": [lambda: y + ks[0]], "rk3_ema": [lambda: y + 1 / 2 * ks[0], lambda: y - ks[0] + 2 * ks[1]],
                  "rk4_ema": [lambda: y + 1 / 2 * ks[0], lambda: y + 1 / 2 * ks[1], lambda: y + ks[2]]}[fam]
        for stage_input in inputs:
            ks.append(k(stage_input()))
        return y + sum(a * np.power(1 - a, len(ks) - 1 - j) * kj for j, kj in enumerate(ks))
    if fam == "euler":
        return y + k(y)
    k1 = k(y)
    if fam in ("rk2", "rk2_gated", "rk2_weighted"):
        k2 = k(y + k1)
        if fam == "rk2":
            return y + (k1 + k2) / 2
        if fam == "rk2_weighted":
            return y + params["alpha"][0] * k1 + params["alpha"][1] * k2
        g = 1 / (1 + np.exp(-(np.concatenate([k1, k2], -1) @ params["gate_linear.weight"].T + params["gate_linear.bias"])))
        return y + g * k1 + (1 - g) * k2
    if fam == "rk3":
        k2 = k(y + k1 / 2)
        k3 = k(y - k2 + 2 * k2) if cfg.profile == "released" else k(y - k1 + 2 * k2)  # the released line as written
        return y + (k1 + 4 * k2 + k3) / 6
    k2 = k(y + k1 / 2)
    k3 = k(y + k2 / 2)
    k4 = k(y + k3)
    return y + (k1 + 2 * k2 + 2 * k3 + k4) / 6


def hand_encoder(params, x, mask, cfg):
    """The blocks; with PCformer's corrector, its history as the released code keeps it: stacked,
    weighted by a row of weight or weight_c and summed over the stack's axis."""
    ln = lambda z, name: hand_layer_norm(z, params[name + ".weight"], params[name + ".bias"])  # noqa: E731
    history = [x]
    for i in range(cfg.encoder_layers):
        x = hand_block(params, i, x, mask, cfg)
        if cfg.encoder_history_type is None:
            continue
        c = len(history) + 1
        pop = lambda w: (np.stack(history) * params[w][c - 1, :c].reshape(-1, 1, 1, 1)).sum(0)  # noqa: E731
        if cfg.encoder_normalize_before:
            history.append(ln(x, f"history.rouge_predictions_norm.{i}"))
            history[-1] = ln(hand_layer(params, i, pop("history.weight"), mask, True, cfg), f"history.layer_norms.{i}")
            x = pop("history.weight_c")
        else:
            history.append(x)
            x = ln(pop("history.weight_c"), f"history.layer_norms.{i}")
    if cfg.encoder_normalize_before:
        x = hand_layer_norm(x, params["layer_norm.weight"], params["layer_norm.bias"])
    return x


CONFIGS = [(fam, prof, pre, {}) for fam in R.FAMILIES for prof in R.PROFILES for pre in (False, True)
           if not (fam == "euler" and prof == "released")]
SUCCESSORS = [(r[0], r[1], pre, r[6]) for r in SUCCESSOR_ROWS for pre in (False, True)]  # both norms for each


@pytest.mark.parametrize("family, profile, pre, more", CONFIGS + SUCCESSORS)
def test_each_formula_is_the_hand_written_one(family, profile, pre, more):
    cfg = config(family, profile, pre, layers=2, **more)
    params, x, mask = inputs(cfg)
    np.testing.assert_allclose(R.ode_encoder(params, x, cfg, mask), hand_encoder(params, x, mask, cfg), rtol=0, atol=1e-12)


def test_euler_is_the_plain_layer():
    cfg = config("euler", pre=True)
    params, x, mask = inputs(cfg)
    layer = hand_layer(params, 0, x, mask, True)
    final = hand_layer_norm(layer, params["layer_norm.weight"], params["layer_norm.bias"])
    np.testing.assert_allclose(R.ode_encoder(params, x, cfg, mask), final, rtol=0, atol=1e-13)


def test_the_profiles_differ_and_by_how_much():
    """released - paper, relative to the paper's output: every stage carries y again, so the
    released blocks are far from the paper's: measured on this draw (two blocks, C = 8), 3.1 (rk2_gated)
    to 6.4 (rk2_weighted) post-norm, 0.88 to 1.0 pre-norm, where the final norm rescales."""
    diffs = {}
    for family in R.FAMILIES:
        if family == "euler":
            continue
        for pre in (False, True):
            params, x, mask = inputs(config(family, "paper", pre, layers=2))
            paper = R.ode_encoder(params, x, config(family, "paper", pre, layers=2), mask)
            released = R.ode_encoder(params, x, config(family, "released", pre, layers=2), mask)
            diffs[family, pre] = np.abs(released - paper).max() / np.abs(paper).max()
    assert min(diffs.values()) > 0.5, diffs
    assert min(v for (f, pre), v in diffs.items() if not pre) > 2.0, diffs


def test_released_rk3_is_not_kuttas():
    """The released third stage reads y + k_2 (second order); Kutta's reads y - k_1 + 2 k_2."""
    assert block_tableau(config("rk3")).a[2] == (-1.0, 2.0)
    assert block_tableau(config("rk3", "released")).a[2] == (0.0, 1.0)
    assert block_tableau(config("rk4", "released")) is block_tableau(config("rk4"))


def test_padded_tokens_reach_no_real_token_and_are_not_zeroed():
    cfg = config("rk2_gated", layers=2)
    params, x, mask = inputs(cfg)
    y = R.ode_encoder(params, x, cfg, mask)
    x2 = x.copy()
    x2[1, 3:] = 1e3 * np.random.default_rng(5).normal(size=(2, C))
    y2 = R.ode_encoder(params, x2, cfg, mask)
    np.testing.assert_array_equal(y2[mask], y[mask])
    assert np.abs(y[1, 3:]).min() > 0  # computed like real queries, not zeroed
    unmasked = R.ode_encoder(params, x, cfg)
    np.testing.assert_allclose(unmasked[0], y[0], rtol=0, atol=1e-13)  # sequence 0 has no padding
    assert np.abs(unmasked[1] - y[1]).max() > 1e-3


def test_float32_in_float32_out_close_to_float64():
    cfg = config("rk4", pre=True)
    params, x, mask = inputs(cfg)
    y32 = R.ode_encoder(params, x.astype(np.float32), cfg, mask)
    assert y32.dtype == np.float32
    assert np.abs(y32 - R.ode_encoder(params, x, cfg, mask)).max() < 1e-4


def test_parameter_names_are_the_released_keys():
    shapes = R.encoder_param_shapes(config("rk2_gated", pre=True, layers=2))
    assert list(shapes)[:12] == [f"layers.0.{n}" for n in (
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "layer_norms.0.weight", "layer_norms.0.bias",
        "layer_norms.1.weight", "layer_norms.1.bias")]
    assert shapes["layers.1.self_attn.in_proj_weight"] == (3 * C, C) and shapes["layers.1.fc1.weight"] == (FF, C)
    assert list(shapes)[24:] == ["layer_norm.weight", "layer_norm.bias", "gate_linear.weight", "gate_linear.bias"]
    assert shapes["gate_linear.weight"] == (1, 2 * C)
    post = R.encoder_param_shapes(config("rk2_weighted"))
    assert "layer_norm.weight" not in post and post["alpha"] == (2,) and "gate_linear.weight" not in post


def test_init_is_the_released_one():
    cfg = R.ODEEncoderConfig(64, 4, 256, family="rk2_weighted", encoder_normalize_before=True)
    p = R.init_encoder_params(cfg)
    w = p["layers.0.fc1.weight"]
    bound = math.sqrt(6 / (256 + 64))
    assert np.abs(w).max() <= bound and w.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert np.abs(p["layers.0.self_attn.in_proj_weight"]).max() <= math.sqrt(6 / (4 * 64))
    assert all(np.all(p[k] == 0) for k in p if k.endswith("bias"))
    assert np.all(p["layer_norm.weight"] == 1) and np.all(p["alpha"] == 1)


def test_stack_params_drop_only_the_embedding():
    sd = {"embed_tokens.weight": 0, "embed_positions._float_tensor": 0, "version": 0, "layers.0.fc1.bias": 1, "other": 2}
    assert stack_params(sd) == {"layers.0.fc1.bias": 1, "other": 2}


@pytest.mark.parametrize("given", [[1, 2], "weights.pt", {1: 2}])
def test_stack_params_refuses_what_is_not_a_state_dict_by_name(given):
    with pytest.raises(TypeError, match=r"^state_dict: expected a dict of parameter name -> array; got "):
        stack_params(given)


def test_family_maps_onto_the_released_pair():
    assert config("rk2_gated").enc_calculate_num == 2 and config("rk2_gated").rk_type == "learnable"
    assert R.ODEEncoderConfig(C, H, FF, enc_calculate_num=2, rk_type="initialization").family == "rk2_weighted"
    assert R.ODEEncoderConfig(C, H, FF).family == "euler"
    cfg = config("rk4", "released", pre=True, layers=3)
    assert R.ODEEncoderConfig.from_any(cfg.to_dict()) == cfg
    assert R.ODEEncoderConfig(C, H, FF, enc_calculate_num=4, rk_type="ema").family == "rk4_ema"
    macaron_net_args = types.SimpleNamespace(encoder_embed_dim=C, encoder_attention_heads=H, encoder_ffn_embed_dim=FF,
                                             macaron="new", encoder_normalize_before=True, relu_dropout=0.1)
    assert R.ODEEncoderConfig.from_any(macaron_net_args).macaron is True  # its WMT architectures' value
    pcformer_args = types.SimpleNamespace(encoder_embed_dim=C, encoder_attention_heads=H, encoder_ffn_embed_dim=FF,
                                          enc_calculate_num=4, enc_learnable_type="ema", alpha_type="scalar", layer_wise=True,
                                          encoder_history_type=R.CORRECTOR, encoder_normalize_before=True)
    cfg = R.ODEEncoderConfig.from_any(pcformer_args)
    assert (cfg.family, cfg.layer_wise, cfg.corrector) == ("rk4_ema", True, True)
    for learnable, family in (("gated", "rk2_gated"), ("none", "rk2")):  # its forward's other branches
        args = types.SimpleNamespace(**{**vars(pcformer_args), "enc_calculate_num": 2, "enc_learnable_type": learnable,
                                        "layer_wise": False})
        assert R.ODEEncoderConfig.from_any(args).family == family


def test_pcformers_ema_weights_are_no_consistent_tableau():
    """At alpha = 1/2 the weights sum to 1 - (1/2)^s: 0.75 (two stages), 0.9375 (four); a tableau
    with them is refused, which is why the predictor is a combination of its own."""
    stages = ODEEncoderStages(config("rk4_ema"))
    for s, total in ((2, 0.75), (3, 0.875), (4, 0.9375)):
        weights = stages.ema_weights(np.array([0.5]), s)
        assert float(sum(weights)[0]) == total and float(weights[-1][0]) == 0.5
    rk4 = block_tableau(config("rk4_ema"))
    with pytest.raises(ValueError, match=r"sum\(b\) = 0.9375 != 1"):
        ButcherTableau("rk4_ema", 1, rk4.c, rk4.a, tuple(float(w[0]) for w in weights))


@pytest.mark.parametrize("fields, message", [
    (dict(family="rk5"), r"family: expected one of 'euler', .*got 'rk5'"),
    (dict(profile="fairseq"), r"profile: expected one of 'paper', 'released'; got 'fairseq'"),
    (dict(family="euler", profile="released"), r"released profile has no 'euler' block; it writes rk2 = \(2, 'standard'\)"),
    (dict(enc_calculate_num=3, rk_type="learnable"), r"enc_calculate_num, rk_type: expected one of the pairs .*got \(3, 'learnable'\)"),
    (dict(rk_type="learnbale", enc_calculate_num=2), r"got \(2, 'learnbale'\)"),
    (dict(family="rk2", rk_type="learnable"), r"family: 'rk2' is .*\(2, 'standard'\); got \(None, 'learnable'\)"),
    (dict(encoder_ffn_embed_dim=0), r"encoder_ffn_embed_dim: expected an integer >= 1; got 0"),
    (dict(encoder_attention_heads=3), r"encoder_embed_dim: expected a multiple of encoder_attention_heads=3; got 8"),
    (dict(encoder_layers=0), r"encoder_layers: expected an integer >= 1; got 0"),
    (dict(encoder_normalize_before="yes"), r"encoder_normalize_before: expected True or False"),
    (dict(dropout=1.0), r"dropout: expected a number in \[0, 1\); got 1.0"),
    (dict(macaron="yes"), r"macaron: expected True or False \(or macaron-net's 'new', read as True\); got 'yes'"),
    (dict(macaron=True, macaron_profile="odet"), r"macaron_profile: expected one of 'paper', 'released'; got 'odet'"),
    (dict(macaron_profile="released"), r"macaron_profile: 'released' sets a Macaron layer's halves; got macaron=False"),
    (dict(family="rk2_ema", alpha_type="channel"), r"alpha_type: expected one of 'scalar', 'vector'; got 'channel'"),
    (dict(family="rk2_ema", alpha_type="vector", layer_wise=True), r"layer_wise: True sets a scalar alpha per layer"),
    (dict(family="rk2", layer_wise=True), r"alpha_type, layer_wise: set an ema family's alpha .* with family 'rk2'"),
    (dict(family="rk3_ema", alpha_type="vector"), r"rk3_ema's alpha is one scalar, as released; got \('vector', False\)"),
    (dict(family="rk2_ema", layer_wise=1), r"layer_wise: expected True or False; got 1"),
    (dict(encoder_history_type="dense"), r"encoder_history_type: expected None or 'rk_predicotor_multistep_corrector' .*got 'dense'"),
    (dict(enc_calculate_num=4, rk_type="gated"), r"expected one of the pairs .*rk4_ema = \(4, 'ema'\); got \(4, 'gated'\)"),
])
def test_bad_config_is_refused(fields, message):
    base = dict(encoder_embed_dim=C, encoder_attention_heads=H, encoder_ffn_embed_dim=FF)
    with pytest.raises(ValueError, match=message):
        R.ODEEncoderConfig(**{**base, **fields})


def test_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match=r"config: unknown key\(s\) \['ffn_dim'\]"):
        R.ODEEncoderConfig.from_any(dict(encoder_embed_dim=C, encoder_attention_heads=H, encoder_ffn_embed_dim=FF, ffn_dim=4))


def test_bad_parameters_and_inputs_are_refused():
    cfg = config("rk2_weighted")
    params, x, mask = inputs(cfg)
    with pytest.raises(ValueError, match=r"params\['alpha'\]: rk2_weighted has one weight per stage, shape \(2,\); got shape \(3,\)"):
        R.ode_encoder({**params, "alpha": np.ones(3)}, x, cfg, mask)
    with pytest.raises(ValueError, match=r"missing \['layers.0.fc1.bias'\]"):
        R.ode_encoder({k: v for k, v in params.items() if k != "layers.0.fc1.bias"}, x, cfg, mask)
    with pytest.raises(ValueError, match=r"params\['layers.0.fc2.weight'\]: expected shape \(8, 12\); got \(12, 8\)"):
        R.ode_encoder({**params, "layers.0.fc2.weight": np.zeros((12, 8))}, x, cfg, mask)
    with pytest.raises(ValueError, match=r"x: expected shape \(batch, seq, 8\)"):
        R.ode_encoder(params, x[..., :4], cfg, mask)
    empty = mask.copy()
    empty[0] = False
    with pytest.raises(ValueError, match=r"padding_mask: expected at least one real token .* sequence\(s\) \[0\] have none"):
        R.ode_encoder(params, x, cfg, empty)

"""The rest of the seed's positional family in the spec: sinusoidal_rotary, hope, the three PaPE
encoders, BAM and SSMax. Config checks, where each acts, the decisions, cached decoding."""

import dataclasses

import numpy as np
import pytest

import ode_ref as R
from ode_ref import positions as P

FAMILY = ("sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam")


def cfg(encoding="rope", **kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True,
                                 positional_encoding=encoding), **kw})


def inputs(c, batch=2, seq=6, seed=0, padded=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, seq, c.hidden_size))
    pm = np.ones((batch, seq), bool)
    if padded:
        pm[0, :2] = False
    return x, pm


def test_the_seeds_fields_and_defaults():
    d = R.ODEConfig(hidden_size=8, num_heads=2)
    got = {f: getattr(d, f) for f in ("sinusoidal_max_len", "sinusoidal_base", "sinusoidal_scale", "hope_base",
                                     "hope_damping", "pape_num_parabolas", "pape_num_positions", "bam_learn_mu",
                                     "bam_theta_init", "bam_mu_init", "bam_eps", "use_ssmax", "ssmax_s_init",
                                     "ssmax_length", "layer_idx")}
    assert got == dict(sinusoidal_max_len=512, sinusoidal_base=1e4, sinusoidal_scale=1.0, hope_base=1e4,
                       hope_damping=0.01, pape_num_parabolas=4, pape_num_positions=1, bam_learn_mu=False,
                       bam_theta_init=0.0, bam_mu_init=0.0, bam_eps=1e-5, use_ssmax=False, ssmax_s_init=1.0,
                       ssmax_length="visible", layer_idx=0)
    for null in ("none", "nope", "sinusoidal_absolute", "learned_absolute"):
        assert cfg(null).position_encoding == "none"  # they act at the embeddings, not inside f
    assert not cfg("bam", ode_use_pe=False, use_ssmax=True).ssmax  # SSMax belongs to the encoder object


@pytest.mark.parametrize("field, bad, words", [
    ("positional_encoding", "xpos", "is not implemented"),
    ("pape_num_positions", 2, "the seed's ODE path crashes"),
    ("bam_eps", 0.0, "expected a finite number > 0"),
    ("ssmax_s_init", -1.0, "expected a finite number > 0"),
    ("hope_damping", -0.01, "expected a finite number >= 0"),
    ("sinusoidal_max_len", 0, "expected an integer >= 1"),
    ("layer_idx", -1, "expected an integer >= 0"),
    ("ssmax_length", "full", "expected one of 'visible', 'padded'"),
    ("use_ssmax", 1, "expected True or False"),
    ("bam_mu_init", float("nan"), "expected a finite number"),
    ("hope_base", "1e4", "expected a finite number > 0"),
])
def test_bad_values_are_refused_by_name(field, bad, words):
    with pytest.raises(ValueError, match=f"^{field}: .*{words}"):
        cfg("pape", **{field: bad})


def test_pape_ri_takes_its_factor_n():
    assert cfg("pape_ri", pape_num_positions=3).pape_num_positions == 3


def test_the_parameters_carry_the_seeds_names():
    names = {e: [k for k in R.param_shapes(cfg(e, use_ssmax=True)) if k.startswith("pos_encoder.")] for e in FAMILY}
    assert names["sinusoidal_rotary"] == names["hope"] == ["pos_encoder.ssmax.s"]
    assert names["pape"] == names["pape_efficient"] == ["pos_encoder.position.weight", "pos_encoder.ab.weight",
                                                        "pos_encoder.ssmax.s"]
    assert names["pape_ri"] == ["pos_encoder.position_scales", "pos_encoder.a.weight", "pos_encoder.ssmax.s"]
    assert names["bam"] == ["pos_encoder.theta_alpha", "pos_encoder.theta_beta", "pos_encoder.ssmax.s"]
    shapes = R.param_shapes(cfg("pape", bam_learn_mu=True))
    assert shapes["pos_encoder.ab.weight"] == (2 * 3 * 4, 12) and shapes["pos_encoder.position.weight"] == (12, 1)
    assert R.param_shapes(cfg("pape_ri"))["pos_encoder.position_scales"] == (1, 3, 1, 1)
    assert "pos_encoder.theta_mu" in R.param_shapes(cfg("bam", bam_learn_mu=True))
    with pytest.raises(ValueError, match="positional_encoding='bam'.*missing \\['pos_encoder.theta_alpha'"):
        R.check_params(R.init_params(cfg()), cfg("bam"))


def test_sinusoidal_rotary_is_rope_with_its_own_base_and_scale():
    x, pm = inputs(cfg())
    a = cfg("sinusoidal_rotary", sinusoidal_base=300.0, sinusoidal_scale=0.7, rope_base=9.0)
    b = cfg("rope", rope_base=300.0, rope_scaling=0.7)
    p = R.init_params(a, seed=3)
    np.testing.assert_array_equal(R.ode_block(p, x, a, pm), R.ode_block(p, x, b, pm))


def test_the_seeds_float32_sinusoidal_table_is_near_the_spec_and_documented():
    c = cfg("sinusoidal_rotary", hidden_size=48)  # head_dim 16: frequencies that float32 rounds
    cos32, sin32 = P.seed_sinusoidal_table(c)
    assert cos32.dtype == np.float32 and cos32.shape == (512, 8)
    cos, sin = P.rope_cos_sin(np.arange(512), c, np.float64)
    err = max(np.abs(cos32 - cos).max(), np.abs(sin32 - sin).max())
    assert 1e-6 < err < 511 * 2.0 ** -22  # float32 angles: about |angle| * u32, beyond one float32 rounding


def test_hope_maps_pairs_hyperbolically_and_is_not_relative():
    c = cfg("hope", hidden_size=6, num_heads=2, layer_idx=2, hope_base=100.0)  # head_dim 3: one pair, channel 2 kept
    ch, sh = P.hope_tables(np.arange(4)[None], c, 2, np.float64)
    g = 1 + 0.05 * 2
    a, r = np.clip(np.arange(4) * g, -12, 12), np.exp(-0.01 * g * np.arange(4))
    np.testing.assert_allclose(ch[0, :, 0], r * np.cosh(a), rtol=1e-15)
    np.testing.assert_allclose(sh[0, :, 0], r * np.sinh(a), rtol=1e-15)
    x = np.random.default_rng(1).normal(size=(1, 4, 2, 3))
    y = P.apply_hope(x, ch, sh)
    np.testing.assert_array_equal(y[..., 2], x[..., 2])
    np.testing.assert_allclose(y[..., 0], x[..., 0] * ch[:, :, None, 0] + x[..., 1] * sh[:, :, None, 0], rtol=1e-15)
    # the score of a fixed q, k pair at (i, j) depends on i + j: (0, 2) and (1, 3) differ, (0, 2) and (1, 1) agree
    q, k = x[:, :1].repeat(4, axis=1), x[:, 1:2].repeat(4, axis=1)
    hq, hk = P.apply_hope(q, ch, sh)[0, :, 0, :2], P.apply_hope(k, ch, sh)[0, :, 0, :2]
    hq, hk = hq / r[:, None], hk / r[:, None]  # without the damping, which is relative-free too
    s = hq @ hk.T
    assert abs(s[0, 2] - s[1, 3]) > 1e-3 and s[0, 2] == pytest.approx(s[1, 1], rel=1e-12)


def test_the_layer_index_reaches_hope_only():
    x, pm = inputs(cfg())
    for encoding, differs in (("hope", True), ("rope", False)):
        c0, c3 = cfg(encoding), cfg(encoding, layer_idx=3)
        p = R.init_params(c0, seed=4)
        assert (R.ode_block(p, x, c0, pm) != R.ode_block(p, x, c3, pm)).any() == differs


def test_pape_coefficients_come_from_the_raw_state():
    c = cfg("pape", mode="encoder", pape_num_parabolas=2)
    p = R.init_params(c, seed=5, perturb_norms=True)
    z = np.random.default_rng(2).normal(size=(1, 4, 12))
    pos = np.arange(4)[None]
    enc = {k[len("pos_encoder."):]: v for k, v in p.items() if k.startswith("pos_encoder.")}
    bias = P.pape_bias(z, enc, pos, pos, c)
    ab, w = enc["ab.weight"], enc["position.weight"][:, 0]
    i, j, h, m = 3, 1, 2, 1
    total = 0.0
    for m in range(2):
        a = np.log1p(np.exp(ab[0 * 6 + h * 2 + m] @ z[0, i]))
        b = ab[1 * 6 + h * 2 + m] @ z[0, i]
        total += -a * w[h * 2 + m] ** 2 * (i - j) ** 2 + b * w[h * 2 + m] * (i - j)
    assert bias[0, h, i, j] == pytest.approx(total * c.scale, rel=1e-13)


def test_pape_and_pape_efficient_are_one_function():
    x, pm = inputs(cfg())
    a, b = cfg("pape"), cfg("pape_efficient")
    p = R.init_params(a, seed=6, perturb_norms=True)
    np.testing.assert_array_equal(R.ode_block(p, x, a, pm), R.ode_block(p, x, b, pm))


def test_bam_at_init_is_the_constant_minus_one_and_its_alpha_is_on_the_query():
    c = cfg("bam", num_heads=1, hidden_size=4)
    p = R.init_params(c)
    enc = {"theta_alpha": p["pos_encoder.theta_alpha"], "theta_beta": p["pos_encoder.theta_beta"]}
    pos = np.arange(5)[None]
    np.testing.assert_array_equal(P.bam_bias(enc, pos, pos, c, np.float64), -np.ones((1, 1, 5, 5)))
    enc = {"theta_alpha": np.array([0.5]), "theta_beta": np.array([2.0])}  # alpha = e^-1, beta = 2
    got = P.bam_bias(enc, pos, pos, c, np.float64)[0, 0]
    i, j = 3, 1
    assert got[i, j] == pytest.approx(-(abs(j - np.exp(-1.0) * i) + 1e-5) ** 2, rel=1e-15)


def test_a_very_negative_bam_beta_stays_finite_and_hides_nothing():
    c = cfg("bam")
    p = R.init_params(c, seed=7)
    p["pos_encoder.theta_beta"] = np.full(3, -80.0)  # (0 + eps) ** -80 overflows: the seed's NaN
    p["pos_encoder.theta_alpha"] = np.zeros(3)  # alpha = 1: the |.| = 0 entry is the diagonal
    x, pm = inputs(c)
    for dtype in (np.float64, np.float32):
        assert np.isfinite(R.ode_block(p, x.astype(dtype), c, pm)).all()


def test_ssmax_multiplies_every_score_the_bias_included():
    c = cfg("alibi", use_ssmax=True, mode="encoder")
    p = R.init_params(c, seed=8, perturb_norms=True)
    x, _ = inputs(c, batch=1, padded=False)
    att = R.SelfAttention(c)
    prep = att.prepare(p, x)
    s = p["pos_encoder.ssmax.s"][None, :, None, None] * np.log(6.0)
    np.testing.assert_allclose(prep.ssmax, np.broadcast_to(s, prep.ssmax.shape), rtol=1e-15)
    plain = R.SelfAttention(dataclasses.replace(c, use_ssmax=False)).prepare(
        {k: v for k, v in p.items() if k != "pos_encoder.ssmax.s"}, x)
    np.testing.assert_allclose(prep.bias, plain.bias * s, rtol=1e-15)


def test_ssmax_lengths_follow_the_decision():
    pos_pad = np.array([[-1, -1, 0, 1, 2, 3]])  # cumsum - 1 of a left-padded row
    np.testing.assert_array_equal(P.ssmax_lengths(pos_pad, pos_pad, cfg(), 6), [[0, 0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(P.ssmax_lengths(pos_pad, pos_pad, cfg(mode="encoder"), 6), [[4] * 6])
    np.testing.assert_array_equal(P.ssmax_lengths(pos_pad, pos_pad, cfg(ssmax_length="padded"), 6), [[6] * 6])
    assert np.isfinite(P.ssmax_factor(np.ones(3), np.array([[0, 1, 2]]), np.float32)).all()  # ln(max(n, 1))


def test_ssmax_with_s_not_positive_keeps_the_causal_mask():
    c = cfg("none", use_ssmax=True, ode_steps=1)
    p = R.init_params(c, seed=9)
    p["pos_encoder.ssmax.s"] = np.array([-1.0, 0.0, -3.0])  # a learned s may pass 0 (the init may not)
    x, _ = inputs(c, batch=1, padded=False)
    z = R.ode_block(p, x, c)
    x2 = x.copy()
    x2[:, -1] += 10.0  # a later token changes: earlier ones must not
    np.testing.assert_array_equal(R.ode_block(p, x2, c)[:, :-1], z[:, :-1])
    assert np.isfinite(z).all()


def test_the_visible_rule_lets_a_prefix_keep_its_outputs_and_the_padded_rule_does_not():
    x, _ = inputs(cfg(), batch=1, padded=False)
    for rule, same in (("visible", True), ("padded", False)):
        c = cfg("bam", use_ssmax=True, ssmax_length=rule)
        p = R.init_params(c, seed=10, perturb_norms=True)
        short, full = R.ode_block(p, x[:, :4], c), R.ode_block(p, x, c)
        assert np.allclose(short, full[:, :4], rtol=0, atol=1e-14) == same


@pytest.mark.parametrize("encoding", FAMILY)
@pytest.mark.parametrize("ssmax", [False, True])
def test_cached_decoding_equals_the_block(encoding, ssmax):
    c = cfg(encoding, use_ssmax=ssmax, ode_solver="heun", layer_idx=1)
    p = R.init_params(c, seed=11, perturb_norms=True)
    x, pm = inputs(c)
    z, cache = R.prefill(p, x[:, :3], c, pm[:, :3], max_len=6)
    out = [z]
    for i in range(3, 6):
        z_t, cache = R.decode_step(p, x[:, i:i + 1], cache, c)
        out.append(z_t)
    np.testing.assert_allclose(np.concatenate(out, axis=1)[pm], R.ode_block(p, x, c, pm)[pm], rtol=0, atol=1e-13)


def test_cached_decoding_refuses_the_seeds_padded_ssmax_rule_by_name():
    c = cfg("rope", use_ssmax=True, ssmax_length="padded")
    x, pm = inputs(c)
    with pytest.raises(ValueError, match="ssmax_length: cached decoding needs ssmax_length='visible'"):
        R.prefill(R.init_params(c), x, c, pm, max_len=8)

"""RoPE and ALiBi: the seed's conventions, the precision decision, and the config fields."""

import numpy as np
import pytest

import ode_ref as R
from ode_ref import positions as P


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=16, num_heads=2, mode="decoder", ode_use_pe=True), **kw})


def test_rope_frequencies_are_the_seeds_not_llamas():
    """base ** (-i / (P - 1)): from 1 down to exactly 1 / base; P == 1 gives [1]."""
    f = P.rope_frequencies(cfg(rope_base=100.0))  # head_dim 8, P = 4
    np.testing.assert_allclose(f, 100.0 ** (-np.arange(4) / 3), rtol=0, atol=0)
    assert f[0] == 1.0 and f[-1] == pytest.approx(0.01, rel=1e-15)
    assert not np.allclose(f, 100.0 ** (-2 * np.arange(4) / 8))  # the RoFormer/Llama formula differs
    np.testing.assert_array_equal(P.rope_frequencies(cfg(hidden_size=6, num_heads=2)), [1.0])  # head_dim 3


def test_rope_rotates_interleaved_pairs_and_keeps_an_odd_last_channel():
    c = cfg(hidden_size=10, num_heads=2, rope_scaling=0.5)  # head_dim 5: pairs (0, 1), (2, 3); channel 4 kept
    x = np.random.default_rng(0).normal(size=(1, 3, 2, 5))
    cos, sin = P.rope_cos_sin(np.arange(3)[None], c, np.float64)
    y = P.apply_rope(x, cos, sin)
    theta = (np.arange(3) * 0.5)[:, None] * P.rope_frequencies(c)  # (seq, P)
    for i in range(2):
        ct, st = np.cos(theta[:, i])[None, :, None], np.sin(theta[:, i])[None, :, None]
        np.testing.assert_allclose(y[..., 2 * i], x[..., 2 * i] * ct - x[..., 2 * i + 1] * st, atol=1e-15)
        np.testing.assert_allclose(y[..., 2 * i + 1], x[..., 2 * i] * st + x[..., 2 * i + 1] * ct, atol=1e-15)
    np.testing.assert_array_equal(y[..., 4], x[..., 4])


def test_rope_scores_depend_on_the_distance_only():
    """The defining property: <R(p) q, R(p') k> depends on p - p' alone."""
    c = cfg()
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 1, 1, 1, 8))

    def score(p, p2):
        cq, sq = P.rope_cos_sin(np.array([[p]]), c, np.float64)
        ck, sk = P.rope_cos_sin(np.array([[p2]]), c, np.float64)
        return float((P.apply_rope(q, cq, sq) * P.apply_rope(k, ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-6)


def test_rope_angles_are_float64_then_rounded_once():
    """The precision decision: cos and sin from float64 angles are the float64 values rounded
    once, while float32 angles (the seed's, in the tensor's dtype) at p = 2047 with rope_scaling
    0.7 are off by 7e-5 rad: two roundings of an angle near 1433, each up to ulp(1024) / 2."""
    c = cfg(rope_scaling=0.7)
    p = np.arange(2048)[None]
    cos32, sin32 = P.rope_cos_sin(p, c, np.float32)
    angles = P.rope_angles(p, c)
    np.testing.assert_array_equal(cos32, np.cos(angles).astype(np.float32))
    assert np.abs(cos32.astype(np.float64) - np.cos(angles)).max() <= 2.0**-24  # |cos| <= 1: half an ulp of 1
    angles32 = (np.float32(p) * np.float32(0.7))[..., None] * P.rope_frequencies(c).astype(np.float32)
    assert np.abs(angles32 - angles).max() > 3e-5  # what float32 angles would cost: 500x float32's u


def test_alibi_slopes_for_a_power_of_two_heads_and_for_others():
    np.testing.assert_allclose(P.alibi_slopes(8), 2.0 ** -np.arange(1, 9), rtol=1e-15)
    s4, s8 = P.alibi_slopes(4), P.alibi_slopes(8)
    np.testing.assert_allclose(P.alibi_slopes(6), np.concatenate([s4, s8[0::2][:2]]), rtol=0)
    np.testing.assert_allclose(P.alibi_slopes(1), [2.0**-8], rtol=1e-15)
    np.testing.assert_allclose(P.alibi_slopes(3), [2.0**-4, 2.0**-8, 2.0**-2], rtol=1e-15)


def test_alibi_bias_is_symmetric_and_a_fully_masked_row_stays_finite():
    c = cfg(hidden_size=12, num_heads=3, positional_encoding="alibi")
    pos = np.arange(4)[None]
    b = P.alibi_bias(pos, pos, c, np.float32)
    assert b.shape == (1, 3, 4, 4) and b.dtype == np.float32
    np.testing.assert_array_equal(b, b.transpose(0, 1, 3, 2))
    np.testing.assert_array_equal(b[0, 0], -(np.float32(2.0**-4) * np.abs(pos.T - pos)))
    # a padded query under the causal mask has every key masked: the bias goes in before the
    # fill, so the row is finite (the seed's -inf plus a bias would be NaN here)
    x = np.random.default_rng(0).normal(size=(1, 4, 12))
    pm = np.array([[False, False, True, True]])
    z = R.ode_block(R.init_params(c), x, c, pm)
    assert np.isfinite(z).all()


def test_config_fields_carry_the_seeds_names_and_defaults():
    d = R.ODEConfig(hidden_size=8, num_heads=2)
    assert (d.positional_encoding, d.ode_use_pe, d.rope_base, d.rope_scaling) == ("rope", False, 10000.0, 1.0)
    assert d.position_encoding == "none"
    assert cfg(positional_encoding="alibi").position_encoding == "alibi"

    class Seed:  # the seed's config object: attributes, extra ones ignored
        hidden_size, num_heads, ode_use_pe, positional_encoding, rope_base, other = 8, 2, True, "alibi", 500.0, 1

    assert R.ODEConfig.from_any(Seed()).position_encoding == "alibi"


def test_an_unimplemented_encoding_is_refused_by_name_only_when_on():
    with pytest.raises(ValueError, match="positional_encoding: 'xpos' is not implemented"):
        cfg(positional_encoding="xpos")
    assert R.ODEConfig(hidden_size=8, num_heads=2, positional_encoding="xpos").position_encoding == "none"
    for field, bad in [("rope_base", 0.0), ("rope_scaling", float("inf")), ("rope_base", "10000"), ("ode_use_pe", 1)]:
        with pytest.raises(ValueError, match=field):
            cfg(**{field: bad})

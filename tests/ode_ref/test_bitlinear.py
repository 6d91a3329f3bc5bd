import numpy as np
import pytest

from ode_ref import bitlinear as bl


def test_weight_ternary_with_mean_abs_scale():
    w = np.array([[0.3, -0.05, 0.2], [-0.4, 0.0, 0.25]])  # mean|W| = 0.2
    ternary, scale = bl.ternarize_weight(w)
    assert scale == 1 / np.abs(w).mean()  # == 4.999999999999999: mean|W| rounds above 0.2
    # w * 5 = [1.5, -0.25, 1.0], [-2.0, 0.0, 1.25] -> round half-even then clip to [-1, 1]
    np.testing.assert_array_equal(ternary, [[1, 0, 1], [-1, 0, 1]])
    np.testing.assert_array_equal(bl.quantize_weight(w), ternary / scale)


def test_weight_scale_floor_for_zero_weights():
    w = np.zeros((2, 2))
    assert bl.weight_scale(w) == 1 / 1e-5 and not bl.quantize_weight(w).any()


def test_round_is_half_to_even():
    np.testing.assert_array_equal(np.round([0.5, 1.5, 2.5, -0.5, -2.5]), [0, 2, 2, -0, -2])
    w = np.array([[0.5, 1.5, -1.0, 1.0]])  # mean|W| = 1: 0.5 is a tie that half-even sends to 0
    np.testing.assert_array_equal(bl.ternarize_weight(w)[0], [[0, 1, -1, 1]])


def test_activation_quantisation_per_token():
    x = np.array([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 1.0]])
    q = bl.quantize_activation(x)
    for row, qrow in zip(x, q):
        n = (row - row.mean()) / np.sqrt(row.var() + 1e-5)
        s = 127 / np.abs(n).max()
        np.testing.assert_allclose(qrow, np.clip(np.round(n * s), -128, 127) / s, rtol=1e-15)
        assert np.abs(qrow).max() == pytest.approx(np.abs(n).max(), rel=1e-15)  # max maps to level 127
    levels = q * (127 / np.abs(q).max(axis=-1, keepdims=True))
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-12)


def test_constant_token_is_zero_not_nan():
    q = bl.quantize_activation(np.full((1, 4), 3.0))
    assert np.array_equal(q, np.zeros((1, 4)))


def test_bitlinear_matches_formula(rng):
    x, w = rng.normal(size=(2, 3, 8)), rng.normal(size=(5, 8))
    y = bl.bitlinear(x, bl.quantize_weight(w))
    assert y.shape == (2, 3, 5)
    np.testing.assert_allclose(y, bl.quantize_activation(x) @ bl.quantize_weight(w).T, rtol=0, atol=0)

import math

import numpy as np
import pytest

from ode_ref import norms

X = np.array([[1.0, 2.0, 3.0, 6.0]])  # mean 3, biased var 3.5, unbiased var 14/3, mean(x^2) 12.5


def test_layer_norm_hand_values():
    w, b = np.array([1.0, 2.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
    expected = (X - 3.0) / math.sqrt(3.5 + 1e-5) * w + b
    np.testing.assert_allclose(norms.layer_norm(X, w, b), expected, rtol=1e-15)
    assert norms.layer_norm(X, w, b)[0, 1] == pytest.approx(-1 / math.sqrt(3.5 + 1e-5) * 2, rel=1e-15)


def test_rms_and_flash_norm_hand_values():
    w = np.array([2.0, 1.0, 1.0, 1.0])
    rms = math.sqrt(12.5 + 1e-6)
    np.testing.assert_allclose(norms.rms_norm(X, w), X * w / rms, rtol=1e-15)
    np.testing.assert_allclose(norms.flash_norm(X), X / rms, rtol=1e-15)


def test_prms_norm_uses_leading_channels_only():
    assert [norms.prms_channels(n) for n in (1, 4, 16, 17, 32, 33)] == [1, 1, 1, 2, 2, 3]
    x = np.arange(1.0, 18.0)[None]  # n = 17 -> k = 2 channels: mean(1, 4) = 2.5
    np.testing.assert_allclose(norms.prms_norm(x, np.ones(17)), x / math.sqrt(2.5 + 1e-6), rtol=1e-15)


def test_dynamic_tanh_uses_unbiased_std_with_eps_on_std():
    alpha, beta = np.full(4, 0.5), np.array([0.0, 0.1, 0.0, 0.0])
    std = math.sqrt(14 / 3)
    expected = np.tanh((X - 3.0) / (std + 1e-6) * alpha + beta)
    np.testing.assert_allclose(norms.dynamic_tanh(X, alpha, beta), expected, rtol=1e-15)


def test_derf_scalar_alpha_and_shift():
    gamma, beta = np.array([1.0, 2.0, 1.0, 1.0]), np.zeros(4)
    out = norms.derf(X, np.float64(0.5), np.float64(-1.0), gamma, beta)
    expected = [math.erf(0.5 * v - 1.0) * g for v, g in zip(X[0], gamma)]
    np.testing.assert_allclose(out[0], expected, rtol=1e-15)


@pytest.mark.parametrize("name", norms.NORM_TYPES)
def test_every_norm_preserves_shape_and_float32(name, rng):
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    params = {
        p: np.full(() if kind == "scalar" else (8,), ident, np.float32)
        for p, (kind, ident) in norms.NORM_PARAMS[name].items()
    }
    out = norms.apply_norm(name, params, x)
    assert out.shape == x.shape and out.dtype == np.float32

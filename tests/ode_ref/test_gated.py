"""The ODE Transformer's learnable RK2 (rk2_gated): the paper's block at one step, Heun's method
at g = 1/2, the gate's parameters and their init."""

import numpy as np
import pytest

import ode_ref as R

CFG = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="rk2_gated", ode_steps=1)


def inputs(cfg=CFG, seed=0):
    params = R.init_params(cfg, seed=seed, perturb_norms=True)
    x = np.random.default_rng(seed).normal(size=(2, 5, cfg.hidden_size))
    return params, x


def test_one_step_is_the_papers_block():
    """y + g F1 + (1 - g) F2, F1 = F(y), F2 = F(y + F1), g = sigmoid(Linear(2D -> 1)([F1; F2]))."""
    params, x = inputs()
    f = lambda z: R.ode_func(params, 0.0, z, CFG)  # noqa: E731  (autonomous: t is not read)
    f1 = f(x)
    f2 = f(x + f1)
    logit = np.concatenate([f1, f2], axis=-1) @ params["gate.weight"].T + params["gate.bias"]
    g = 1.0 / (1.0 + np.exp(-logit))
    assert g.shape == (2, 5, 1)
    np.testing.assert_allclose(R.ode_block(params, x, CFG), x + g * f1 + (1 - g) * f2, rtol=0, atol=1e-14)


def test_a_half_gate_is_heun():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="rk2_gated", ode_steps=3)
    params, x = inputs(cfg)
    params["gate.weight"], params["gate.bias"] = np.zeros((1, 16)), np.zeros(1)  # g = 1/2 exactly
    heun = R.ODEConfig(**{**cfg.to_dict(), "ode_solver": "heun"})
    plain = {k: v for k, v in params.items() if not k.startswith("gate.")}
    np.testing.assert_allclose(R.ode_block(params, x, cfg), R.ode_block(plain, x, heun), rtol=0, atol=1e-14)


def test_gate_parameters_and_their_init():
    cfg = R.ODEConfig(hidden_size=64, num_heads=4, ode_solver="rk2_gated")
    shapes = R.param_shapes(cfg)
    assert shapes["gate.weight"] == (1, 128) and shapes["gate.bias"] == (1,)
    assert "gate.weight" not in R.param_shapes(R.ODEConfig(hidden_size=64, num_heads=4))
    params = R.init_params(cfg)
    bound = np.sqrt(6.0 / (128 + 1))  # Xavier-uniform: sqrt(6 / (fan_in + fan_out))
    w = params["gate.weight"]
    assert np.abs(w).max() <= bound and np.all(params["gate.bias"] == 0.0)
    # U(-a, a) has std a / sqrt(3); over 128 draws the sample std is within ~10% of it (a wrong
    # init, nn.Linear's 1 / sqrt(fan_in) = 0.088, is 60% below)
    assert w.std() == pytest.approx(bound / np.sqrt(3), rel=0.25)


def test_missing_gate_parameters_are_named():
    params, x = inputs()
    del params["gate.bias"]
    with pytest.raises(ValueError, match=r"ode_solver='rk2_gated' expected exactly .*missing \['gate.bias'\]"):
        R.ode_block(params, x, CFG)


def test_the_stepper_refuses_a_gated_tableau_without_a_gate():
    with pytest.raises(ValueError, match="ode_solver: rk2_gated needs the block's gate"):
        R.rk_step(lambda t, y: y, 0.0, 1.0, np.ones(2), R.TABLEAUS["rk2_gated"])


def test_sigmoid_is_finite_without_warnings_at_any_logit():
    s = R.attention.sigmoid(np.array([-1e308, -800.0, 0.0, 800.0, 1e308]))
    np.testing.assert_array_equal(s, [0.0, 0.0, 0.5, 1.0, 1.0])

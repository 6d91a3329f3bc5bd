"""The encoder's hand-written backward pass (ode_ref.encoder_backward) against central
differences of the spec: x and every parameter, each along a random direction of its own, for
every family under both profiles, and each successor's row (Macaron, PCformer), pre- and
post-norm, padded; qkvflow's time-dependent stack."""

import numpy as np
import pytest

import ode_ref as R
from ode_ref.encoder_backward import ode_encoder_vjp
from odeattn.conformance.cases.encoder_cases import SUCCESSOR_ROWS

C, H, FF = 8, 2, 12
CONFIGS = [(f, p, pre, {}) for f in R.FAMILIES for p in R.PROFILES for pre in (False, True)
           if not (f == "euler" and p == "released")]
SUCCESSORS = [(r[0], r[1], r[2], r[6]) for r in SUCCESSOR_ROWS]  # each row's norm placement: both appear
TEMPORAL = [("euler", "paper", True, {"time_embed_dim": 4, "sinusoidal_dim": 2})]  # qkvflow's stack, two steps


def inputs(cfg, seed=0):
    params = R.init_encoder_params(cfg, seed, perturb=True)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    return params, x, mask, rng.normal(size=x.shape)


@pytest.mark.parametrize("family, profile, pre, more", CONFIGS + SUCCESSORS + TEMPORAL)
def test_every_gradient_against_central_differences(family, profile, pre, more):
    """<grad, d> against (J(p + eps d) - J(p - eps d)) / (2 eps), J = sum(z_bar * z), eps = 1e-6,
    one direction d per array. The difference's error is its truncation, eps^2 |J'''| / 6, and its
    rounding, ~1e-15 |J| / eps = 1e-9 |J|, which is 1e-6 of the floor 1e-3 |J|: bounded at 1e-6 of
    max(|difference|, 1e-3 |J|); measured at most 1.0e-7 of it over the 22 configs of the ODE
    Transformer's families, 4.1e-7 over 18 of its successors' (each row pre- and post-norm; the
    corrector's longer chains), 2.5e-7 on qkvflow's stack."""
    cfg = R.ODEEncoderConfig(C, H, FF, encoder_layers=2, family=family, profile=profile, encoder_normalize_before=pre, **more)
    params, x, mask, z_bar = inputs(cfg)
    x_bar, params_bar = ode_encoder_vjp(params, x, cfg, z_bar, mask)
    assert list(params_bar) == list(R.encoder_param_shapes(cfg))
    rng = np.random.default_rng(1)
    objective = lambda p, xx: float((z_bar * R.ode_encoder(p, xx, cfg, mask)).sum())  # noqa: E731
    scale = abs(objective(params, x))
    eps = 1e-6
    for name, grad in {"x": x_bar, **params_bar}.items():
        d = rng.normal(size=np.shape(grad))
        if name == "x":
            fd = (objective(params, x + eps * d) - objective(params, x - eps * d)) / (2 * eps)
        else:
            fd = (objective({**params, name: params[name] + eps * d}, x)
                  - objective({**params, name: params[name] - eps * d}, x)) / (2 * eps)
        analytic = float((grad * d).sum())
        assert abs(analytic - fd) <= 1e-6 * max(abs(fd), 1e-3 * scale), (name, analytic, fd)


def test_padded_positions_pass_no_gradient_to_real_tokens_and_z_bar_is_checked():
    cfg = R.ODEEncoderConfig(C, H, FF, family="rk2_gated")
    params, x, mask, z_bar = inputs(cfg)
    z_bar[~mask] = 0.0  # only real tokens scored: a padded input then gets no gradient
    x_bar, _ = ode_encoder_vjp(params, x, cfg, z_bar, mask)
    assert np.all(x_bar[~mask] == 0.0) and np.abs(x_bar[mask]).min() > 0
    with pytest.raises(ValueError, match=r"z_bar: expected a NumPy array of x's shape \(2, 5, 8\)"):
        ode_encoder_vjp(params, x, cfg, z_bar[:1], mask)

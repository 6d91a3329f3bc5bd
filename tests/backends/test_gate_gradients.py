"""Gradients through the gated RK2 (rk2_gated) in torch and JAX, against central finite
differences of the spec in float64: every gate parameter, and a random direction of x and of
each projection weight."""

import numpy as np
import pytest

import ode_ref as R

CFG = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="rk2_gated", ode_steps=2, mode="decoder", ode_use_pe=True)
EPS = 1e-5
# Central differences: truncation eps^2 |L'''| / 6 and rounding 1e-16 |L| / eps, both ~1e-11 here
# (the largest error seen is 4e-9 relative, on gate.weight); 1e-7 leaves a margin and still fails
# for any wrong term (a gate derivative dropped changes the gradient at O(1)).
TOL = 1e-7


def problem():
    rng = np.random.default_rng(3)
    params = R.init_params(CFG, seed=4, perturb_norms=True)
    x = rng.normal(size=(2, 4, 8))
    mask = np.array([[True] * 4, [False, True, True, True]])
    cotangent = rng.normal(size=x.shape)
    directions = {name: rng.normal(size=params[name].shape) for name in (R.params.QKV, R.params.OUT_PROJ)}
    return params, x, mask, cotangent, directions


def loss(params, x, mask, cotangent):
    return float(np.sum(R.ode_block(params, x, CFG, mask) * cotangent))


def finite_differences(params, x, mask, cotangent, directions):
    """{'gate.weight': (1, 16), 'gate.bias': (1,), 'x': scalar along dx, name: scalar along its direction}."""
    def along(name, d):
        plus, minus = dict(params), dict(params)
        plus[name], minus[name] = params[name] + EPS * d, params[name] - EPS * d
        return (loss(plus, x, mask, cotangent) - loss(minus, x, mask, cotangent)) / (2 * EPS)

    out = {}
    for name in ("gate.weight", "gate.bias"):
        grad = np.zeros(params[name].shape)
        for idx in np.ndindex(grad.shape):
            e = np.zeros(grad.shape)
            e[idx] = 1.0
            grad[idx] = along(name, e)
        out[name] = grad
    for name, d in directions.items():
        out[name] = along(name, d)
    dx = directions[R.params.QKV][:1, :8].reshape(1, 1, 8) * np.ones_like(x)
    out["x"] = (loss(params, x + EPS * dx, mask, cotangent) - loss(params, x - EPS * dx, mask, cotangent)) / (2 * EPS)
    return out, dx


def compare(grads: dict, x_grad, fd: dict, directions, dx):
    for name in ("gate.weight", "gate.bias"):
        assert np.abs(grads[name] - fd[name]).max() <= TOL * np.abs(fd[name]).max(), name
    for name, d in directions.items():
        got = float(np.sum(grads[name] * d))
        assert abs(got - fd[name]) <= TOL * abs(fd[name]), name
    got = float(np.sum(x_grad * dx))
    assert abs(got - fd["x"]) <= TOL * abs(fd["x"])


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("backends/test_gate_gradients")


@pytest.fixture(scope="session")
def reference():
    params, x, mask, cotangent, directions = problem()
    fd, dx = finite_differences(params, x, mask, cotangent, directions)
    return params, x, mask, cotangent, directions, fd, dx


def test_torch_autograd_through_the_gate(reference):
    torch = pytest.importorskip("torch")
    from odeattn.backends import torch as T

    params, x, mask, cotangent, directions, fd, dx = reference
    block = T.ODEAttentionBlock.from_params(CFG, params, dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    (block(xt, padding_mask=torch.as_tensor(mask)) * torch.as_tensor(cotangent)).sum().backward()
    grads = {name: p.grad.numpy() for name, p in block.named_parameters()}
    compare(grads, xt.grad.numpy(), fd, directions, dx)


def test_jax_grad_through_the_gate(reference):
    jax = pytest.importorskip("jax")
    from odeattn.backends import jax as J

    params, x, mask, cotangent, directions, fd, dx = reference

    def jloss(p, xx):
        return (J.ode_block(p, xx, CFG, mask) * cotangent).sum()

    with jax.enable_x64(True):
        gp, gx = jax.grad(jloss, argnums=(0, 1))({k: jax.numpy.asarray(v) for k, v in params.items()}, jax.numpy.asarray(x))
    compare({k: np.asarray(v) for k, v in gp.items()}, np.asarray(gx), fd, directions, dx)


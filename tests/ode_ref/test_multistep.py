"""The multistep solvers (ode_ref.multistep): each step against a hand-written one, the orders they
reach, their evaluations of f counted, checkpointing that changes nothing, and the refusals."""

import numpy as np
import pytest

import ode_ref as R
from ode_ref.cache import evaluations as cache_evaluations
from ode_ref.multistep import AB2, AB3, MULTISTEP, evaluations, solve, solver_of
from ode_ref.tableaus import HEUN, RK3_KUTTA

CFG = dict(hidden_size=8, num_heads=2)


def block(solver, steps, **more):
    cfg = R.ODEConfig(**CFG, ode_solver=solver, ode_steps=steps, **more)
    attention = R.SelfAttention(cfg)
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    prepared = attention.prepare(params, x, None)
    return cfg, params, x, lambda t, z: attention.evaluate(prepared, t, z)


def rk_by_hand(f, t, h, y, tableau):
    ks = []
    for c, a in zip(tableau.c, tableau.a):
        ks.append(f(t + c * h, y + sum(h * a_j * k for a_j, k in zip(a, ks))))
    return y + sum(h * b * k for b, k in zip(tableau.b, ks)), ks[0]


@pytest.mark.parametrize("solver", ["ab2", "ab3", "momentum"])
def test_each_step_is_the_hand_written_one(solver):
    """ab2: one Heun step, then y + h (3/2 f_n - 1/2 f_{n-1}); ab3: two steps of Kutta's third
    order, then the 23/12, -16/12, 5/12 rule; momentum (gamma 0.6): v = (1 - gamma) f_0, then
    gamma v + (1 - gamma) f_n, y + h v. Within 1e-14 of the spec's trajectory (sums in another order)."""
    steps = 6
    cfg, params, x, f = block(solver, steps, **({"momentum_gamma": 0.6} if solver == "momentum" else {}))
    h, y, fs, v, want = 1 / steps, x, [], None, [x]
    for n in range(steps):
        t = n / steps
        if solver == "momentum":
            f_n = f(t, y)
            v = 0.4 * f_n if v is None else 0.6 * v + 0.4 * f_n
            y = y + h * v
        elif n < {"ab2": 1, "ab3": 2}[solver]:
            y, f_n = rk_by_hand(f, t, h, y, {"ab2": HEUN, "ab3": RK3_KUTTA}[solver])
            fs.append(f_n)
        else:
            fs.append(f(t, y))
            if solver == "ab2":
                y = y + h * (3 / 2 * fs[-1] - 1 / 2 * fs[-2])
            else:
                y = y + h * (23 / 12 * fs[-1] - 16 / 12 * fs[-2] + 5 / 12 * fs[-3])
        want.append(y)
    _, got = R.ode_block(params, x, cfg, return_trajectory=True)
    np.testing.assert_allclose(got, np.stack(want), rtol=0, atol=1e-14)


def test_the_orders_reached():
    """The error of z(1) against rk4 at 256 steps, as the step count doubles from 8 to 64 (measured:
    ab2 1.93 to 1.98, ab3 2.78 to 2.95, momentum 0.57 to 0.88, its speed lagging f by about 1 / (1 - gamma)
    steps, so first order only once the steps far outnumber that lag). Each Adams-Bashforth order
    within 0.25 of its own at the finest pair; momentum's between 0.5 and 1 at every pair."""
    _, params, x, _ = block("rk4", 1)
    ref = R.ode_block(params, x, R.ODEConfig(**CFG, ode_solver="rk4", ode_steps=256))
    for solver, order in (("ab2", 2), ("ab3", 3), ("momentum", 1)):
        errors = [np.abs(R.ode_block(params, x, R.ODEConfig(**CFG, ode_solver=solver, ode_steps=n)) - ref).max()
                  for n in (8, 16, 32, 64)]
        observed = [np.log2(a / b) for a, b in zip(errors, errors[1:])]
        assert MULTISTEP[solver].order == order
        if solver == "momentum":
            assert all(0.5 < o < 1.0 for o in observed), observed
        else:
            assert abs(observed[-1] - order) < 0.25, (solver, observed)


@pytest.mark.parametrize("solver", ["ab2", "ab3", "momentum", "rk4"])
def test_every_evaluation_is_counted_once(solver):
    """solve calls f evaluations(solver, steps) times: the starter's stages, then one a step (the
    cache holds a slot each)."""
    for steps in range(1, 7):
        cfg, _, x, f = block(solver, steps)
        calls = []
        solve(lambda t, z: calls.append(t) or f(t, z), x, solver_of(cfg), steps)
        assert len(calls) == evaluations(solver_of(cfg), steps) == cache_evaluations(cfg)
    assert [evaluations(AB3, n) for n in (1, 2, 3, 6)] == [3, 6, 7, 10] and evaluations(AB2, 4) == 5


def test_checkpointing_changes_no_value():
    """With a checkpoint wrapper each step runs under it, its past passed along: the same states."""
    cfg, _, x, f = block("ab3", 5)
    wrapped = []
    states = solve(f, x, solver_of(cfg), 5, checkpoint=lambda fn, *args: wrapped.append(args[0]) or fn(*args))
    assert wrapped == [0, 1, 2, 3, 4]
    for a, b in zip(states, solve(f, x, solver_of(cfg), 5)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fields, message", [
    (dict(ode_solver="momentum", momentum_gamma=1.0), r"momentum_gamma: expected a number in \[0, 1\); got 1.0"),
    (dict(ode_solver="momentum", momentum_gamma=True), r"momentum_gamma: expected a number in \[0, 1\); got True"),
    (dict(ode_solver="ab2", momentum_gamma=0.5), r"momentum_gamma: the momentum solver's; got 0.5 with ode_solver 'ab2'"),
])
def test_bad_fields_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        R.ODEConfig(**CFG, **fields)

"""Measured convergence order of every solver on the ODE attention block itself.

The oracle is independent of our stepper: scipy's DOP853 at rtol = atol = 1e-13, whose own error
(checked below against a second run at 1e-12) is far under the smallest error we fit.
"""

import math
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import ode_ref as R

CFG = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1)


def steps_for(order: int) -> list[int]:
    """Four doublings from 2^(4 - order) steps (at least 2): errors stay >> the oracle's, any order."""
    first = max(2, 2 ** (4 - order))
    return [first * 2**i for i in range(4)]


def problem(variant, solver="rk4"):
    """A gated solver's gate bias is 1 (g near 0.73): away from g = 1/2, where it is Heun's, of order 2."""
    params = R.init_params(R.ODEConfig(**{**CFG.to_dict(), "ode_solver": solver}), seed=7, perturb_norms=True)
    if R.TABLEAUS[solver].gated:
        params["gate.bias"] = params["gate.bias"] + 1.0
    x = np.random.default_rng(5).normal(size=(1, 4, 8))
    attention = variant(CFG)
    prepared = attention.prepare(params, x)

    def rhs(t, y):
        return attention(prepared, t, y.reshape(x.shape)).ravel()

    return params, x, attention, rhs


def oracle(rhs, x, rtol):
    sol = solve_ivp(rhs, (0.0, 1.0), x.ravel(), method="DOP853", rtol=rtol, atol=rtol)
    return sol.y[:, -1].reshape(x.shape)


@pytest.mark.parametrize("variant", [R.SelfAttention, R.ScaledQueryAttention], ids=["autonomous", "time-dependent"])
@pytest.mark.parametrize("solver", list(R.TABLEAUS))
def test_each_solver_converges_at_its_stated_order(solver, variant):
    params, x, attention, rhs = problem(variant, solver)
    exact = oracle(rhs, x, 1e-13)
    oracle_error = np.abs(exact - oracle(rhs, x, 1e-12)).max()  # bounds the 1e-13 run's own error
    assert oracle_error < 1e-11
    order = R.TABLEAUS[solver].order
    steps = steps_for(order)
    errors = []
    for n in steps:
        cfg = R.ODEConfig(**{**CFG.to_dict(), "ode_solver": solver, "ode_steps": n})
        errors.append(np.abs(R.ode_block(params, x, cfg, attention=variant(cfg)) - exact).max())
    assert min(errors) > 30 * oracle_error  # far above the oracle's error: the fit measures the solver
    slope = np.polyfit(np.log(1.0 / np.array(steps)), np.log(errors), 1)[0]
    assert slope == pytest.approx(order, abs=0.3), f"{solver}: errors {errors}"


def test_step_times_are_exact():
    assert R.rk.step_times(3) == [0.0, 1 / 3, 2 / 3]
    assert R.rk.step_times(10)[7] == 0.7  # k / steps, not 0.1 + 0.1 + ... (0.1 summed 7 times is 0.7000000000000001)


def test_f_gets_every_stage_time():
    seen = []
    R.integrate(lambda t, y: seen.append(t) or y, 1.0, R.TABLEAUS["rk4"], 2)
    assert seen == [0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0]


@pytest.mark.parametrize("steps, runs", [(1, [("run", 1), ("step", 0.0)]), (5, None), (9, None)])
def test_checkpoint_runs_segments_of_sqrt_steps_and_changes_no_value(steps, runs):
    """rk.integrate(checkpoint=) runs ceil(sqrt(steps)) steps per segment, each segment and each
    step under checkpoint, and the states are those of the plain loop, bit for bit."""
    params = R.init_params(CFG, seed=1)
    attention = R.SelfAttention(CFG)
    prepared = attention.prepare(params, np.random.default_rng(2).normal(size=(1, 4, 8)))
    f = lambda t, z: attention(prepared, t, z)  # noqa: E731
    x = np.random.default_rng(3).normal(size=(1, 4, 8))
    seen = []

    def checkpoint(fn, *args):
        seen.append(("run", len(args[0])) if isinstance(args[0], list) else ("step", args[0]))
        return fn(*args)

    plain = R.rk.integrate(f, x, R.TABLEAUS["rk4"], steps)
    wrapped = R.rk.integrate(f, x, R.TABLEAUS["rk4"], steps, checkpoint=checkpoint)
    last = R.rk.integrate(f, x, R.TABLEAUS["rk4"], steps, checkpoint=checkpoint, trajectory=False)
    assert len(wrapped) == steps + 1 and all((a == b).all() for a, b in zip(plain, wrapped))
    assert len(last) == 1 and (last[0] == plain[-1]).all()
    size = math.ceil(math.sqrt(steps))
    segments = [("run", min(size, steps - i)) for i in range(0, steps, size)]
    assert [s for s in seen if s[0] == "run"] == segments * 2  # once per integrate call
    assert [s[1] for s in seen if s[0] == "step"] == R.rk.step_times(steps) * 2
    if runs:
        assert seen[:2] == runs

def test_stage_columns_hold_each_stage_values_coefficients_by_row():
    """rk4: k_0 in stage 1's input and in the solution, k_2 in stage 3's and the solution, h b_i
    last; a gated tableau's solution column is zero (the gate makes that solution)."""
    h = 0.125
    cols = R.rk.stage_columns(R.TABLEAUS["rk4"], h)
    assert cols[0] == (0.0, h / 2, 0.0, 0.0, h / 6)
    assert cols[2] == (0.0, 0.0, 0.0, h, h / 3)
    assert cols[3] == (0.0, 0.0, 0.0, 0.0, h / 6)
    assert not any(row[-1] for row in R.rk.stage_columns(R.TABLEAUS["rk2_gated"], h))

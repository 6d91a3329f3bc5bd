"""The JAX port's stage loop (backends/jax/rk.py) against the spec's written-out stages (ode_ref/rk.py)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from ode_ref.tableaus import RK3_KUTTA, RK3_RELEASED  # noqa: E402
from odeattn.backends.jax.rk import rk_step, stage_columns  # noqa: E402

SOLVERS = sorted(R.TABLEAUS) + ["rk3", "rk3_released"]
TABLEAU = {**R.TABLEAUS, "rk3": RK3_KUTTA, "rk3_released": RK3_RELEASED}


def f(t, y):  # nonlinear in y and in t, with the same operators on NumPy and JAX arrays
    return y * y * 0.5 - t * y + 0.25


def gate(xp):
    return lambda k0, k1: 1.0 / (1.0 + xp.exp(k1 - k0))


def jax_step(solver, y0, *, with_first=False, fn=f):
    tableau = TABLEAU[solver]
    g = gate(jnp) if tableau.gated else None
    return jax.jit(lambda y: rk_step(fn, 0.25, 0.125, y, tableau, g, with_first=with_first))(jnp.asarray(y0))


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_stage_loop_is_the_specs_step(solver):
    """float64: the same terms in the same order, so the same numbers up to XLA's contraction of a
    multiply-add into a fused one (one rounding fewer), far inside the suite's 1e-12."""
    tableau = TABLEAU[solver]
    y0 = np.random.default_rng(0).normal(size=(2, 3, 4))
    with jax.enable_x64(True):
        got, first = jax_step(solver, y0, with_first=True)
    want = R.rk_step(f, 0.25, 0.125, y0, tableau, gate(np) if tableau.gated else None)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(np.asarray(first), f(0.25, y0))


def test_the_stage_inputs_and_the_solution_each_hold_their_own_coefficients():
    """rk4: k_0 in stage 1's input and in the solution, k_2 in stage 3's and the solution, h b_i last."""
    h = 0.125
    cols = stage_columns(R.TABLEAUS["rk4"], h)
    assert cols.shape == (4, 5)
    np.testing.assert_array_equal(cols[0], [0, h / 2, 0, 0, h / 6])
    np.testing.assert_array_equal(cols[2], [0, 0, 0, h, h / 3])
    np.testing.assert_array_equal(cols[3], [0, 0, 0, 0, h / 6])
    assert not stage_columns(R.TABLEAUS["rk2_gated"], h)[:, -1].any()  # the gate makes that solution


def test_a_zero_coefficient_leaves_a_non_finite_stage_out():
    """k_0 = inf at t0: rk4's stage 2 and 3 inputs have a zero coefficient for it, so they never form
    0 * inf; the step is inf, as the spec's. A loop that multiplied every term would give NaN."""
    def blows_up_first(t, y):
        return jnp.where(t == 0.25, jnp.inf, y) if isinstance(y, jax.Array) else (np.inf * y if t == 0.25 else y)

    y0 = np.ones(3)
    want = R.rk_step(blows_up_first, 0.25, 0.125, y0, R.TABLEAUS["rk4"])
    with jax.enable_x64(True):
        got = np.asarray(jax_step("rk4", y0, fn=blows_up_first))
    assert np.isposinf(want).all()
    np.testing.assert_array_equal(got, want)


def test_one_evaluation_of_f_whatever_the_stages(count_primitive):
    """The program holds f once: the stages are a loop, as the steps are."""
    for solver in ("euler", "rk4", "rk38"):
        jaxpr = jax.make_jaxpr(lambda y: rk_step(lambda t, z: jnp.sin(z) * t, 0.0, 0.5, y, R.TABLEAUS[solver]))(jnp.ones(3))
        assert count_primitive(jaxpr.jaxpr, "sin") == 1

"""The JAX port's stage loop (backends/jax/rk.py) against the spec's written-out stages (ode_ref/rk.py)."""


import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from ode_ref.tableaus import RK3_KUTTA, RK3_RELEASED  # noqa: E402
from odeattn.backends.jax.rk import integrate, rk_step  # noqa: E402

TABLEAU = {**R.TABLEAUS, "rk3": RK3_KUTTA, "rk3_released": RK3_RELEASED}
T0, H = 0.25, 0.125


def f(t, y):  # nonlinear in y and in t
    return y * y * 0.5 - t * y + 0.25


def gate(k0, k1):
    return 1.0 / (1.0 + jnp.exp(k1 - k0))


def gate_of(tableau):
    return gate if tableau.gated else None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("solver", sorted(TABLEAU))
def test_the_stage_loop_is_the_specs_step_bit_for_bit(solver, dtype, jit_at_xla_default):
    """The spec's rk_step, its stages written out, traced with JAX arrays and jitted, against the
    loop: the same terms in the same order give the same bits, so a sum in another order fails. The
    spec in NumPy is not the reference here: XLA contracts some multiply-adds into fused ones, one
    rounding fewer, in both programs alike at XLA's default LLVM level (at level 0, where the suite's
    other programs compile, LLVM contracts in fewer and other places: 7 of the 18 cases differ)."""
    tableau = TABLEAU[solver]
    y0 = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(dtype)
    with jax.enable_x64(dtype == "float64"):
        loop = jit_at_xla_default(lambda y: rk_step(f, T0, H, y, tableau, gate_of(tableau), with_first=True))(y0)
        spec = jit_at_xla_default(lambda y: R.rk_step(f, T0, H, y, tableau, gate_of(tableau)))(y0)
        first = jit_at_xla_default(lambda y: f(T0, y))(y0)
    np.testing.assert_array_equal(np.asarray(loop[0]), np.asarray(spec))
    np.testing.assert_array_equal(np.asarray(loop[1]), np.asarray(first))  # with_first: k_0 = f(t0, y0)


def test_a_zero_coefficient_leaves_a_non_finite_stage_out():
    """k_0 = inf at t0: rk4's stage 2 and 3 inputs have a zero coefficient for it, so they never form
    0 * inf; the step is inf, as the spec's. A loop that multiplied every term would give NaN."""
    def blows_up_first(t, y):
        return jnp.where(t == T0, jnp.inf, y) if isinstance(y, jax.Array) else (np.inf * y if t == T0 else y)

    y0 = np.ones(3)
    want = R.rk_step(blows_up_first, T0, H, y0, R.TABLEAUS["rk4"])
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(lambda y: rk_step(blows_up_first, T0, H, y, R.TABLEAUS["rk4"]))(y0))
    assert np.isposinf(want).all()
    np.testing.assert_array_equal(got, want)


def test_one_evaluation_of_f_whatever_the_stages(count_primitive):
    """The program holds f once: the stages are a loop, as the steps are."""
    for solver in ("euler", "rk4", "rk38"):
        jaxpr = jax.make_jaxpr(lambda y: rk_step(lambda t, z: jnp.sin(z) * t, 0.0, 0.5, y, R.TABLEAUS[solver]))(jnp.ones(3))
        assert count_primitive(jaxpr.jaxpr, "sin") == 1


@pytest.mark.parametrize("solver", ["rk4", "rk2_gated"])
def test_integrate_scans_the_specs_steps_and_stacks_each_evaluation_s_output(solver, jit_at_xla_default):
    """integrate's states are the spec's integrate (traced alike), bit for bit at XLA's default LLVM
    level (the test above); each evaluation's output comes back in (steps, stages) layout, here its time."""
    tableau, steps = TABLEAU[solver], 3
    y0 = np.random.default_rng(1).normal(size=(2, 3)).astype("float32")
    seen = []
    spec = jit_at_xla_default(lambda y: R.integrate(lambda t, z: seen.append(t) or f(t, z), y, tableau, steps, gate_of(tableau)))(y0)
    states, times = jit_at_xla_default(lambda y: integrate(lambda t, z: (f(t, z), t), y, tableau, steps, gate_of(tableau)))(y0)
    for got, want in zip(states, spec, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # each time in float32 (x64 off): k / steps, c_i h and their sum each rounded once, each rounding
    # at most half an ulp of a number <= 1 (2^-25, 2^-25, 2^-24): within 2^-23 of the spec's Python float
    want = np.asarray([float(t) for t in seen]).reshape(steps, tableau.num_stages)
    np.testing.assert_allclose(np.asarray(times, np.float64), want, rtol=0, atol=2.0**-23)

"""The explicit Runge-Kutta step in JAX; port of ode_ref/rk.py's rk_step and integrate.

The spec's rk_step writes its stages out, one evaluation of f per stage. Traced, that makes a
program holding num_stages copies of f, which XLA compiles one by one. Here the stages are a
lax.scan over the tableau as data, so the program holds one evaluation of f whatever the solver,
as the step loop already holds one step whatever ode_steps.

The scan carries every stage's input and the solution at once, stacked (ode_ref.rk.stage_columns):
ys[j] starts at y0, and once stage i has made k_i, each row adds its coefficient of k_i (h a_ji, or
h b_i in the last row). So stage j's input is y0 + (h a_j0) k_0 + (h a_j1) k_1 + ... in index order,
as the spec's sums are, each coefficient rounded to the state's dtype as a Python float would be,
and a zero coefficient's term skipped (a select, so a non-finite k_i it multiplies stays out). The
loop's body is then one update of ys, and no stage indexes the earlier ones.

integrate is the spec's integrate as a lax.scan over the steps of rk_step, for an f that gives
back something besides dy/dt at each evaluation (a prefill's K and V, attention.py): the program
holds one evaluation of f however many steps and stages it runs.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ode_ref.multistep import multistep
from ode_ref.rk import check_gate, solution, stage_columns, stage_rows
from ode_ref.tableaus import ButcherTableau


def coefficients(tableau: ButcherTableau, h: float, dtype) -> tuple:
    """(c_i h, stage_columns) as the arrays rk_step scans over: the times in JAX's default float,
    the columns in the state's dtype, each entry the Python float rounded once."""
    return (np.asarray(stage_rows(tableau, h)[0], jnp.result_type(float)),
            np.asarray(stage_columns(tableau, h), dtype))


def rk_step(f: Callable, t0, h: float, y0, tableau: ButcherTableau, gate: Callable | None = None, *,
            with_first: bool = False, with_out: bool = False, data: tuple | None = None):
    """One step of `tableau` from (t0, y0) with step size h, as ode_ref.rk.rk_step computes it.

    f(t, y) -> like y; t0 a traced or Python float; h a Python float. gate: a gated tableau's
    g(k_0, k_1). with_first: return (the state at t0 + h, k_0 = f(t0, y0)) instead of the state,
    so a caller that needs f(0, x) reads it off the first stage rather than tracing f again.
    with_out: f(t, y) -> (k_i, out_i), and the step returns (the state, its outs stacked by stage).
    data: coefficients(tableau, h, ...) as arguments of the program (block.py's runtime data):
    then only the tableau's stage count and gating are read here, and h only by a gated one.
    """
    check_gate(tableau, gate)
    s, gated = tableau.num_stages, tableau.gated
    ones = (1,) * y0.ndim

    def stage(carry, xs):
        ys, first = carry
        i, c_h, col = xs  # col: (s + 1,), k_i's coefficient in each row of ys
        y_i = lax.dynamic_index_in_dim(ys, i, keepdims=False)
        k, out = f(t0 + c_h, y_i) if with_out else (f(t0 + c_h, y_i), None)
        # t is float32 (float64 under x64) whatever the state's dtype; a stage that uses it may
        # promote, so f's output is brought back to the state's dtype, which scan requires
        k = k.astype(y0.dtype)
        first = None if first is None else jnp.where(i == 0, k, first)
        col = col.reshape((s + 1, *ones))
        return (jnp.where(col != 0, ys + col * k, ys), first), (k if gated else None, out)  # the gate needs k_0, k_1

    ys = jnp.broadcast_to(y0, (s + 1, *y0.shape))  # rows 0..s-1: the stages' inputs; row s: the solution
    first = jnp.zeros_like(y0) if with_first and not gated else None
    # the spec's t is a Python float: JAX's default float here, never the state's dtype
    xs = (jnp.arange(s), *(coefficients(tableau, h, y0.dtype) if data is None else data))
    (ys, first), (ks, outs) = lax.scan(stage, (ys, first), xs)
    if gated:
        y1, first = solution(y0, h, tableau, [ks[0], ks[1]], gate), ks[0]
    else:
        y1 = ys[s]
    y1 = (y1, first) if with_first else y1
    return (y1, outs) if with_out else y1


def integrate(f: Callable, y0, tableau: ButcherTableau, steps: int, gate: Callable | None = None, *,
              trajectory: bool = True):
    """(ode_ref.rk.integrate's states, f's outs stacked (steps, stages, ...)), for f(t, y) ->
    (dy/dt, out). Step k starts at k / steps (JAX's default float, as ode_block's does)."""
    h = 1.0 / steps

    def step(y, k):
        y, outs = rk_step(f, k / steps, h, y, tableau, gate, with_out=True)
        return y, (y if trajectory else None, outs)

    y1, (states, outs) = lax.scan(step, y0, jnp.arange(steps))
    return ([y0, *states] if trajectory else [y1]), outs


def multistep_scan(f: Callable, y0, method, steps: int, *, trajectory: bool = False, checkpoint: bool = False):
    """(z(1), the trajectory (steps + 1, ...) or None, f(0, y0)) of ode_ref.multistep.solve for a multistep
    solver: its first steps, until its past holds every evaluation a step reads (the starter's and
    the first AB step, or momentum's first, whose speed starts at 0), written out by the spec's own
    step, then a lax.scan over the rest whose carry is the state and that past, so the program
    holds one evaluation of f for them. checkpoint: each scanned step
    recomputed in the backward pass (jax.checkpoint)."""
    h = 1.0 / steps
    first = min(steps, method.history)  # until the past is full: the scan's carry keeps one structure
    f_y = lambda t, z: f(t, z).astype(y0.dtype)  # noqa: E731  t may promote f's output (rk_step's note)
    evaluated = []  # the start's first evaluation is f(0, y0): f0, read off it rather than traced again
    y, past, states = y0, (), [y0]
    for n in range(first):
        y, past = multistep(lambda t, z: evaluated.append(f_y(t, z)) or evaluated[-1], n / steps, h, y, method, past, n)
        states.append(y)

    def step(carry, k):
        y, past = carry
        # k is an integer, k / steps in JAX's default float as the RK path's times; the step is one
        # after the start (n = method.history selects it)
        y, past = multistep(f_y, k / steps, h, y, method, past, method.history)
        return (y, past), (y if trajectory else None)

    if checkpoint:
        step = jax.checkpoint(step, prevent_cse=False)
    f0 = evaluated[0]
    (y, _), rest = lax.scan(step, (y, past), jnp.arange(first, steps)) if steps > first else ((y, past), None)
    if not trajectory:
        return y, None, f0
    return y, jnp.concatenate([jnp.stack(states)] + ([rest] if rest is not None else [])), f0

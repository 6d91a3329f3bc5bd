"""The explicit Runge-Kutta step in JAX; port of ode_ref/rk.py's rk_step.

The spec's rk_step writes its stages out, one evaluation of f per stage. Traced, that makes a
program holding num_stages copies of f, which XLA compiles one by one. Here the stages are a
lax.scan over the tableau's rows as data (ode_ref.rk.stage_rows), so the program holds one
evaluation of f whatever the solver, as the step loop already holds one step whatever ode_steps.

The arithmetic is the spec's, term by term: stage i's input is y0 + (h a_i0) k_0 + (h a_i1) k_1
+ ... in index order, each coefficient rounded to the state's dtype as a Python float would be,
and a zero coefficient's term skipped (a select, so a non-finite k_j it multiplies stays out).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

from ode_ref.rk import check_gate, solution, stage_rows
from ode_ref.tableaus import ButcherTableau


def _stage_input(y0, row, ks):
    """y0 + sum_j row[j] * ks[j] over the nonzero entries of row (traced), in index order."""
    y = y0
    for j in range(ks.shape[0]):
        y = jnp.where(row[j] != 0, y + row[j] * ks[j], y)
    return y


def rk_step(f: Callable, t0, h: float, y0, tableau: ButcherTableau, gate: Callable | None = None, *,
            with_first: bool = False):
    """One step of `tableau` from (t0, y0) with step size h, as ode_ref.rk.rk_step computes it.

    f(t, y) -> like y; t0 a traced or Python float; h a Python float. gate: a gated tableau's
    g(k_0, k_1). with_first: return (the state at t0 + h, k_0 = f(t0, y0)) instead of the state,
    so a caller that needs f(0, x) reads it off the first stage rather than tracing f again.
    """
    check_gate(tableau, gate)
    times, rows = stage_rows(tableau, h)
    t_dtype = jnp.result_type(float)  # JAX's default float: the spec's t is a Python float

    def stage(ks, xs):
        i, c_h, row = xs
        # t is float32 (float64 under x64) whatever the state's dtype; a stage that uses it may
        # promote, so f's output is brought back to the state's dtype, which scan requires
        k = f(t0 + c_h, _stage_input(y0, row, ks)).astype(y0.dtype)
        return lax.dynamic_update_index_in_dim(ks, k, i, axis=0), None

    ks = jnp.zeros((tableau.num_stages, *y0.shape), y0.dtype)
    xs = (jnp.arange(tableau.num_stages), jnp.asarray(times, t_dtype), jnp.asarray(rows, y0.dtype))
    ks, _ = lax.scan(stage, ks, xs)
    k_list = [ks[j] for j in range(tableau.num_stages)]
    y1 = solution(y0, h, tableau, k_list, gate)
    return (y1, k_list[0]) if with_first else y1


"""The one explicit Runge-Kutta stepper, for every tableau and every array library.

rk_step uses nothing but ``+``, ``-`` and ``*`` with Python floats (and the gate, a port's stage), so the same function steps NumPy
arrays (the spec), torch tensors, traced JAX arrays and symbolic ONNX values: every backend runs
the same arithmetic in the same order, which is what lets float64 results agree to ~1e-15.
"""

from __future__ import annotations

import math
from typing import Callable, TypeVar

from .tableaus import ButcherTableau

Y = TypeVar("Y")


def _combine(y0: Y, h: float, coeffs, ks) -> Y:
    """y0 + sum_j (h * coeffs[j]) * ks[j], skipping zero coefficients, in index order."""
    y = y0
    for coeff, k in zip(coeffs, ks):
        if coeff != 0.0:
            y = y + (h * coeff) * k
    return y


def rk_step(f: Callable[[float, Y], Y], t0: float, h: float, y0: Y, tableau: ButcherTableau,
            gate: Callable[[Y, Y], Y] | None = None) -> Y:
    """One step of the explicit RK method `tableau` from (t0, y0) with step size h.

    Args:
        f: the derivative, f(t, y) -> dy/dt with y's shape.
        t0: the step's start time. h: the step size.
        y0: the state at t0.
        gate: a gated tableau's g(k_0, k_1) -> (batch, seq, 1) in (0, 1); None otherwise.
    Returns:
        The state at t0 + h; a gated tableau's: y0 + h (g k_0 + (1 - g) k_1).
    """
    check_gate(tableau, gate)
    return solution(y0, h, tableau, rk_stages(f, t0, h, y0, tableau), gate)


def rk_stages(f, t0: float, h: float, y0: Y, tableau: ButcherTableau) -> list:
    """The stage values k_i of one step of tableau from (t0, y0), in order (k_0 = f(t0, y0))."""
    ks = []
    for c_i, a_i in zip(tableau.c, tableau.a):
        ks.append(f(t0 + c_i * h, _combine(y0, h, a_i, ks)))
    return ks


def check_gate(tableau: ButcherTableau, gate) -> None:
    """A gated tableau needs the block's gate; refused by name otherwise."""
    if tableau.gated and gate is None:
        raise ValueError(f"ode_solver: {tableau.name} needs the block's gate (parameters gate.weight, gate.bias)")


def solution(y0: Y, h: float, tableau: ButcherTableau, ks, gate=None) -> Y:
    """The step's result from its stage values ks: y0 + h sum_i b_i k_i, or the gated
    y0 + h (g k_0 + (1 - g) k_1)."""
    if tableau.gated:
        g = gate(ks[0], ks[1])
        return y0 + h * (g * ks[0] + (1.0 - g) * ks[1])
    return _combine(y0, h, tableau.b, ks)


def stage_rows(tableau: ButcherTableau, h: float) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """(c_i h for each stage, the rows h a_ij padded with zeros to num_stages entries): what rk_step
    computes from the tableau, as data. A port that loops over the stages instead of writing them out
    reads stage i's time from these, and its combination from these or from stage_columns; rk_step
    skips a zero entry (its term is never added, so a non-finite k_j it multiplies stays out), and
    so must the loop."""
    s = tableau.num_stages
    return (tuple(c_i * h for c_i in tableau.c),
            tuple(tuple(h * a_ij for a_ij in a_i) + (0.0,) * (s - len(a_i)) for a_i in tableau.a))


def stage_columns(tableau: ButcherTableau, h: float) -> tuple[tuple[float, ...], ...]:
    """For a port whose loop over the stages carries every stage's input and the step's solution,
    stacked: row i holds k_i's coefficient in each stage's input (h a_ji, zero for j <= i) and,
    last, in the solution (h b_i; zero for a gated tableau, whose solution the gate makes). Adding
    k_i's terms to every sum as each stage comes gives each sum rk_step's terms in rk_step's order;
    a zero entry's term is skipped, as rk_step skips it."""
    s = tableau.num_stages
    _, rows = stage_rows(tableau, h)
    b = (0.0,) * s if tableau.gated else tuple(h * b_i for b_i in tableau.b)
    return tuple(tuple(rows[j][i] for j in range(s)) + (b[i],) for i in range(s))


def step_times(steps: int) -> list[float]:
    """t_k = k / steps for k = 0 .. steps - 1, each computed exactly (no accumulated sum)."""
    return [k / steps for k in range(steps)]


def integrate(f: Callable[[float, Y], Y], y0: Y, tableau: ButcherTableau, steps: int,
              gate: Callable[[Y, Y], Y] | None = None, *, checkpoint: Callable | None = None,
              trajectory: bool = True) -> list[Y]:
    """Fixed steps of size h = 1 / steps over t in [0, 1]: the states [y(t_0), ..., y(1)], or with
    trajectory=False just [y(1)], holding no earlier state while it runs.

    checkpoint: None, or a port's activation checkpointing, checkpoint(fn, *args) -> fn(*args)
    (torch.utils.checkpoint), which must not change the values. The steps then run in segments of
    ceil(sqrt(steps)) steps, each segment and each step within it under checkpoint: the backward
    pass keeps the segments' first states, recomputes one segment at a time keeping its steps'
    first states, and one step's activations at a time. So training holds about 2 sqrt(steps)
    states besides one step's activations (one state per step if each step alone were wrapped).
    """
    h = 1.0 / steps

    def step(t0: float, y: Y) -> Y:
        return rk_step(f, t0, h, y, tableau, gate)

    def run(times: list[float], y: Y) -> list[Y]:
        """The states after each step from times[0], or [the last] without trajectory."""
        states = []
        for t0 in times:
            y = step(t0, y) if checkpoint is None else checkpoint(step, t0, y)
            if trajectory:
                states.append(y)
        return states if trajectory else [y]

    times = step_times(steps)
    size = steps if checkpoint is None else math.ceil(math.sqrt(steps))
    states = [y0]
    for i in range(0, steps, size):
        segment = times[i:i + size]
        out = run(segment, states[-1]) if checkpoint is None else checkpoint(run, segment, states[-1])
        states = states + out if trajectory else out
    return states


# ---- the backward pass -------------------------------------------------------------------------------
def add_grads(total: dict, grads: dict) -> dict:
    """total + grads, key by key (nested dicts too); a key missing from total is taken as is."""
    out = dict(total)
    for key, value in grads.items():
        out[key] = value if key not in out else add_grads(out[key], value) if isinstance(value, dict) else out[key] + value
    return out


def rk_step_vjp(f, f_vjp, t0: float, h: float, y0, tableau: ButcherTableau, y_bar, gate=None, gate_vjp=None):
    """(y0_bar, grads) of rk_step(f, t0, h, y0, tableau, gate) for the cotangent y_bar of its result.

    f_vjp(t, y, k_bar) -> (y_bar, grads) is f's VJP at (t, y); gate_vjp(g_bar, k0, k1) -> (k0_bar,
    k1_bar, grads) the gate's. grads are dicts of parameter cotangents, summed over the stages.
    The stages are recomputed forward (their inputs Y_i and values k_i), then reversed: k_i gets
    h b_i y_bar (a gated tableau: h g y_bar and h (1 - g) y_bar, and the gate its own cotangent),
    and stage i's input cotangent flows to y0 and, through a_ij, to the earlier k_j."""
    ys, ks = [], []
    for c_i, a_i in zip(tableau.c, tableau.a):
        ys.append(_combine(y0, h, a_i, ks))
        ks.append(f(t0 + c_i * h, ys[-1]))
    grads: dict = {}
    if tableau.gated:
        g = gate(ks[0], ks[1])
        g_bar = h * (y_bar * (ks[0] - ks[1])).sum(axis=-1, keepdims=True)  # (batch, seq, 1)
        k0_bar, k1_bar, grads = gate_vjp(g_bar, ks[0], ks[1])
        k_bars = [h * g * y_bar + k0_bar, h * (1.0 - g) * y_bar + k1_bar]
    else:
        k_bars = [(h * b_i) * y_bar for b_i in tableau.b]
    y0_bar = y_bar
    for i in reversed(range(tableau.num_stages)):
        stage_bar, stage_grads = f_vjp(t0 + tableau.c[i] * h, ys[i], k_bars[i])
        grads = add_grads(grads, stage_grads)
        y0_bar = y0_bar + stage_bar
        for j, a_ij in enumerate(tableau.a[i]):
            if a_ij != 0.0:
                k_bars[j] = k_bars[j] + (h * a_ij) * stage_bar
    return y0_bar, grads

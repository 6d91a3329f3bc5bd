"""Multistep solvers as data, beside the Runge-Kutta tableaus, and the one entry that runs either.

    ab2       y_{n+1} = y_n + h (3/2 f_n - 1/2 f_{n-1})                      Adams-Bashforth, order 2
    ab3       y_{n+1} = y_n + h (23/12 f_n - 16/12 f_{n-1} + 5/12 f_{n-2})   Adams-Bashforth, order 3
    momentum  v_{n+1} = gamma v_n + (1 - gamma) f_n,  y_{n+1} = y_n + h v_{n+1},  v_0 = 0   order 1

with f_n = f(t_n, y_n), t_n = n / steps, h = 1 / steps. An Adams-Bashforth method needs the k - 1
evaluations before f_n: its first k - 1 steps are steps of an RK method of its order (the
starter: Heun's for ab2, Kutta's third order for ab3), whose first stage is f(t_n, y_n), so f_n is
kept from it as from any step. After the start a step evaluates f once, so every evaluation of f
is one per step but the starter's further stages; a prefill records them all, in order (the cache
holds one slot each, cache.evaluations). The sums are in the formula's order, newest first:
y_n + (h b_0) f_n + (h b_1) f_{n-1} + ..., as rk.py's, each coefficient h b_j a Python float.

momentum is the momentum update of Sander et al., "Momentum Residual Neural Networks" (ICML 2021;
the momentumnet package: v <- gamma v + (1 - gamma) f(x), x <- x + v, its speed starting at 0),
taken as a solver with step h: x <- x + h v. gamma is the config's momentum_gamma.

The block's other solvers are rk.py's. solve() runs either kind, so every port that calls it (the
spec, torch, the ONNX export on graph values, a prefill and a decode step) runs these too.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, TypeVar, Union

import numpy as np

from .rk import _combine, add_grads, integrate, rk_stages, rk_step_vjp, solution, step_times
from .tableaus import HEUN, RK3_KUTTA, TABLEAUS, ButcherTableau

Y = TypeVar("Y")


@dataclass(frozen=True)
class MultistepMethod:
    name: str
    order: int  # global order of accuracy
    betas: tuple[float, ...]  # b_0 (f_n's) .. b_{k-1} (f_{n-k+1}'s); () for momentum
    starter: Optional[ButcherTableau]  # the first k - 1 steps' RK method; None for momentum
    doc: str = ""
    gamma: Optional[float] = None  # momentum's, bound from the config (solver_of); None otherwise
    gated = False  # no learnt weights: what a port asks of any solver

    @property
    def momentum(self) -> bool:
        return self.name == "momentum"

    @property
    def history(self) -> int:
        """How many evaluations a step combines: k for ABk, 1 for momentum (its speed)."""
        return max(len(self.betas), 1)


def _ab(name: str, order: int, betas, starter: ButcherTableau, doc: str) -> MultistepMethod:
    return MultistepMethod(name, order, tuple(float(Fraction(b)) for b in betas), starter, doc)


AB2 = _ab("ab2", 2, ["3/2", "-1/2"], HEUN, "Adams-Bashforth 2, started by one step of Heun's method.")
AB3 = _ab("ab3", 3, ["23/12", "-16/12", "5/12"], RK3_KUTTA,
          "Adams-Bashforth 3, started by two steps of Kutta's third-order method.")
MOMENTUM = MultistepMethod("momentum", 1, (), None, "The momentum update (Sander et al. 2021) as a solver, "
                           "v <- gamma v + (1 - gamma) f, y <- y + h v, v starting at 0.")
MULTISTEP: dict[str, MultistepMethod] = {m.name: m for m in (AB2, AB3, MOMENTUM)}
MOMENTUM_GAMMA = 0.9  # momentum_gamma's default, momentumnet's

Solver = Union[ButcherTableau, MultistepMethod]


def solver(name: str) -> Solver:
    """The solver registered under name: a tableau (read live: a registered one counts) or a
    multistep method. KeyError otherwise."""
    return TABLEAUS[name] if name in TABLEAUS else MULTISTEP[name]


def solver_of(config) -> Solver:
    """The config's solver, momentum's gamma bound from momentum_gamma."""
    method = solver(config.ode_solver)
    if isinstance(method, MultistepMethod) and method.momentum:
        return dataclasses.replace(method, gamma=float(config.momentum_gamma))
    return method


def with_solver(config, name: str, **fields):
    """config with ode_solver `name` (and fields): momentum_gamma kept for momentum, else its default,
    since no other solver reads it (the config refuses it set beside another)."""
    gamma = {} if name == "momentum" else {"momentum_gamma": MOMENTUM_GAMMA}
    return dataclasses.replace(config, ode_solver=name, **gamma, **fields)


def evaluations(method: Solver, steps: int) -> int:
    """How many times `steps` steps of method evaluate f."""
    if isinstance(method, ButcherTableau):
        return steps * method.num_stages
    started = min(steps, method.history - 1)  # the starter's steps
    return started * (method.starter.num_stages if started else 0) + (steps - started)


def multistep(f: Callable[[float, Y], Y], t0: float, h: float, y: Y, method: MultistepMethod, past: tuple,
              n: int) -> tuple:
    """Step n of method from (t0, y), past the evaluations before it, newest first (momentum: its
    speed, or () at the first step): (the state at t0 + h, the new past)."""
    if method.momentum:
        f_n = f(t0, y)
        v = (1.0 - method.gamma) * f_n if not past else method.gamma * past[0] + (1.0 - method.gamma) * f_n
        return y + h * v, (v,)
    if n < method.history - 1:  # a starter step: its first stage is f_n
        ks = rk_stages(f, t0, h, y, method.starter)
        return solution(y, h, method.starter, ks), (ks[0], *past)
    past = (f(t0, y), *past)[:method.history]
    return _combine(y, h, method.betas, past), past


def solve(f: Callable[[float, Y], Y], y0: Y, method: Solver, steps: int, gate: Callable | None = None, *,
          checkpoint: Callable | None = None, trajectory: bool = True) -> list:
    """rk.integrate's states for any solver: a tableau by rk.integrate; a multistep method's steps
    here, each under checkpoint when given (checkpoint(fn, *args), which must not change the values:
    a step carries its past, so the backward pass keeps each step's state and past, not rk's
    segments)."""
    if isinstance(method, ButcherTableau):
        return integrate(f, y0, method, steps, gate, checkpoint=checkpoint, trajectory=trajectory)
    h, y, past, states = 1.0 / steps, y0, (), [y0]

    def step(n, t0, y, *past):
        y, past = multistep(f, t0, h, y, method, past, n)
        return (y, *past)

    for n, t0 in enumerate(step_times(steps)):
        y, *past = step(n, t0, y, *past) if checkpoint is None else checkpoint(step, n, t0, y, *past)
        past = tuple(past)
        if trajectory:
            states.append(y)
    return states if trajectory else [y]


def multistep_vjp(f, f_vjp, method: MultistepMethod, steps: int, y_bar, states: list) -> tuple:
    """(y0_bar, grads) of solve(f, y0, method, steps)[-1] for y_bar, states its trajectory (y0 first).
    f_vjp(t, y, k_bar) -> (y_bar, grads). Reversed step by step: each evaluation's cotangent is
    summed from every later step that reads it, then passed back through f at its state; a
    starter step's own stages through rk.rk_step_vjp's rule."""
    h, times = 1.0 / steps, step_times(steps)
    started = min(steps, method.history - 1)  # momentum's history is 1: no starter
    f_bars: dict = {}  # n -> the cotangent of f_n so far
    grads: dict = {}
    v_bar = None  # momentum: the cotangent of v_{n+1}
    for n in reversed(range(steps)):
        if method.momentum:  # y_{n+1} = y_n + h v_{n+1}, v_{n+1} = gamma v_n + (1 - gamma) f_n
            v_bar = h * y_bar if v_bar is None else h * y_bar + method.gamma * v_bar
            f_bars[n] = (1.0 - method.gamma) * v_bar
        elif n >= started:  # y_{n+1} = y_n + h sum_j b_j f_{n-j}
            for j, b_j in enumerate(method.betas):
                if n - j >= 0:
                    term = (h * b_j) * y_bar
                    f_bars[n - j] = term if n - j not in f_bars else f_bars[n - j] + term
        else:  # a starter step, its first stage f_n read by the later steps too
            y_bar, step_grads = rk_step_vjp(f, f_vjp, times[n], h, states[n], method.starter, y_bar)
            grads = add_grads(grads, step_grads)
        if n in f_bars:
            stage_bar, f_grads = f_vjp(times[n], states[n], f_bars.pop(n))
            y_bar, grads = y_bar + stage_bar, add_grads(grads, f_grads)
    return y_bar, grads


def check_momentum_gamma(value, solver_name: str) -> float:
    """momentum_gamma as a float in [0, 1), and at its default (MOMENTUM_GAMMA) unless the solver is momentum,
    which alone reads it (another solver would ignore it: refused, not dropped)."""
    bad = isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and 0.0 <= value < 1.0)
    if bad:
        raise ValueError(f"momentum_gamma: expected a number in [0, 1); got {value!r}")
    if value != MOMENTUM_GAMMA and solver_name != "momentum":
        raise ValueError(f"momentum_gamma: the momentum solver's; got {value!r} with ode_solver {solver_name!r} "
                         "(which would ignore it)")
    return float(value)

"""Explicit Runge-Kutta methods as data: one validated Butcher tableau per solver.

        c_0 |
        c_1 | a_10
        c_2 | a_20  a_21
        ... | ...
    --------+---------------------
            | b_0   b_1   ...  b_{s-1}

Stage i evaluates k_i = f(t + c_i h, y + h * sum_j a_ij k_j) for j < i, and the step returns
y + h * sum_i b_i k_i. Explicit means a is strictly lower triangular and c_0 = 0. Every solver
below is run by the one stepper in rk.py; adding a solver is adding a tableau.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class ButcherTableau:
    name: str
    order: int  # global order of accuracy
    c: tuple[float, ...]  # stage times, c_0 = 0
    a: tuple[tuple[float, ...], ...]  # row i has i entries (strictly lower triangular)
    b: tuple[float, ...]  # solution weights
    doc: str = ""

    def __post_init__(self) -> None:
        s = len(self.c)
        if len(self.b) != s or len(self.a) != s:
            raise ValueError(f"tableau {self.name}: c, a and b must all have {s} rows")
        for i, row in enumerate(self.a):
            if len(row) != i:
                raise ValueError(f"tableau {self.name}: row {i} of a must have {i} entries; got {len(row)}")
            if abs(sum(row) - self.c[i]) > 1e-15:
                raise ValueError(f"tableau {self.name}: row {i}: sum(a) = {sum(row)} != c = {self.c[i]}")
        if abs(sum(self.b) - 1.0) > 1e-15:
            raise ValueError(f"tableau {self.name}: sum(b) = {sum(self.b)} != 1")

    @property
    def num_stages(self) -> int:
        return len(self.c)


def _tableau(name, order, c, a, b, doc):
    """Build from exact fractions so every coefficient is the nearest float to its true value."""
    f = lambda v: float(Fraction(v))  # noqa: E731
    return ButcherTableau(
        name, order, tuple(map(f, c)), tuple(tuple(map(f, row)) for row in a), tuple(map(f, b)), doc
    )


EULER = _tableau("euler", 1, ["0"], [[]], ["1"], "Forward Euler; the residual block y + F(y).")
MIDPOINT = _tableau(
    "midpoint", 2, ["0", "1/2"], [[], ["1/2"]], ["0", "1"],
    "Explicit midpoint method.",
)
HEUN = _tableau(
    "heun", 2, ["0", "1"], [[], ["1"]], ["1/2", "1/2"],
    "Heun's method (explicit trapezoid); the ODE Transformer's RK2 block.",
)
RALSTON = _tableau(
    "ralston", 2, ["0", "2/3"], [[], ["2/3"]], ["1/4", "3/4"],
    "Ralston's second-order method (minimum error bound among 2-stage RK2).",
)
RK4_CLASSIC = _tableau(
    "rk4", 4, ["0", "1/2", "1/2", "1"],
    [[], ["1/2"], ["0", "1/2"], ["0", "0", "1"]],
    ["1/6", "1/3", "1/3", "1/6"],
    "Classical RK4, as the seed module and the ODE Transformer use. Not torchdiffeq's 'rk4', "
    "which is the 3/8 rule (rk38 here).",
)
RK4_3_8 = _tableau(
    "rk38", 4, ["0", "1/3", "2/3", "1"],
    [[], ["1/3"], ["-1/3", "1"], ["1", "-1", "1"]],
    ["1/8", "3/8", "3/8", "1/8"],
    "Kutta's 3/8 rule, fourth order; torchdiffeq calls it 'rk4'. Differs from classical RK4 at "
    "O(h^5) per step.",
)

TABLEAUS: dict[str, ButcherTableau] = {
    t.name: t for t in (EULER, MIDPOINT, HEUN, RALSTON, RK4_CLASSIC, RK4_3_8)
}

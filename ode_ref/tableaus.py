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

A gated tableau (the ODE Transformer's learnable RK2) has two stages whose weights are not
constants: b = (g, 1 - g), with g = sigmoid([k_0; k_1] @ W_g^T + b_g) per token, learnt (the
block's parameters gate.weight and gate.bias). Its b below is the value at g = 1/2, where it is
Heun's method; for a general gate it is first order.
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
    b: tuple[float, ...]  # solution weights (a gated tableau: the weights at g = 1/2)
    doc: str = ""
    gated: bool = False  # b = (g, 1 - g) from the block's learnt gate; two stages only

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
        if self.gated and s != 2:
            raise ValueError(f"tableau {self.name}: a gated tableau has 2 stages; got {s}")

    @property
    def num_stages(self) -> int:
        return len(self.c)


def _tableau(name, order, c, a, b, doc, gated=False):
    """Build from exact fractions so every coefficient is the nearest float to its true value."""
    f = lambda v: float(Fraction(v))  # noqa: E731
    return ButcherTableau(
        name, order, tuple(map(f, c)), tuple(tuple(map(f, row)) for row in a), tuple(map(f, b)), doc, gated
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

RK2_GATED = _tableau(
    "rk2_gated", 1, ["0", "1"], [[], ["1"]], ["1/2", "1/2"],
    "The ODE Transformer's learnable RK2: Heun's stages, z + h (g F1 + (1 - g) F2) with a learnt "
    "per-token gate g (parameters gate.weight, gate.bias); at steps = 1 the paper's block.",
    gated=True,
)

TABLEAUS: dict[str, ButcherTableau] = {
    t.name: t for t in (EULER, MIDPOINT, HEUN, RALSTON, RK4_CLASSIC, RK4_3_8, RK2_GATED)
}

# Two third-order tableaus for the ODE Transformer's rk3 block (encoder_block.py), kept out of
# TABLEAUS: they are not solvers of the attention block (adding one there would add cases).
RK3_KUTTA = _tableau(
    "rk3", 3, ["0", "1/2", "1"], [[], ["1/2"], ["-1", "2"]], ["1/6", "2/3", "1/6"],
    "Kutta's third-order method, the ODE Transformer paper's RK3 block.",
)
RK3_RELEASED = _tableau(
    "rk3_released", 2, ["0", "1/2", "1"], [[], ["1/2"], ["0", "1"]], ["1/6", "2/3", "1/6"],
    "The released ODE Transformer code's RK3: its third stage input, meant as y - k_0 + 2 k_1, is "
    "written y - k_1 + 2 k_1, which is y + k_1 (a_20 = 0, a_21 = 1); second order.",
)

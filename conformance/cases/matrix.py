"""The case matrix: a pairwise cover of the factors that stays put when the factors grow.

BASE_FACTORS is frozen: its cover is the matrix of cases version 2. factors() reads the current
values from ode_ref (every registered norm and tableau); a value or factor added since then
gets rows appended that cover its pairs (extend_pairwise), and no existing row changes. A case
is named by its row, and its seeds derive from its name (cases.py), so existing files stay
byte-identical when the spec grows.
"""

from __future__ import annotations

import dataclasses
import itertools

import ode_ref as R
from ode_ref import config as C
from ode_ref.norms import NORM_PARAMS
from ode_ref.tableaus import TABLEAUS

# Frozen: do not edit. New values belong in ode_ref (they are picked up by factors()).
BASE_FACTORS = {
    "norm_type": ["layer_norm", "rms_norm", "prms_norm", "flash_norm", "dynamic_tanh", "derf"],
    "ode_solver": ["euler", "midpoint", "heun", "ralston", "rk4", "rk38"],
    "mode": ["encoder", "decoder"],
    "use_bitnet": [False, True],
    "padding": [False, True],
    "ode_steps": [1, 2, 3, 4, 5, 6, 7, 8],
    # (batch, seq, heads, d_model): T = 1, H = 1, D not a power of two, B up to 3
    "shape": [(2, 5, 2, 8), (1, 1, 1, 6), (3, 7, 3, 12), (2, 4, 1, 10), (1, 9, 4, 16)],
}


# Options added since the base: name -> values, the default first (it is what every existing
# case has). Adding one appends the rows that cover its pairs. OPTION_FIELDS turns a value into
# config fields.
EXTRA_FACTORS: dict[str, list] = {
    "positions": ["none", "rope", "alibi"],
}
OPTION_FIELDS = {
    "positions": lambda v: {} if v == "none" else {"ode_use_pe": True, "positional_encoding": v},
}
# Frozen history: what grew the matrix since the base, oldest first: an option of EXTRA_FACTORS by
# name, or a value registered in ode_ref as (factor, value). Each appended the rows covering its
# pairs given every row before it. Append here when something is added; never reorder.
HISTORY: list = [
    "positions",
    ("ode_solver", "rk2_gated"),
]


def factors() -> dict:
    """The current factors: the base ones with every value ode_ref now registers appended, then
    the options added since."""
    current = {k: list(v) for k, v in BASE_FACTORS.items()}
    registered = (("norm_type", NORM_PARAMS), ("ode_solver", TABLEAUS), ("mode", C.MODES))  # read live
    for name, values in registered:
        current[name] += [v for v in values if v not in current[name]]
    return {**current, **{k: list(v) for k, v in EXTRA_FACTORS.items()}}


def _pairs(factors: dict, row: dict):
    names = list(factors)
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}


def extend_pairwise(rows: list[dict], factors: dict) -> list[dict]:
    """Rows appended to `rows` so that every pair of values of two factors appears at least once.

    A factor missing from an existing row takes its first value there (its default). Greedy and
    deterministic: each new row starts from the first uncovered pair and fills the other factors
    with the value covering the most still-uncovered pairs (the first value wins a tie)."""
    names = list(factors)
    order = {n: i for i, n in enumerate(names)}
    rows = [{n: row.get(n, factors[n][0]) for n in names} for row in rows]
    uncovered = {
        ((a, va), (b, vb))
        for a, b in itertools.combinations(names, 2)
        for va in factors[a]
        for vb in factors[b]
    }
    for row in rows:
        uncovered -= _pairs(factors, row)
    new = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (order[p[0][0]], order[p[1][0]], str(p)))
        row = {a: va, b: vb}
        for n in names:
            if n in row:
                continue

            def gain(v):
                return sum(
                    ((m, row[m]), (n, v)) in uncovered if order[m] < order[n] else ((n, v), (m, row[m])) in uncovered
                    for m in row
                )
            row[n] = max(factors[n], key=gain)
        row = {n: row[n] for n in names}
        new.append(row)
        uncovered -= _pairs(factors, row)
    return new


def pairwise(factors: dict) -> list[dict]:
    """A pairwise cover from scratch."""
    return extend_pairwise([], factors)


def rows() -> list[dict]:
    """The matrix: the base cover; then, step by step in HISTORY's order, the rows that cover an
    added option's or value's pairs; then the rows covering anything new since (an option not yet
    in HISTORY, a value registered at run time). Each extension starts from all the rows before
    it, so growing the matrix only appends rows."""
    out = pairwise(BASE_FACTORS)
    grown = {k: list(v) for k, v in BASE_FACTORS.items()}

    def extend(factors):
        filled = [{n: r.get(n, factors[n][0]) for n in factors} for r in out]
        return filled + extend_pairwise(filled, factors)

    for step in HISTORY:
        if isinstance(step, str):
            grown[step] = list(EXTRA_FACTORS[step])
        elif step[1] in factors()[step[0]]:  # registered values only: a history entry never invents one
            grown[step[0]].append(step[1])
        out = extend(grown)
    current = factors()
    return extend({**grown, **current})


def config_of(row: dict) -> R.ODEConfig:
    """The row's config: its shape's width and heads, and every factor that is a config field."""
    batch, seq, heads, d_model = row["shape"]
    fields = {f.name for f in dataclasses.fields(R.ODEConfig)}
    options = {k: v for name, to_fields in OPTION_FIELDS.items() if name in row for k, v in to_fields(row[name]).items()}
    return R.ODEConfig(hidden_size=d_model, num_heads=heads, **{k: v for k, v in row.items() if k in fields}, **options)


def row_name(row: dict) -> str:
    """The base factors always; an option added since, only where it is not its default."""
    b, t, h, d = row["shape"]
    name = (f"block_{row['norm_type']}_{row['ode_solver']}_{row['mode']}_{'bitnet' if row['use_bitnet'] else 'float'}"
            f"_{'pad' if row['padding'] else 'nopad'}_s{row['ode_steps']}_b{b}t{t}h{h}d{d}")
    extra = [f"{k}-{row[k]}" for k, values in EXTRA_FACTORS.items() if row[k] != values[0]]
    return "_".join([name, *extra])

"""The fuzzer's factors as one declared table, and a covering array of strength 2 over it.

Each factor is a dimension a kernel may switch on, its levels bands of the draw space's values
(draw.py), simplest first. A run starts from a covering array: rows in which every pair of levels
of two factors appears at least once, where the pair is feasible at all (INFEASIBLE names the
ones that are not, with the reason), then draws at random for the rest of its budget. A row is a
region of the draw space, not an example: the draw inside it (the sequence within its band, the
seeds, the options) is the seed's, so `--seed` still draws other examples for the array's cells.
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import Optional

import ode_ref as R
from ode_ref.multistep import MULTISTEP

from . import draw as D
from ..cases.fields import defaults

# factor -> level -> the values a draw in that level takes (a kind, a solver: the name itself)
FACTORS = {
    "kind": {k.name: (k.name,) for k in D.DRAWN_KINDS},
    # each RK tableau a level; the multistep solvers are drawn in the random phase (draw.py), not
    # here: a level of theirs regrows every row, and the planted bugs' by-construction catches
    # (tests/conformance/test_fuzz_cover.py) were measured on this array
    "ode_solver": {s: (s,) for s in R.SOLVERS if s not in MULTISTEP},
    "norm_type": {n: (n,) for n in R.NORM_TYPES},
    "encoding": {e: (e,) for e in D.POSITIONS},
    "options": {"default": ("default",), "other": ("other",)},  # the encoding's options at their defaults, or each away from it
    "use_bitnet": {"float": (False,), "bitnet": (True,)},
    "mode": {"encoder": ("encoder",), "decoder": ("decoder",)},
    "steps": {"1": (1,), "2": (2,), "3-4": (3, 4), "5-9": (5, 8, 9)},
    "seq": {"1-9": (2, 3, 4, 5, 7, 8, 9), "15-17": (15, 16, 17), "31-33": (31, 32, 33), "63-65": (63, 64, 65),
            "127-130": (127, 128, 129, 130), "255-257": (255, 256, 257), "511-513": (511, 512, 513)},
    "head_dim": {"1-9": (1, 2, 3, 4, 5, 6, 7, 8, 9), "12-17": (12, 15, 16, 17), "24-33": (24, 31, 32, 33),
                 "48-65": (48, 63, 64, 65), "96-128": (96, 128)},
    "heads": {"1": (1,), "2-4": (2, 3, 4), "5-16": (5, 8, 9, 15, 16)},
    "batch": {"1": (1,), "2-4": (2, 3, 4), "5-9": (5, 8, 9)},
    "padding": {"no mask": (None,), **{p: (p,) for p in D.ROW_PADDING}},
    "decoded": {"none": (0,), "1-3": (1, 2, 3), "4-8": (4, 5, 8), "9-17": (9, 16, 17)},
    "input": {"N(0, 1)": ((1.0, 0.0),), "small": ((1e-2, 0.0), (1e-4, 0.0)), "large": ((1e2, 0.0), (1e4, 0.0)),
              "offset": ((1.0, 100.0), (1.0, -30.0))},
}


_ORDER = {name: i for i, name in enumerate(FACTORS)}
_KINDS = {k.name: k for k in D.DRAWN_KINDS}


def _least(factor: str, level: str, row: Optional[dict] = None, support: Optional[dict] = None):
    """The value a cell's example takes for a size factor: its level's least (of those a declared
    support keeps), a head's width the least giving CELL_WIDTH channels at the row's least heads."""
    field = CONFIG_FACTORS.get(factor, factor)
    values = sorted(FACTORS[factor][level])
    values = [v for v in values if v in (support or {}).get(field, values)] or values
    if factor == "head_dim":
        heads = _least("heads", row["heads"], support=support) if row and "heads" in row else 1
        return next((v for v in values if heads * v >= CELL_WIDTH), values[-1])
    return values[0]


@functools.lru_cache(maxsize=None)
def _least_of(factor: str, level: str, heads: Optional[str]) -> int:
    """_least with no declared support, the row given by its heads' level alone (what it reads)."""
    return _least(factor, level, None if heads is None else {"heads": heads})


def _why_not(row: dict) -> Optional[str]:
    """Why a (partial) row holds no draw at all, or None: the kinds' own rules (cases/kinds.py) and
    the draw space's caps (draw.MAX_ELEMENTS, draw.MAX_WORK)."""
    kind = _KINDS.get(row.get("kind"))
    least = {f: _least_of(f, row[f], row.get("heads")) for f in SIZES if f in row}
    if kind is not None and "steps" in row and least["steps"] > kind.most_steps:
        return f"a {kind} draw takes at most {kind.most_steps} steps"
    if kind is not None and "mode" in row and row["mode"] != kind.fixed_fields.get("mode", row["mode"]):
        return f"a {kind} draw runs in {kind.fixed_fields['mode']} mode"
    if kind is not None and "decoded" in row and (row["decoded"] == "none") != (kind.min_decoded == 0):
        return "a decode draw decodes a token or more, the others none"
    if row.get("encoding") == "none" and row.get("options") == "other":
        return "no encoding, no options"
    if row.get("norm_type") in SATURATING and row.get("input") == "offset":
        return (f"{row['norm_type']} saturates on an input offset far from zero: every token normed to the same +-1 "
                "vector, attention sees one token")
    if row.get("padding") == "full" and row.get("batch") == "1" and row.get("kind", "decode") != "decode":
        return "one row with every token padded: every output zero, nothing computed to compare"
    if (row.get("encoding", "none") != "none" and row.get("padding") in ("all_but_one", "full") and row.get("batch") == "1"
            and row.get("kind", "decode") != "decode"):
        return "a positional encoding needs two real tokens in a row: one row, all but one or all padded, has none"
    if "decoded" in row and "seq" in row and least["decoded"] >= max(FACTORS["seq"][row["seq"]]):
        return "the decoded tokens need a prompt before them in the sequence"
    if "heads" in least and "head_dim" in least and least["heads"] * least["head_dim"] > D.MAX_WIDTH:
        return f"heads x head_dim over the widest d_model ({D.MAX_WIDTH})"
    elements = 1
    for f in ("seq", "head_dim", "heads", "batch"):
        elements *= least.get(f, 1)
    if "seq" in row and elements > D.MAX_ELEMENTS:
        return f"batch x seq x d_model over the memory cap ({D.MAX_ELEMENTS})"
    evaluations = least.get("steps", 1) * (D.stages(row["ode_solver"]) if "ode_solver" in row else 1)
    if "seq" in row and D.work(kind or D.DRAWN_KINDS[0], least.get("batch", 1), least.get("heads", 1), least["seq"],
                               evaluations) > D.MAX_WORK:
        return f"batch x heads x seq^2 x evaluations of f over the time cap ({D.MAX_WORK})"
    if least.get("decoded", 0) * evaluations > D.MAX_STEPPED:
        return f"decoded tokens x evaluations of f over the decoding cap ({D.MAX_STEPPED})"
    if row.get("use_bitnet") == "bitnet" and least.get("seq", 0) > D.SEQS[-1]:
        return f"BitLinear past {D.SEQS[-1]} tokens: the draw space's long sequences have float projections (no fair input)"
    cap = D.MAX_ROUNDED_OFFSET if row.get("input") == "offset" else D.MAX_ROUNDED
    if row.get("use_bitnet") == "bitnet" and "seq" in row and D.rounded(
            least.get("batch", 1), least["seq"], least.get("heads", 1) * least.get("head_dim", 1), evaluations) > cap:
        return f"BitLinear's rounded activations, batch x seq x d_model x evaluations, over the fair-input cap ({cap})"
    return None


def levels(name: str, kept: Optional[frozenset] = None) -> list:
    """A factor's levels, those of kept alone where it names any of the factor's (allowed())."""
    names = [lv for lv in FACTORS[name] if kept is None or (name, lv) in kept]
    return names or list(FACTORS[name])


def complete(row: dict, kept: Optional[frozenset] = None) -> Optional[dict]:
    """A whole feasible row holding row's levels (the first, depth first), or None: two levels
    may each fit a pair and still no row hold both (a decoder's decoded tokens need its kind).
    kept: the levels a declared support allows (allowed()), None for all."""
    if _why_not(row) is not None:
        return None
    missing = next((name for name in FACTORS if name not in row), None)
    if missing is None:
        return row
    return next((found for level in levels(missing, kept) if (found := complete({**row, missing: level}, kept)) is not None), None)


def _no_third(row: dict, kept: Optional[frozenset] = None) -> str:
    """Why no row holds a pair that no single rule refuses: the first factor none of whose levels fits."""
    for name in FACTORS:
        if name not in row and all(complete({**row, name: lv}, kept) is None for lv in levels(name, kept)):
            why = sorted({_why_not({**row, name: lv}) or "" for lv in FACTORS[name]} - {""})
            return f"no {name} fits both ({'; '.join(why)})"
    return "no draw holds both"


@functools.lru_cache(maxsize=None)
def feasible_pairs(kept: Optional[frozenset] = None) -> tuple[frozenset, dict]:
    """(the pairs of levels of two factors some feasible row holds, the others -> why not); kept:
    of the levels a declared support allows alone (allowed())."""
    feasible, infeasible = set(), {}
    for a, b in itertools.combinations(FACTORS, 2):
        for la, lb in itertools.product(levels(a, kept), levels(b, kept)):
            pair = ((a, la), (b, lb))
            if complete({a: la, b: lb}, kept) is not None:
                feasible.add(pair)
            else:
                infeasible[pair] = _why_not({a: la, b: lb}) or _no_third({a: la, b: lb}, kept)
    return frozenset(feasible), infeasible


def _pair(x: tuple, y: tuple) -> tuple:
    """Two (factor, level) as pairs_of orders them: the factor first in FACTORS first."""
    return (x, y) if _ORDER[x[0]] < _ORDER[y[0]] else (y, x)


def pairs_of(row: dict) -> set:
    names = list(FACTORS)
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2) if a in row and b in row}


@functools.lru_cache(maxsize=None)  # built once a seed: each dtype's run of a backend searches the same rows
def covering_array(seed: int = 0, kept: Optional[frozenset] = None) -> tuple[dict, ...]:
    """Rows (factor -> level) holding every feasible pair at least once: greedy, each row started
    from an uncovered pair and filled with the feasible level covering the most uncovered pairs,
    ties broken by the seed (so two seeds draw different free cells). kept: a declared support's
    levels (allowed()), the rows then of those alone."""
    rng = random.Random(seed)
    uncovered = set(feasible_pairs(kept)[0])
    rows = []
    while uncovered:
        (a, la), (b, lb) = min(uncovered, key=str)
        row = {a: la, b: lb}
        for name in FACTORS:
            if name in row:
                continue
            fits = [lv for lv in levels(name, kept) if complete({**row, name: lv}, kept) is not None]
            rng.shuffle(fits)
            row[name] = max(fits, key=lambda lv: sum(_pair((other, row[other]), (name, lv)) in uncovered for other in row))
        rows.append({name: row[name] for name in FACTORS})
        uncovered -= pairs_of(row)
    return tuple(rows)


def coverage(rows) -> tuple[int, int]:
    """(feasible pairs the rows hold, feasible pairs in all)."""
    feasible, _ = feasible_pairs()
    held = set().union(*(pairs_of(r) for r in rows)) if rows else set()
    return len(held & feasible), len(feasible)


# each encoding's options (draw.positions), which the factor "options" holds at their defaults or away from them
OPTIONS = {"rope": ("rope_base", "rope_scaling"), "sinusoidal_rotary": ("sinusoidal_max_len", "sinusoidal_scale"),
           "alibi": ("alibi_scale",), "hope": ("layer_idx",), "bam": ("bam_learn_mu", "bam_mu_init"),
           "pape": ("pape_num_parabolas",), "pape_efficient": ("pape_num_parabolas",),
           "pape_ri": ("pape_num_parabolas", "pape_num_positions")}
SATURATING = ("derf", "dynamic_tanh")  # elementwise norms that saturate to +-1 far from zero
SIZES = ("seq", "head_dim", "heads", "batch", "steps", "decoded")
# a cell's narrowest d_model: at 1 to 3 channels a norm leaves z's direction a sign or two, so attention's
# input hardly depends on z (d_model 1: not at all), and no bug in what follows it shows
CELL_WIDTH = 4
OPTION_DEFAULTS = defaults(R.ODEConfig)  # what an example's options are compared with (levels_of)
CONFIG_FACTORS = {"ode_solver": "ode_solver", "norm_type": "norm_type", "use_bitnet": "use_bitnet", "mode": "mode",
                  "steps": "ode_steps", "heads": "num_heads", "head_dim": "head_dim"}  # factor -> the support's field


# the levels a cell none of whose draws had a fair input is searched again at: BitLinear's ties, a
# saturating or partial norm, an input far from zero are what leave a draw no fair input (fair.py)
FAIREST = {"use_bitnet": "float", "norm_type": "layer_norm", "input": "N(0, 1)"}


def allowed(support: dict) -> Optional[frozenset]:
    """The (factor, level) pairs a declared support (adapters/support.py) allows: a config factor's
    levels holding a value it declares, the encodings it declares; None where it narrows none, so
    that the array is the one every such port searches (a kind it lacks: cell() searches another)."""
    def declared(field, values):
        return field not in support or any(v in support[field] for v in values)

    kept = {(factor, lv) for factor, field in CONFIG_FACTORS.items() for lv, values in FACTORS[factor].items()
            if declared(field, values)}
    kept |= {("encoding", e) for e in FACTORS["encoding"]
             if declared("ode_use_pe", (e != "none",)) and (e == "none" or declared("positional_encoding", (e,)))}
    kept |= {(factor, lv) for factor in FACTORS if factor not in CONFIG_FACTORS and factor != "encoding" for lv in FACTORS[factor]}
    every = {(factor, lv) for factor in FACTORS for lv in FACTORS[factor]}
    return None if kept == every else frozenset(kept)


def relaxed(row: dict) -> dict:
    """row at FAIREST's levels (the pairs those held are then not met by this row), or row itself
    where the result holds no draw."""
    fairest = {**row, **FAIREST}
    return fairest if _why_not(fairest) is None else row


def cell(row: dict, kinds, support: dict) -> Optional[tuple]:
    """(kind, support, within) of a row for draw.draws: the row's config levels as a declared
    support, narrowed by the backend's own, and its other levels as draws' `within`. A row of a
    kind the backend lacks (a port with no backward pass, or no cached decoding) is searched in the
    first kind it runs that the row's other levels allow (decoding nothing, for a decode row), so
    its other pairs are still met; None where the backend runs none of it (no such kind, a level
    outside its declared support)."""
    kind = next((k for k in kinds if k.name == row["kind"]), None)
    for other in () if kind is not None else kinds:  # a kind it lacks: another, decoding nothing where it must
        for swapped in ({**row, "kind": other.name}, {**row, "kind": other.name, "decoded": "none"}):
            if kind is None and _why_not(swapped) is None:
                kind, row = other, swapped
    if kind is None:
        return None
    narrowed = dict(support)
    encoding = row["encoding"]
    size = {f: (_least(f, row[f], row, support),) for f in SIZES}  # each size its least: the caps hold by construction
    levels = {**{field: size.get(factor, FACTORS[factor][row[factor]]) for factor, field in CONFIG_FACTORS.items()},
              "ode_use_pe": (encoding != "none",), **({"positional_encoding": (encoding,)} if encoding != "none" else {})}
    for field, values in levels.items():
        kept = [v for v in values if v in support.get(field, values)]
        if not kept:
            return None
        narrowed[field] = kept
    # a kind with no f among its quantities (decode, grad) takes a large input at 10^2 alone: at 10^4 its
    # z's hold f's effect below float32's resolution, so no bug in f can show
    bitnet = row["use_bitnet"] == "bitnet"  # at its least sequence too: its roundings within D.MAX_ROUNDED by construction
    within = {"seq": size["seq"] if bitnet else FACTORS["seq"][row["seq"]], "batch": size["batch"], "decoded": size["decoded"],
              "input": FACTORS["input"][row["input"]][:1 if not kind.stages and row["input"] == "large" else None], "padding": FACTORS["padding"][row["padding"]],
              "options": FACTORS["options"][row["options"]][0]}
    return kind, narrowed, within


def _level(factor: str, value) -> Optional[str]:
    return next((level for level, values in FACTORS[factor].items() if value in values), None)


def levels_of(d) -> dict:
    """factor -> the level a drawn example lies in (a value outside every level: left out)."""
    c = d.config
    other = any(getattr(c, f) != OPTION_DEFAULTS[f] for f in OPTIONS.get(c.position_encoding, ()))
    scale_offset = (1.0, d.offset) if d.offset else (d.scale, 0.0)  # an offset input is one whatever its scale
    values = {"kind": d.kind.name, "options": "other" if other else "default", "ode_solver": c.ode_solver, "norm_type": c.norm_type, "encoding": c.position_encoding,
              "use_bitnet": c.use_bitnet, "mode": c.mode, "steps": c.ode_steps, "seq": d.seq, "head_dim": c.head_dim,
              "heads": c.num_heads, "batch": d.batch, "padding": None if d.rows is None else d.rows[0][0],
              "decoded": d.decoded, "input": scale_offset}
    out = {factor: _level(factor, value) for factor, value in values.items()}
    return {factor: level for factor, level in out.items() if level is not None}

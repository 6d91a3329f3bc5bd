"""The draw space of `odeattn conformance fuzz`: configs, shapes, padding and inputs, as hypothesis
strategies, and the live case the spec computes for a draw.

The space covers where real kernels switch paths, by design: sequence lengths at and around 16,
32, 64 and 128, and 256 and 512 at narrow widths (up to 513), batch up to 9 with a padding pattern
of its own per row (up to 17 rows of up to 16 heads, past 64 and 128 of them), head widths at
multiples of 8, 16, 32 and 64 and odd ones, 1 to 16 heads, positions past any table a port might
precompute (sinusoidal_max_len below the sequence), 1 to 9 steps (cached evaluations, steps x
stages, past 16 and 32), 1 to 17 decoded tokens (past 4, 8 and 16), inputs scaled 1e-4 to 1e4 and
offset far from zero (by up to 100 times their spread), and every config field the spec takes.
Each choice is ordered from simple to complex (euler before rk2_gated, no padding before holes,
offset 0 first), so hypothesis shrinks a failure toward the simplest example that still fails.
A draw with a positional encoding has two real tokens in some row (one alone is never rotated
or biased: its position is the only one).

A draw's case is the spec's, computed here in float64 with its own float32 error per quantity
(e32, and e16 or ebf16 for a half dtype), from which the tolerances follow by the golden set's rule
(tolerance.py). The input is redrawn (input seed + 1, + 2, ...) until it is a fair test
(fair.check_fair), as the golden set's is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import ode_ref as R
from ode_ref.config import stored_fields
from ode_ref.multistep import MULTISTEP, evaluations as solver_evaluations, solver as solver_method
from ode_ref.tableaus import TABLEAUS

from ode_ref.precision import HALF_DTYPES

from ..cases import Case, with_half
from ..cases.kinds import BLOCK, DECODE, ENCODER, GRAD, Kind, kind_of
from ..cases.fair import fair_forwards, weight_tie

SEQS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130)  # kernel tiles 16..128 and their neighbours
LONG_SEQS = (255, 256, 257, 511, 512, 513)  # past 256 and 512 keys: within the caps below at narrow widths only
HEAD_DIMS = (4, 1, 2, 3, 5, 6, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 128)  # multiples of 8..64, and odd
MAX_BATCH = 9
MAX_HEADS = 16
MAX_WIDTH = 512  # d_model = heads * head_dim
# Two caps keep one example's spec run within about half a second on a loaded core. Memory:
# batch * seq * d_model (x and each state of the trajectory) within 130 * 64, so seq 257 is drawn at
# d_model <= 32 and seq 513 at d_model <= 16. Time: attention's work, batch * heads * seq^2 * the
# evaluations of f (steps x stages), within MAX_WORK, a backward pass counted GRAD_WORK times (the
# spec's seq 513, 4 heads, rk4 x 9 took 2.3 s for its block, 38M; 2^23 is about 0.5 s).
MAX_ELEMENTS = 130 * 64
MAX_WORK = 2**21
GRAD_WORK = 4  # a grad example's spec cost over a block's of the same shape and evaluations (measured: 4 to 5)
# A decode example's steps, decoded tokens x evaluations, within MAX_STEPPED: each is a call of f on
# one token, about 0.2 ms of the spec's Python (17 tokens at rk4 x 9 took 0.13 s at d_model 4)
MAX_STEPPED = 288  # 17 tokens at up to 16 evaluations, 8 at 36
# A BitLinear draw's rounded activations, batch * seq * d_model * evaluations (each evaluation rounds
# its projections' inputs), within MAX_ROUNDED: each lands within the fair-input margin of a
# rounding tie (fair.py) with a small chance, so an input is fair with odds of about exp(-N / 1500)
# (measured on 12 inputs each: 1020 and 1024 roundings, 6 fair; 3840 to 8192, none)
MAX_ROUNDED = 2**11
# an input offset far from zero: the float32 forward's levels deviate more (the norm's cancellation), so
# the margin is wider and ties likelier (at 128 roundings 4 to 10 of 10 inputs fair, by norm; at 960, none)
MAX_ROUNDED_OFFSET = 2**8
STEPS = (1, 2, 3, 4, 5, 8, 9)  # up to a kind's most_steps: with rk4's 4 stages, 4 to 36 cached evaluations
DECODED = (1, 2, 3, 4, 5, 8, 9, 16, 17)  # decoded tokens: levels across 4, 8 and 16, each as likely as another
ROW_PADDING = ("none", "right", "left", "holes", "all_but_one", "full")  # per row, simple to complex
SCALES = (1.0, 1e-2, 1e2, 1e-4, 1e4)
OFFSETS = (0.0, 100.0, -30.0)  # in units of the scale: farther, float32 cannot hold x (fair.MAX_CONDITION)
POSITIONS = ("none", "rope", "alibi", "sinusoidal_rotary", "hope", "bam", "pape", "pape_efficient", "pape_ri")
DRAWN_KINDS = (BLOCK, DECODE, GRAD)  # the case kinds drawn (cases/kinds.py), where the adapter has their method
FUZZED_KINDS = (*DRAWN_KINDS, ENCODER)  # and the encoder stack's, drawn on request by a search of their own (encoder_draw.py)
# A draw's focus narrows one dimension to where kernels switch paths (hypothesis's own choices are
# far from uniform: unfocused, 100 draws held 2 RoPE configs and none past 32 positions)
# The widened axes share one focus, drawn as often as each earlier one, so that those keep their
# share of the budget (with nine foci drawn alike, OffsetInput was caught at 5 of seeds 0-7, not 8)
FOCI = ("any", "tiles", "batch", "width", "positions", "offset", "widened")
WIDENED_FOCI = ("long", "grid", "cache")
TILE_SEQS = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130)
LONG_WIDTH = 16  # a long focus's widest d_model: seq 513 fits MAX_ELEMENTS at 16
GRID_HEADS = (8, 9, 15, 16)  # a grid focus's heads and rows: batch * heads from 64 past 128 (to 272),
GRID_BATCHES = (8, 9, 16, 17)  # at small head_dim and seq, where a kernel's grid of (row, head) programs outgrows one wave
GRID_SEQS = (1, 2, 3, 4, 5, 7, 8)
CACHE_SOLVERS = ("rk4", "rk38")  # a cache focus's: 4 stages, so steps 5, 8 and 9 cache 20, 32 and 36 evaluations
# A cache focus's draws and the long sequences have float projections: in that many evaluations
# or tokens BitLinear's activations meet a rounding tie somewhere, so most such draws had no fair
# input (fair.py: 41 of 47 cache-focused ones, 42 of 65 long ones), each costing 4 tries
CACHE_STEPS = (5, 8, 9)
WIDE_HEAD_DIMS = (31, 32, 33, 48, 63, 64, 65, 96, 128)
TABLED = ("rope", "sinusoidal_rotary", "alibi", "hope", "bam")  # encodings a port may tabulate by position
TABLE_REACH = 32  # a positions focus draws sequences longer than this
REDRAWS = 4  # fair-input redraws before a draw is given up (hypothesis then draws another)


@dataclass(frozen=True)
class Draw:
    """One drawn example: what the spec and the backend are run on. rows: the padding kind and
    count of each batch row (None: no padding mask)."""

    kind: Kind  # one of FUZZED_KINDS (or its name)
    config: R.ODEConfig  # an ODEEncoderConfig for the encoder kind
    batch: int
    seq: int
    rows: Optional[tuple]  # ((kind, n), ...) per batch row, or None
    scale: float
    offset: float
    param_seed: int
    input_seed: int
    decoded: int = 0

    def __post_init__(self):
        object.__setattr__(self, "kind", kind_of(self.kind, "Draw.kind", FUZZED_KINDS))

    def fields(self) -> dict:
        """The config as stored (ode_ref.config.stored_fields), with the encoding in effect named
        even where it is the default (what a report shows)."""
        stored = stored_fields(self.config)
        return {k: v for k, v in self.config.to_dict().items()
                if k in stored or (k == "positional_encoding" and getattr(self.config, "ode_use_pe", False))}

    @property
    def steps(self) -> int:
        """The block's steps (an encoder stack's blocks, or its time-dependent stack's steps)."""
        return self.config.encoder_layers if self.kind is ENCODER else self.config.ode_steps

    def size(self) -> tuple:
        """What 'smaller' means between two draws, as hypothesis shrinks: elements, steps, the
        config's fields, padded rows, the input's distribution (offset, then scale away from 1),
        then the seeds."""
        padded = 0 if self.rows is None else 1 + sum(kind != "none" for kind, _ in self.rows)
        return (self.batch * self.seq * self.config.hidden_size, self.steps, self.decoded, len(self.fields()), padded,
                abs(self.offset), abs(np.log10(self.scale)), self.param_seed + self.input_seed)


def row_mask(kind: str, n: int, seq: int, rng) -> np.ndarray:
    """One row's padding mask (True = real) of a kind: n padded on the right or left, random holes,
    all but one token padded, or every token padded."""
    row = np.ones(seq, dtype=bool)
    n = min(n, seq - 1)
    if kind == "right" and n:
        row[seq - n:] = False
    elif kind == "left" and n:
        row[:n] = False
    elif kind == "holes":  # two tokens real at least (one where the row has one)
        row = rng.random(seq) < 0.6
        row[rng.choice(seq, size=min(2, seq), replace=False)] = True
    elif kind == "all_but_one":
        row[:] = False
        row[int(rng.integers(seq))] = True
    elif kind == "full":
        row[:] = False
    return row


def fewest_real(kind: str, n: int, prompt: int) -> int:
    """The fewest real tokens row_mask leaves in a prompt of that length, whatever its rng."""
    return {"none": prompt, "right": prompt - min(n, prompt - 1), "left": prompt - min(n, prompt - 1),
            "holes": min(2, prompt), "all_but_one": 1, "full": 0}[kind]


def padding_mask(draw: Draw, rng) -> Optional[np.ndarray]:
    """The draw's mask (batch, seq), or None; a decode draw's decoded tokens are real."""
    if draw.rows is None:
        return None
    prompt = draw.seq - draw.decoded
    mask = np.ones((draw.batch, draw.seq), dtype=bool)
    for b, (kind, n) in enumerate(draw.rows):
        mask[b, :prompt] = row_mask(kind, n, prompt, rng)
    return mask


def describe_padding(draw: Draw) -> str:
    if draw.rows is None:
        return "none (no padding mask)"
    return ", ".join(f"row {b}: {kind}{f' {n}' if kind in ('right', 'left') else ''}" for b, (kind, n) in enumerate(draw.rows))


def describe_input(draw: Draw) -> str:
    spread = f"{draw.scale:g} * N(0, 1)" if draw.offset == 0 else f"{draw.scale:g} * ({draw.offset:g} + N(0, 1))"
    return f"x = {spread}, seed {draw.input_seed}"


def pick(draw, support: dict, field: str, values, strategy=None):
    """One of values (strategy's draw, sampled_from(values) by default), or, where the backend's
    declared support (adapters/support.py) names the field, one of those it declares, in values'
    order. Where it declares none of them, the unnarrowed draw: the backend then refuses it, counted."""
    kept = [v for v in values if v in support[field]] if field in support else []
    return draw(st.sampled_from(kept) if kept else strategy if strategy is not None else st.sampled_from(values))


def _encodings(support: dict, focus: str, positioned: bool = True) -> list:
    """The encodings to draw from: a positions focus's tabled ones, narrowed to the declared support
    (positional_encoding, and ode_use_pe: "none" is ode_use_pe off); the focus's set falls back to
    every encoding, then to the unnarrowed set, when the support leaves it none. Not positioned
    (one token: no position differs from another): none alone, where the support has it."""
    choices = TABLED if focus == "positions" else POSITIONS
    if not positioned and "none" in support.get("positional_encoding", ("none",)) and False in support.get("ode_use_pe", (False,)):
        return ["none"]
    if "positional_encoding" not in support and "ode_use_pe" not in support:
        return list(choices)
    use_pe, declared = support.get("ode_use_pe", (False, True)), support.get("positional_encoding", POSITIONS)
    fits = [e for e in POSITIONS if e in declared and (e != "none") in use_pe]
    return [e for e in choices if e in fits] or fits or list(choices)


@st.composite
def positions(draw, kind, focus: str, support: Optional[dict] = None, positioned: bool = True,
              options: Optional[str] = None) -> dict:
    """The positional fields: an encoding (none first; a positions focus: one with a table; none
    alone where the draw is not positioned: a single token) and its options, within the declared
    support (pick). options (a covering array's cell): "default", each option at its default, or
    "other", each away from it; None: either."""
    support = support or {}

    def option(field, values, strategy=None):
        if options is not None:
            return pick(draw, support, field, values[1:] if options == "other" else values[:1])
        return pick(draw, support, field, values, strategy)

    encoding = draw(st.sampled_from(_encodings(support, focus, positioned)))
    if encoding == "none":
        return {}
    out = dict(ode_use_pe=True, positional_encoding=encoding)
    if encoding == "rope":
        out.update(rope_base=option("rope_base", [10000.0, 500.0]),
                   rope_scaling=option("rope_scaling", [1.0, 0.37, 4.0]))
    elif encoding == "sinusoidal_rotary":
        out.update(sinusoidal_max_len=option("sinusoidal_max_len", [512, 16, 32, 64]),
                   sinusoidal_scale=option("sinusoidal_scale", [1.0, 0.6]))
    elif encoding == "alibi":
        out.update(alibi_scale=option("alibi_scale", [1.0, 0.5, 3.0]))
    elif encoding == "hope":
        out.update(layer_idx=option("layer_idx", [0, 3]))
    elif encoding == "bam":
        out.update(bam_learn_mu=option("bam_learn_mu", [False, True], st.booleans()),
                   bam_mu_init=option("bam_mu_init", [0.0, 0.5]))
    elif encoding.startswith("pape"):
        out.update(pape_num_parabolas=option("pape_num_parabolas", [4, 2]))
        if encoding == "pape_ri":
            out.update(pape_num_positions=option("pape_num_positions", [1, 2]))
    if pick(draw, support, "use_ssmax", [False, True], st.booleans()):
        out.update(use_ssmax=True)
        if "ssmax_length" not in kind.fixed_fields:  # decoding refuses the seed's padded rule
            out.update(ssmax_length=pick(draw, support, "ssmax_length", ["visible", "padded"]))
    return out


def stages(solver: str) -> int:
    """The most evaluations of f one step of a solver makes: its tableau's stages, a multistep
    solver's starter's (its later steps make one)."""
    return solver_evaluations(solver_method(solver), 1)


def work(kind, batch: int, heads: int, seq: int, evaluations: int = 1) -> int:
    """A draw's attention work, capped by MAX_WORK: batch * heads * seq^2 * evaluations, a
    backward pass's GRAD_WORK times."""
    return batch * heads * seq * seq * evaluations * (GRAD_WORK if kind.backward else 1)


def rounded(batch: int, seq: int, width: int, evaluations: int) -> int:
    """A BitLinear draw's rounded activations, capped by MAX_ROUNDED."""
    return batch * seq * width * evaluations


def least_evaluations(focus: str, support: dict) -> int:
    """The fewest evaluations of f a draw of the focus makes within the declared ode_solver and
    ode_steps: the shape leaves room for them under MAX_WORK (a cache focus's: 20)."""
    solvers = [s for s in CACHE_SOLVERS if s in support.get("ode_solver", CACHE_SOLVERS)] if focus == "cache" else ()
    solvers = solvers or [s for s in support.get("ode_solver", R.SOLVERS) if s in TABLEAUS or s in MULTISTEP] or ["euler"]
    steps = [n for n in support.get("ode_steps", STEPS) if isinstance(n, int) and n >= 1] or [1]
    least = min(n for n in steps if n in CACHE_STEPS) if focus == "cache" and set(steps) & set(CACHE_STEPS) else min(steps)
    return min(stages(s) for s in solvers) * least


def _grid_batch(draw, kind, heads: int, width: int) -> Optional[tuple]:
    """A grid focus's (seq, batch): rows from GRID_BATCHES with batch * heads at 64 or more, at a
    short sequence, within the caps; None where none fits (a narrow declared num_heads)."""
    batches = [b for b in GRID_BATCHES if b * heads >= 64 and b * width * GRID_SEQS[kind.min_decoded] <= MAX_ELEMENTS]
    if not batches:
        return None
    batch = draw(st.sampled_from(batches))
    return draw(st.sampled_from([t for t in GRID_SEQS if t > kind.min_decoded and t * width * batch <= MAX_ELEMENTS])), batch


@st.composite
def shape(draw, kind, focus: str, support: Optional[dict] = None, within: Optional[dict] = None) -> tuple:
    """(heads, head_dim, seq, batch) within MAX_WIDTH, MAX_ELEMENTS and MAX_WORK (at the focus's
    fewest evaluations), narrowed to the focus's boundary and to the declared num_heads, head_dim
    and hidden_size (pick)."""
    support = support or {}
    most_heads = 4 if focus in ("width", "long") else MAX_HEADS
    if focus == "grid":
        heads = draw(st.sampled_from([h for h in GRID_HEADS if h in support.get("num_heads", GRID_HEADS)]
                                     or support.get("num_heads", GRID_HEADS)))
    else:
        heads = pick(draw, support, "num_heads", range(1, most_heads + 1), st.integers(1, most_heads))
    dims = {"width": WIDE_HEAD_DIMS, "grid": HEAD_DIMS[:4]}.get(focus, HEAD_DIMS)
    fits = [d for d in dims if heads * d <= (LONG_WIDTH if focus == "long" else MAX_WIDTH)] or [1]

    def declared(d):
        return d in support.get("head_dim", (d,)) and heads * d in support.get("hidden_size", (heads * d,))

    # the focus's widths the backend declares, else any it declares, else the focus's (refused, counted)
    kept = [d for d in fits if declared(d)] or [d for d in HEAD_DIMS if heads * d <= MAX_WIDTH and declared(d)]
    head_dim = draw(st.sampled_from(kept or fits))
    width = heads * head_dim
    grid = _grid_batch(draw, kind, heads, width) if focus == "grid" else None
    if grid is not None:
        return heads, head_dim, *grid
    least_batch, evaluations = 5 if focus == "batch" else 1, least_evaluations(focus, support)
    seqs = [t for t in SEQS + LONG_SEQS if t > kind.min_decoded and t * width * least_batch <= MAX_ELEMENTS
            and work(kind, least_batch, heads, t, evaluations) <= MAX_WORK] or [kind.min_decoded + 1]
    narrow = {"tiles": TILE_SEQS, "positions": [t for t in TILE_SEQS + LONG_SEQS if t > TABLE_REACH], "long": LONG_SEQS}
    within = within or {}
    seq = draw(st.sampled_from([t for t in within.get("seq", narrow.get(focus, ())) if t in seqs] or seqs))
    most = max(1, min(MAX_BATCH, MAX_ELEMENTS // (seq * width), MAX_WORK // work(kind, 1, heads, seq, evaluations)))
    batches = [b for b in within.get("batch", ()) if b <= most]
    batch = draw(st.sampled_from(batches)) if batches else draw(st.integers(min(least_batch, most), most))
    return heads, head_dim, seq, batch


def _solver_and_steps(draw, kind, focus: str, support: dict, room: int) -> dict:
    """ode_solver and ode_steps with steps x stages within room (the evaluations MAX_WORK leaves):
    a cache focus's 4-stage solvers at 5, 8 or 9 steps where they fit, any other draw's solver at
    up to 4 steps (more would double every draw's cost: the focus draws them often enough); each
    within the declared ode_solver and ode_steps where they leave any."""
    def declared(field, values):
        return [v for v in values if v in support.get(field, values)]

    cache = focus == "cache" and declared("ode_steps", CACHE_STEPS)
    solvers = [s for s in declared("ode_solver", CACHE_SOLVERS) if stages(s) * CACHE_STEPS[0] <= room] if cache else []
    solver = pick(draw, support, "ode_solver", solvers or [s for s in R.SOLVERS if stages(s) <= room] or ["euler"])
    levels = [n for n in STEPS if n <= kind.most_steps and n * stages(solver) <= room] or [1]
    steps = [n for n in declared("ode_steps", levels) if (n in CACHE_STEPS) == bool(cache)]
    return dict(ode_solver=solver, ode_steps=pick(draw, support, "ode_steps", steps or levels))


def positioned_rows(rows: Optional[tuple], prompt: int, decoded: int) -> Optional[tuple]:
    """rows, or, where no row is sure to keep two real tokens (fewest_real, the decoded ones real),
    rows with its last unpadded (its first where it has one: a covering array's cell pins the
    first row's padding): positions matter only between two real tokens."""
    if rows is None or any(fewest_real(kind, n, prompt) + decoded >= 2 for kind, n in rows):
        return rows
    return rows[:-1] + (("none", 1),)


@st.composite
def draws(draw, kinds=DRAWN_KINDS, support: Optional[dict] = None, within: Optional[dict] = None) -> Draw:
    """A Draw, each choice ordered from simple to complex (see the module docstring). The focus
    (FOCI) narrows one dimension to its kernel boundaries, so that each is drawn often by design.
    support: the backend's declared support (adapters/support.py), which every choice keeps within
    where it can (pick). A positional encoding is drawn only at two tokens or more, and with two
    real ones in some row (positioned_rows). within: a covering array's cell (cover.py) instead of
    a focus: the values its sequence, batch, decoded tokens, first row's padding and input take."""
    support, within = support or {}, within or {}
    focus = "any" if within else draw(st.sampled_from(FOCI))
    focus = draw(st.sampled_from(WIDENED_FOCI)) if focus == "widened" else focus
    fitting = [k for k in kinds if all(v in support.get(f, [v]) for f, v in k.fixed_fields.items())] or list(kinds)
    # a cache focus's kinds: those drawn past 4 steps (a block forward, cached decoding)
    kind = draw(st.sampled_from([k for k in fitting if focus == "cache" and k.most_steps >= CACHE_STEPS[0]] or fitting))
    heads, head_dim, seq, batch = draw(shape(kind, focus, support, within))
    width = heads * head_dim
    norms = [n for n in R.NORM_TYPES if width >= 2 or n != "dynamic_tanh"]
    fields = dict(hidden_size=width, num_heads=heads, norm_type=pick(draw, support, "norm_type", norms),
                  **_solver_and_steps(draw, kind, focus, support, MAX_WORK // work(kind, batch, heads, seq)),
                  mode=kind.fixed_fields["mode"] if "mode" in kind.fixed_fields else pick(draw, support, "mode", R.MODES),
                  use_bitnet=False)
    fields["use_bitnet"] = not ((seq > SEQS[-1] or rounded(batch, seq, width, fields["ode_steps"] * stages(fields["ode_solver"])) > MAX_ROUNDED)
                                and False in support.get("use_bitnet", (False,))) and pick(draw, support, "use_bitnet", [False, True],
                                                                                           st.booleans())
    fields.update(draw(positions(kind, focus, support, positioned=seq >= 2, options=within.get("options"))))
    stepped = MAX_STEPPED // (fields["ode_steps"] * stages(fields["ode_solver"]))
    levels = [k for k in DECODED if kind.min_decoded <= k < seq and k <= stepped] or [1]
    decoded = draw(st.sampled_from([k for k in levels if k in within.get("decoded", levels)] or levels)) if kind.min_decoded else 0
    rows = None
    if within.get("padding", ()) != (None,) and (draw(st.booleans()) or within.get("padding")):
        first = within.get("padding", ROW_PADDING)  # a cell's padding kind is its first row's
        rows = tuple((draw(st.sampled_from(first if b == 0 else ROW_PADDING)), draw(st.integers(1, max(1, seq - decoded - 1))))
                     for b in range(batch))
        rows = positioned_rows(rows, seq - decoded, decoded) if fields.get("ode_use_pe") else rows
    offsets = OFFSETS[1:] if focus == "offset" else OFFSETS
    scale, offset = (draw(st.sampled_from(within["input"])) if "input" in within else
                     (draw(st.sampled_from(SCALES)), draw(st.sampled_from(offsets))))
    return Draw(kind, R.ODEConfig(**fields), batch, seq, rows, scale, offset,
                draw(st.integers(0, 2**16)), draw(st.integers(0, 2**16)), decoded)


@st.composite
def fixed_draws(draw, config, batch: Optional[int] = None, seq: Optional[int] = None, takes_mask: bool = True) -> Draw:
    """A block Draw of one config (a model file's): its shape, padding and input only, a static
    batch or seq kept as the file declares it, padding only if it takes a mask."""
    focus = draw(st.sampled_from(("any", "tiles", "batch", "offset")))
    width = config.hidden_size
    if seq is None:  # two tokens at least where positions matter
        seqs = [t for t in SEQS if t * width <= MAX_ELEMENTS and (t >= 2 or not config.ode_use_pe)] or [1]
        seq = draw(st.sampled_from([t for t in TILE_SEQS if t in seqs] if focus == "tiles" and seqs[-1] >= 15 else seqs))
    if batch is None:
        most = max(1, min(MAX_BATCH, MAX_ELEMENTS // (seq * width)))
        batch = draw(st.integers(min(5 if focus == "batch" else 1, most), most))
    rows = None
    if takes_mask and draw(st.booleans()):
        rows = tuple((draw(st.sampled_from(ROW_PADDING)), draw(st.integers(1, max(1, seq - 1)))) for _ in range(batch))
        rows = positioned_rows(rows, seq, 0) if config.ode_use_pe else rows
    offsets = OFFSETS[1:] if focus == "offset" else OFFSETS
    return Draw("block", config, batch, seq, rows, draw(st.sampled_from(SCALES)), draw(st.sampled_from(offsets)), -1,
                draw(st.integers(0, 2**16)))


def inputs(d: Draw, attempt: int = 0):
    """(x float64 (batch, seq, d_model), padding mask or None) of a draw, from input_seed + attempt."""
    rng = np.random.default_rng(d.input_seed + attempt)
    x = d.scale * (d.offset + rng.normal(size=(d.batch, d.seq, d.config.hidden_size)))
    return x, padding_mask(d, rng)


def fair_inputs(d: Draw, params):
    """(x, mask, the attempt used, the spec's float64 and float32 trajectories of it) of the first
    fair draw (fair.check_fair), or None. Weights near a rounding tie fail every input: no redraw."""
    if weight_tie(d.config, params) is not None:
        return None
    for attempt in range(REDRAWS):
        x, mask = inputs(d, attempt)
        reason, traj64, traj32 = fair_forwards(d.config, params, x, mask)
        if reason is None:
            return x, mask, attempt, (traj64, traj32)
    return None


# Draw -> the attempt of its first fair input, or None if it has none: fair_inputs' answer for a draw
# with its own parameters, the same in every dtype, so a run over several dtypes checks a draw once
FAIR_ATTEMPTS: dict = {}


def build(d: Draw, dtype: str, name: str = "fuzz", params: Optional[dict] = None) -> Optional[Case]:
    """The spec's case for a draw (its e32; e16 or ebf16 in that half dtype), or None if no fair input
    was found (hypothesis then rejects the draw). params: fixed ones (a model file's), else drawn;
    a drawn draw's fair input is found once (FAIR_ATTEMPTS), its trajectories then run by case_of."""
    drawn = params is None
    if d.kind is ENCODER:  # judged on its drawn input, as the golden encoder cases are (no fairness check: no rounding ties)
        params = R.init_encoder_params(d.config, d.param_seed, perturb=True) if drawn else params
        x, mask = inputs(d)
        return case_of(d.config, params, x, mask, kind=ENCODER, name=name, dtype=dtype, input_seed=d.input_seed,
                       param_seed=d.param_seed)
    if drawn and d in FAIR_ATTEMPTS and FAIR_ATTEMPTS[d] is None:
        return None
    params = R.init_params(d.config, seed=d.param_seed, perturb_norms=True) if drawn else params
    if drawn and d in FAIR_ATTEMPTS:
        attempt, trajectories = FAIR_ATTEMPTS[d], None
        x, mask = inputs(d, attempt)
    else:
        found = fair_inputs(d, params)
        if drawn:
            FAIR_ATTEMPTS[d] = None if found is None else found[2]
        if found is None:
            return None
        x, mask, attempt, trajectories = found
    return case_of(d.config, params, x, mask, kind=d.kind, decoded=d.decoded, name=name, dtype=dtype,
                   input_seed=d.input_seed + attempt, param_seed=d.param_seed,
                   trajectories=trajectories)


def case_of(cfg, params, x, mask, *, kind, decoded: int = 0, name: str = "fuzz", dtype: str = "float32",
            inputs: Optional[dict] = None, input_seed: int = 0, param_seed: int = 0, trajectories=None) -> Case:
    """The spec's case for given inputs, built by its kind (cases/kinds.py): its float64 quantities
    and float32 errors (the half fields too when dtype is a half one). Replaying a repro folder
    builds its case here. inputs: the kind's inputs beside x (a grad case's z1_bar), else drawn
    from input_seed. trajectories: the spec's float64 and float32 trajectories of (x, mask) where
    the caller has them (the fair check ran them), reused by a block case."""
    kind = kind_of(kind)
    inputs = kind.draw_inputs(input_seed, x.shape) if inputs is None else inputs
    case = kind.case(name, cfg, params, x, mask, decoded=decoded, inputs=inputs, input_seed=input_seed, param_seed=param_seed,
                     trajectories=trajectories)
    if kind.backward:
        case = with_backward_spread(case)
    return with_half(case, (dtype,)) if dtype in HALF_DTYPES else case  # the run's dtype's fields alone


# A backward pass's parameter gradients sum every position's term, and their float32 error on one
# input is one draw of a wide spread: a BAM draw's grad.pos_encoder.theta_alpha erred by 1.9e-7 in
# the spec's float32 run on the drawn x and by 3.8e-6 to 1.4e-5 on seven inputs one float32
# rounding from it (the torch port's 8.1e-6, summed in another order, was 43 times the first:
# a false finding at the default seed). So a grad draw's e32 is the largest of the drawn input's
# and BACKWARD_SAMPLES such neighbours' (fuzzing.md: tolerances); the golden set's stay its own.
BACKWARD_SAMPLES = 3


def with_backward_spread(case: Case) -> Case:
    """case with each quantity's e32 the largest over its input and BACKWARD_SAMPLES inputs one
    float32 rounding away (each entry of x moved up or down by one unit of float32's roundoff,
    signs from the case's input seed), each against the spec's float64 run on that input."""
    kind, rng = case.kind, np.random.default_rng(case.input_seed)
    e32 = dict(case.e32)
    for _ in range(BACKWARD_SAMPLES):
        sign = rng.choice(np.array([-1.0, 1.0], np.float32), size=case.x.shape)
        x = (case.x.astype(np.float32) * (1 + np.float32(2.0**-24) * sign)).astype(np.float64)
        golden = kind.spec(case.config, case.params, x, case.padding_mask, decoded=case.decoded, inputs=case.inputs)
        errors = kind.float32_errors(case.config, case.params, x, case.padding_mask, golden, decoded=case.decoded,
                                     inputs=case.inputs)
        e32 = {q: max(e, errors[q]) for q, e in e32.items()}
    return dataclasses.replace(case, e32=e32)


def reject(case: Optional[Case]) -> Case:
    """case, or hypothesis told to draw another (no fair input for this draw)."""
    assume(case is not None)
    return case

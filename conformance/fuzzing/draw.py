"""The draw space of `odeattn conformance fuzz`: configs, shapes, padding and inputs, as hypothesis
strategies, and the live case the spec computes for a draw.

The space covers where real kernels switch paths, by design: sequence lengths at and around 16,
32, 64 and 128 (up to 130), batch up to 9 with a padding pattern of its own per row, head widths
at multiples of 8, 16, 32 and 64 and odd ones, 1 to 16 heads, positions past any table a port
might precompute (sinusoidal_max_len below the sequence), inputs scaled 1e-4 to 1e4 and offset far
from zero (by up to 100 times their spread), and every config field the spec takes. Each choice is ordered from simple to complex
(euler before rk2_gated, no padding before holes, offset 0 first), so hypothesis shrinks a failure
toward the simplest example that still fails.

A draw's case is the spec's, computed here in float64 with its own float32 error per quantity
(e32, and e16 or ebf16 for a half dtype), from which the tolerances follow by the golden set's rule
(tolerance.py). The input is redrawn (input seed + 1, + 2, ...) until it is a fair test
(fair.check_fair), as the golden set's is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import ode_ref as R
from ode_ref.config import stored_fields

from ode_ref.precision import HALF_DTYPES

from ..cases import Case, with_half
from ..cases.kinds import BLOCK, DECODE, GRAD, Kind, kind_of
from ..cases.fair import fair_forwards, weight_tie

SEQS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130)  # kernel tiles 16..128 and their neighbours
HEAD_DIMS = (4, 1, 2, 3, 5, 6, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 128)  # multiples of 8..64, and odd
MAX_BATCH = 9
MAX_HEADS = 16
MAX_WIDTH = 512  # d_model = heads * head_dim
MAX_ELEMENTS = 130 * 64  # batch * seq * d_model (seq 130 at width 64): one spec run in tens of milliseconds
ROW_PADDING = ("none", "right", "left", "holes", "all_but_one", "full")  # per row, simple to complex
SCALES = (1.0, 1e-2, 1e2, 1e-4, 1e4)
OFFSETS = (0.0, 100.0, -30.0)  # in units of the scale: farther, float32 cannot hold x (fair.MAX_CONDITION)
POSITIONS = ("none", "rope", "alibi", "sinusoidal_rotary", "hope", "bam", "pape", "pape_efficient", "pape_ri")
DRAWN_KINDS = (BLOCK, DECODE, GRAD)  # the case kinds drawn (cases/kinds.py), where the adapter has their method
# A draw's focus narrows one dimension to where kernels switch paths (hypothesis's own choices are
# far from uniform: unfocused, 100 draws held 2 RoPE configs and none past 32 positions)
FOCI = ("any", "tiles", "batch", "width", "positions", "offset")
TILE_SEQS = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130)
WIDE_HEAD_DIMS = (31, 32, 33, 48, 63, 64, 65, 96, 128)
TABLED = ("rope", "sinusoidal_rotary", "alibi", "hope", "bam")  # encodings a port may tabulate by position
TABLE_REACH = 32  # a positions focus draws sequences longer than this
MAX_DECODED = 3
REDRAWS = 4  # fair-input redraws before a draw is given up (hypothesis then draws another)


@dataclass(frozen=True)
class Draw:
    """One drawn example: what the spec and the backend are run on. rows: the padding kind and
    count of each batch row (None: no padding mask)."""

    kind: Kind  # one of DRAWN_KINDS (or its name)
    config: R.ODEConfig
    batch: int
    seq: int
    rows: Optional[tuple]  # ((kind, n), ...) per batch row, or None
    scale: float
    offset: float
    param_seed: int
    input_seed: int
    decoded: int = 0

    def __post_init__(self):
        object.__setattr__(self, "kind", kind_of(self.kind, "Draw.kind", DRAWN_KINDS))

    def fields(self) -> dict:
        """The config as stored (ode_ref.config.stored_fields), with the encoding in effect named
        even where it is the default (what a report shows)."""
        stored = stored_fields(self.config)
        return {k: v for k, v in self.config.to_dict().items()
                if k in stored or (k == "positional_encoding" and self.config.ode_use_pe)}

    def size(self) -> tuple:
        """What 'smaller' means between two draws, as hypothesis shrinks: elements, steps, the
        config's fields, padded rows, the input's distribution (offset, then scale away from 1),
        then the seeds."""
        padded = 0 if self.rows is None else 1 + sum(kind != "none" for kind, _ in self.rows)
        return (self.batch * self.seq * self.config.hidden_size, self.config.ode_steps, len(self.fields()), padded,
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
    elif kind == "holes":
        row = rng.random(seq) < 0.6
        row[int(rng.integers(seq))] = True
    elif kind == "all_but_one":
        row[:] = False
        row[int(rng.integers(seq))] = True
    elif kind == "full":
        row[:] = False
    return row


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


def _encodings(support: dict, focus: str) -> list:
    """The encodings to draw from: a positions focus's tabled ones, narrowed to the declared support
    (positional_encoding, and ode_use_pe: "none" is ode_use_pe off); the focus's set falls back to
    every encoding, then to the unnarrowed set, when the support leaves it none."""
    choices = TABLED if focus == "positions" else POSITIONS
    if "positional_encoding" not in support and "ode_use_pe" not in support:
        return list(choices)
    use_pe, declared = support.get("ode_use_pe", (False, True)), support.get("positional_encoding", POSITIONS)
    fits = [e for e in POSITIONS if e in declared and (e != "none") in use_pe]
    return [e for e in choices if e in fits] or fits or list(choices)


@st.composite
def positions(draw, kind, focus: str, support: Optional[dict] = None) -> dict:
    """The positional fields: an encoding (none first; a positions focus: one with a table) and its
    options, within the declared support (pick)."""
    support = support or {}
    encoding = draw(st.sampled_from(_encodings(support, focus)))
    if encoding == "none":
        return {}
    out = dict(ode_use_pe=True, positional_encoding=encoding)
    if encoding == "rope":
        out.update(rope_base=pick(draw, support, "rope_base", [10000.0, 500.0]),
                   rope_scaling=pick(draw, support, "rope_scaling", [1.0, 0.37, 4.0]))
    elif encoding == "sinusoidal_rotary":
        out.update(sinusoidal_max_len=pick(draw, support, "sinusoidal_max_len", [512, 16, 32, 64]),
                   sinusoidal_scale=pick(draw, support, "sinusoidal_scale", [1.0, 0.6]))
    elif encoding == "alibi":
        out.update(alibi_scale=pick(draw, support, "alibi_scale", [1.0, 0.5, 3.0]))
    elif encoding == "hope":
        out.update(layer_idx=pick(draw, support, "layer_idx", [0, 3]))
    elif encoding == "bam":
        out.update(bam_learn_mu=pick(draw, support, "bam_learn_mu", [False, True], st.booleans()),
                   bam_mu_init=pick(draw, support, "bam_mu_init", [0.0, 0.5]))
    elif encoding.startswith("pape"):
        out.update(pape_num_parabolas=pick(draw, support, "pape_num_parabolas", [4, 2]))
        if encoding == "pape_ri":
            out.update(pape_num_positions=pick(draw, support, "pape_num_positions", [1, 2]))
    if pick(draw, support, "use_ssmax", [False, True], st.booleans()):
        out.update(use_ssmax=True)
        if "ssmax_length" not in kind.fixed_fields:  # decoding refuses the seed's padded rule
            out.update(ssmax_length=pick(draw, support, "ssmax_length", ["visible", "padded"]))
    return out


def _fitting(values, limit, at_least=()):
    """values within limit, or, if the focus's narrower choice (at_least) has none that fit, all that fit."""
    narrow = [v for v in at_least if v <= limit]
    return narrow or [v for v in values if v <= limit]


@st.composite
def shape(draw, kind, focus: str, support: Optional[dict] = None) -> tuple:
    """(heads, head_dim, seq, batch) within MAX_WIDTH and MAX_ELEMENTS, narrowed to the focus's
    boundary and to the declared num_heads, head_dim and hidden_size (pick)."""
    support = support or {}
    most_heads = 4 if focus == "width" else MAX_HEADS
    heads = pick(draw, support, "num_heads", range(1, most_heads + 1), st.integers(1, most_heads))
    dims = WIDE_HEAD_DIMS if focus == "width" else HEAD_DIMS
    fits = [d for d in dims if heads * d <= MAX_WIDTH] or [1]

    def declared(d):
        return d in support.get("head_dim", (d,)) and heads * d in support.get("hidden_size", (heads * d,))

    # the focus's widths the backend declares, else any it declares, else the focus's (refused, counted)
    kept = [d for d in fits if declared(d)] or [d for d in HEAD_DIMS if heads * d <= MAX_WIDTH and declared(d)]
    head_dim = draw(st.sampled_from(kept or fits))
    width = heads * head_dim
    smallest_batch = 5 if focus == "batch" else 1
    seqs = [t for t in SEQS if t * width * smallest_batch <= MAX_ELEMENTS and (t > kind.min_decoded)] or [2]
    narrow = {"tiles": TILE_SEQS, "positions": [t for t in TILE_SEQS if t > TABLE_REACH]}.get(focus, ())
    seq = draw(st.sampled_from([t for t in narrow if t in seqs] or seqs))
    most = max(1, min(MAX_BATCH, MAX_ELEMENTS // (seq * width)))
    batch = draw(st.integers(min(smallest_batch, most), most))
    return heads, head_dim, seq, batch


@st.composite
def draws(draw, kinds=DRAWN_KINDS, support: Optional[dict] = None) -> Draw:
    """A Draw, each choice ordered from simple to complex (see the module docstring). The focus
    (FOCI) narrows one dimension to its kernel boundaries, so that each is drawn often by design.
    support: the backend's declared support (adapters/support.py), which every choice keeps within
    where it can (pick); without one, the draws are those of every earlier version."""
    support = support or {}
    focus = draw(st.sampled_from(FOCI))
    kind = draw(st.sampled_from([k for k in kinds if all(v in support.get(f, [v]) for f, v in k.fixed_fields.items())]
                                or kinds))
    heads, head_dim, seq, batch = draw(shape(kind, focus, support))
    width = heads * head_dim
    norms = [n for n in R.NORM_TYPES if width >= 2 or n != "dynamic_tanh"]
    steps = range(1, kind.most_steps + 1)
    fields = dict(hidden_size=width, num_heads=heads, norm_type=pick(draw, support, "norm_type", norms),
                  ode_solver=pick(draw, support, "ode_solver", R.SOLVERS),
                  ode_steps=pick(draw, support, "ode_steps", steps, st.integers(1, steps[-1])),
                  mode=kind.fixed_fields["mode"] if "mode" in kind.fixed_fields else pick(draw, support, "mode", R.MODES),
                  use_bitnet=pick(draw, support, "use_bitnet", [False, True], st.booleans()))
    fields.update(draw(positions(kind, focus, support)))
    decoded = draw(st.integers(kind.min_decoded, min(MAX_DECODED, seq - 1))) if kind.min_decoded else 0
    rows = None
    if draw(st.booleans()):
        rows = tuple((draw(st.sampled_from(ROW_PADDING)), draw(st.integers(1, max(1, seq - decoded - 1))))
                     for _ in range(batch))
    offsets = OFFSETS[1:] if focus == "offset" else OFFSETS
    return Draw(kind, R.ODEConfig(**fields), batch, seq, rows, draw(st.sampled_from(SCALES)), draw(st.sampled_from(offsets)),
                draw(st.integers(0, 2**16)), draw(st.integers(0, 2**16)), decoded)


@st.composite
def fixed_draws(draw, config, batch: Optional[int] = None, seq: Optional[int] = None, takes_mask: bool = True) -> Draw:
    """A block Draw of one config (a model file's): its shape, padding and input only, a static
    batch or seq kept as the file declares it, padding only if it takes a mask."""
    focus = draw(st.sampled_from(("any", "tiles", "batch", "offset")))
    width = config.hidden_size
    if seq is None:
        seqs = [t for t in SEQS if t * width <= MAX_ELEMENTS] or [1]
        seq = draw(st.sampled_from([t for t in TILE_SEQS if t in seqs] if focus == "tiles" and seqs[-1] >= 15 else seqs))
    if batch is None:
        most = max(1, min(MAX_BATCH, MAX_ELEMENTS // (seq * width)))
        batch = draw(st.integers(min(5 if focus == "batch" else 1, most), most))
    rows = None
    if takes_mask and draw(st.booleans()):
        rows = tuple((draw(st.sampled_from(ROW_PADDING)), draw(st.integers(1, max(1, seq - 1)))) for _ in range(batch))
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
    return with_half(case, (dtype,)) if dtype in HALF_DTYPES else case  # the run's dtype's fields alone


def reject(case: Optional[Case]) -> Case:
    """case, or hypothesis told to draw another (no fair input for this draw)."""
    assume(case is not None)
    return case

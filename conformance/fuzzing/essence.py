"""A finding shrunk to its essence: after hypothesis's shrink, each size of the failing draw is
shrunk to its smallest that still fails (SMALLER), then each config field and each input choice
is reset to its simplest value, one at a time, and each reset that still fails is kept, so that
the finding shows only the fields that matter.

Hypothesis shrinks toward smaller draws, but a choice that costs nothing in size (an irrelevant
norm, solver or encoding option, an input offset, a padding pattern) often survives it. Here each
is tried once more at its simplest: the first level of its choice in draw.py (euler, one step, no
padding, scale 1, offset 0, seed 0), else ODEConfig's default (an encoding's options). A reset that
makes the draw invalid (an ODEConfig refusal, a config the backend refuses, no fair input) is
skipped; one that makes the draw larger (Draw.size) is not tried. Each try is one spec build and
one backend run, and the whole is bounded in time.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import ode_ref as R

from ..cases.fields import ALIASES, defaults
from .draw import HEAD_DIMS, LONG_SEQS, OFFSETS, ROW_PADDING, SCALES, SEQS, Draw

# the encoding's fields: reset together first (the encoding off), then each option alone
POSITIONAL = ("ode_use_pe", "positional_encoding", "rope_base", "rope_scaling", "alibi_scale", "sinusoidal_max_len",
              "sinusoidal_base", "sinusoidal_scale", "hope_base", "hope_damping", "layer_idx", "pape_num_parabolas",
              "pape_num_positions", "bam_learn_mu", "bam_theta_init", "bam_mu_init", "bam_eps", "use_ssmax",
              "ssmax_s_init", "ssmax_length")
SHAPE = ("hidden_size", "num_heads")  # sizes: shrunk first (_smaller), never reset with the fields
# (config class, field) -> the fields reset with it, each of which its simplest value refuses otherwise
# (a family reset to euler leaves no released profile or alpha; no Macaron layer, no profile of its
# halves; no time-dependent weights, the stack's own norm placement and sinusoidal_dim)
DEPENDANTS = {(R.ODEEncoderConfig, "family"): ("profile", "alpha_type", "layer_wise"),
              (R.ODEEncoderConfig, "macaron"): ("macaron_profile",),
              (R.ODEEncoderConfig, "time_embed_dim"): ("encoder_normalize_before", "sinusoidal_dim")}


@dataclass
class Essence:
    """What the resets found: reset (kept: the draw still fails at the simplest value) and needed
    (the draw passes at the simplest value: these fields matter), each a list of labels."""

    reset: list = field(default_factory=list)
    needed: list = field(default_factory=list)
    tries: int = 0
    stopped: str = ""  # why the resets stopped before the last: "time" (seconds spent), or the caller's reason


def simplest_config(config: R.ODEConfig) -> dict:
    """field -> its simplest value: the first level of draw.py's choice (encoder_draw.py's for an
    encoder config: euler), else the config class's default."""
    out = defaults(type(config))
    if isinstance(config, R.ODEEncoderConfig):
        return {**out, "family": "euler"}
    out.update(norm_type=R.NORM_TYPES[0], ode_solver=R.SOLVERS[0], ode_steps=1, mode=R.MODES[0], use_bitnet=False)
    return out


def _config_resets(d: Draw) -> list:
    """(label, changes to the config) for each config field not at its simplest; the encoding's
    fields first as one reset, then each alone. The kind's fixed fields and the sizes are kept."""
    simplest = simplest_config(d.config)
    aliases = ALIASES.get((type(d.config), "family"), ())  # reset with family (an encoder's pair), never alone
    fixed = set(SHAPE) | set(d.kind.fixed_fields) | set(aliases)
    differs = [name for name, value in simplest.items() if name not in fixed and getattr(d.config, name) != value]
    along = {name: (*ALIASES.get((type(d.config), name), ()), *DEPENDANTS.get((type(d.config), name), ())) for name in differs}
    encoding = [name for name in differs if name in POSITIONAL]
    resets = [("positional encoding", {name: simplest[name] for name in encoding})] if len(encoding) > 1 else []
    return resets + [(name, {name: simplest[name], **{a: simplest[a] for a in along[name]}})
                     for name in differs if not (resets and name == "ode_use_pe")]


def _input_resets(d: Draw) -> list:
    """(label, function of the current draw -> changes to it) for each input choice not at its
    simplest: the padding (all rows, then each row), the input's offset and scale, the seeds. A
    row's reset reads the rows as earlier resets left them. The decoded tokens are kept: fewer
    would move a decode finding's token into the prompt (hypothesis shrinks their count)."""
    plain = (ROW_PADDING[0], 1)
    resets = []
    if d.rows is not None:
        resets.append(("padding", lambda d: {"rows": None}))
        resets += [(f"padding row {b}", lambda d, b=b: {} if d.rows is None else {"rows": (*d.rows[:b], plain, *d.rows[b + 1:])})
                   for b, row in enumerate(d.rows) if tuple(row) != plain]
    simplest = {"offset": OFFSETS[0], "scale": SCALES[0], "param_seed": 0, "input_seed": 0}
    resets += [(name, lambda d, name=name, v=v: {name: v}) for name, v in simplest.items() if getattr(d, name) != v]
    return resets


# (label, the current draw -> the smaller draws to try, simplest first (draw.py's order: a head of 4
# channels first), each as (its changes, or its config's)) for each size: a block forward for cached decoding, one row, a shorter sequence,
# one head, a narrower head, one step
SMALLER = (
    ("a block forward", lambda d: [({"kind": "block", "decoded": 0}, {})] if d.decoded else []),
    ("batch", lambda d: [({"batch": 1, "rows": None if d.rows is None else d.rows[:1]}, {})] if d.batch > 1 else []),
    ("seq", lambda d: [({"seq": t}, {}) for t in sorted(SEQS + LONG_SEQS) if d.decoded < t < d.seq]),
    ("heads", lambda d: [({}, {"num_heads": 1, "hidden_size": d.config.head_dim})] if d.config.num_heads > 1 else []),
    ("head_dim", lambda d: [({}, {"hidden_size": w * d.config.num_heads}) for w in HEAD_DIMS if w < d.config.head_dim]),
    ("ode_steps", lambda d: [({}, {"ode_steps": 1})] if d.config.ode_steps > 1 else []),
)


def _reset(d: Draw, changes: dict, config: bool) -> Optional[Draw]:
    """d with the changes made (to its config, or to itself), or None where that is no valid draw."""
    if not changes:
        return None
    try:
        if config:
            return dataclasses.replace(d, config=dataclasses.replace(d.config, **changes))
        return dataclasses.replace(d, **changes)
    except (ValueError, TypeError):
        return None


def _todo(d: Draw, fields: bool) -> list:
    """(label, changes of the current draw, whether they are the config's) of every reset, in order."""
    todo = [(label, lambda d, c=changes: c, True) for label, changes in _config_resets(d)] if fields else []
    return todo + [(label, changes, False) for label, changes in _input_resets(d)
                   if fields or label != "param_seed"]  # a model file's weights are its own


def essential(d: Draw, still_fails: Callable[[Draw], Optional[bool]], *, seconds: float = 60.0,
              fields: bool = True, sizes: bool = False, essence: Optional[Essence] = None) -> Draw:
    """The draw with each reset kept that still fails. still_fails(draw): True where it fails,
    False where it passes, None where it cannot be judged (refused, no fair input); what it raises
    ends the resets and propagates. fields: whether the config's fields and the weights' seed are
    reset (not for a model file's fixed config and weights). sizes: whether the sizes are shrunk
    first (a covering array's cell pinned them; hypothesis shrank a random draw's). Tries stop
    once seconds have passed.
    essence: an Essence filled as the resets go (kept where one raises)."""
    essence, start = essence if essence is not None else Essence(), time.perf_counter()
    # sizes first, each to its smallest that still fails: a covering array's cell pinned them
    for label, smaller in SMALLER if fields and sizes else ():
        for changes, config_changes in smaller(d):
            if time.perf_counter() - start > seconds:
                essence.stopped = "time"
                break
            candidate = _reset(d, config_changes, True) if config_changes else _reset(d, changes, False)
            essence.tries += candidate is not None
            if candidate is not None and still_fails(candidate):
                d = candidate
                essence.reset.append(label)
                break
    for label, changes, config in _todo(d, fields):
        if time.perf_counter() - start > seconds:
            essence.stopped = "time"
            break
        candidate = _reset(d, changes(d), config)
        if candidate is None or candidate == d or candidate.size() > d.size():
            continue  # no valid draw, no change, or a larger one than hypothesis kept
        essence.tries += 1
        verdict = still_fails(candidate)
        if verdict:
            d = candidate
            essence.reset.append(label)
        elif verdict is False:
            essence.needed.append(label)
    return d

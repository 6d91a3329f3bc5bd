"""Where a divergent quantity is off: which batch rows, token positions and heads.

An element is off when its error, relative to the quantity's largest magnitude (the measure of
tolerance.relative_error), exceeds the quantity's tolerance. The sets of rows, positions and heads
holding such elements are described in words a port author can act on: "every token",
"only query positions ≥ 16", "only batch rows ≥ 4", "only heads 0..1".

A state or an output of f is (batch, seq, d_model): its heads are mixed by the output projection,
so only the stage values (q, k, v and the attention output, (batch, seq, heads, head_dim)) say
which heads are off.

A decode or grad case is also named at what it first diverges at (first_at): the decoded token,
its position and cache slot, or the gradient, the input's or a parameter's.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from ode_ref.cache import evaluations as cached_evaluations
from ode_ref.tableaus import TABLEAUS

SHOWN = 8  # indices listed before "..."


def describe(indices, n: int, noun: str, plural: str = "") -> str:
    """A set of indices out of range(n) in words: every, only ≥ k, only ≤ k, a range, a list."""
    idx = sorted(int(i) for i in indices)
    plural = plural or f"{noun}s"
    if not idx:
        return f"no {noun}"
    if len(idx) == n:
        return f"every {noun}" if n > 1 else f"the one {noun}"
    contiguous = idx == list(range(idx[0], idx[-1] + 1))
    if len(idx) == 1:
        return f"only {noun} {idx[0]} (of {n})"
    if contiguous and idx[-1] == n - 1:
        return f"only {plural} ≥ {idx[0]} (of {n})"
    if contiguous and idx[0] == 0:
        return f"only {plural} ≤ {idx[-1]} (of {n})"
    if contiguous:
        return f"only {plural} {idx[0]}..{idx[-1]} (of {n})"
    shown = ", ".join(map(str, idx[:SHOWN])) + (", ..." if len(idx) > SHOWN else "")
    return f"only {plural} {shown} ({len(idx)} of {n})"


def first_position(quantity: str, prompt: int) -> int:
    """The token position of a quantity's first slot: a decoded token's is after the prompt."""
    m = re.fullmatch(r"decode_(\d+)", quantity)
    return prompt + int(m.group(1)) - 1 if m else 0


def off_elements(got, want, tol: float) -> np.ndarray:
    """bool, want's shape: where |got - want| / max|want| exceeds tol."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 0.0
    err = np.abs(got - want) / (scale if scale > 0 else 1.0)
    return ~(err <= tol)  # a NaN is off


def localise(quantity: str, got, want, tol: float, *, prompt: int = 0, heads: Optional[int] = None) -> dict:
    """{"rows", "positions", "heads", "summary"} in words for a quantity of shape (batch, seq, ...);
    heads: the head count when the array is (batch, seq, heads, head_dim) (a stage's). A quantity
    of another shape (a parameter's gradient) is described by its elements alone."""
    bad = off_elements(got, want, tol)
    want = np.asarray(want)
    if want.ndim < 3 or quantity.startswith("grad."):
        count = int(bad.sum())
        text = f"{count} of {bad.size} elements of {quantity}"
        return {"rows": "", "positions": "", "heads": "", "summary": text}
    axes = tuple(range(2, bad.ndim))
    rows = np.flatnonzero(bad.any(axis=(1, *axes)))
    start = first_position(quantity, prompt)
    slots = np.flatnonzero(bad.any(axis=(0, *axes)))
    if quantity.startswith("decode_"):  # one decoded token: its position
        positions = f"only the token at position {start}"
    else:
        positions = describe(slots + start, want.shape[1], "query position", "query positions")
        positions = "every token" if len(slots) == want.shape[1] else positions
    rows_text = describe(rows, want.shape[0], "batch row", "batch rows")
    heads_text = ""
    if heads is not None and want.ndim == 4:
        heads_text = describe(np.flatnonzero(bad.any(axis=(0, 1, 3))), want.shape[2], "head", "heads")
    parts = [positions, rows_text] + ([heads_text] if heads_text else [])
    return {"rows": rows_text, "positions": positions, "heads": heads_text, "summary": "; ".join(parts)}



def _agreeing(agree: list) -> str:
    """'; prefill and decode_1 agree' for the quantities before the divergent one that agree, or ''."""
    if not agree:
        return ""
    names = agree[0] if len(agree) == 1 else ", ".join(agree[:-1]) + f" and {agree[-1]}"
    return f"; {names} {'agrees' if len(agree) == 1 else 'agree'}"


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def decoded_token(case, quantity: str, agree: list) -> dict:
    """Where a decode case first diverges: the prefill, or decode_j's token, its position and the
    cache slot its K and V take in the cache of each of the block's evaluations of f (ode_ref.cache:
    one per evaluation, steps x stages). A backend's answer holds each token's z(1) alone, so which
    of those evaluations diverges first cannot be told from it: the finding names them all."""
    cfg, prompt = case.config, case.prompt
    evaluations = cached_evaluations(cfg)
    if cfg.ode_solver in TABLEAUS:
        how = f"{_counted(cfg.ode_steps, 'step')} x {_counted(TABLEAUS[cfg.ode_solver].num_stages, 'stage')} of {cfg.ode_solver}"
    else:
        how = f"{_counted(cfg.ode_steps, 'step')} of {cfg.ode_solver}, its start's stages included"
    cached = f"{_counted(evaluations, 'cached evaluation')} ({how})"
    out = {"quantity": quantity, "token": 0, "tokens": case.decoded, "position": None, "slot": None,
           "evaluations": evaluations, "agree": agree}
    if quantity == "prefill":
        return {**out, "summary": f"the prefill, before any token is decoded: the prompt's {prompt} tokens, "
                                  f"cache slots 0..{prompt - 1} of each of {cached}"}
    j = int(quantity[len("decode_"):])
    slot = prompt + j - 1
    return {**out, "token": j, "position": slot, "slot": slot,
            "summary": f"decoded token {j} of {case.decoded}, at position {slot}: cache slot {slot} of each of {cached}, "
                       f"its query attending slots 0..{slot}{_agreeing(agree)}"}


def gradient(quantity: str, agree: list) -> dict:
    """Which gradient of a grad case diverges first: x_bar (the input's) or grad.<name> (a parameter's)."""
    of = f"the parameter {quantity[len('grad.'):]}" if quantity.startswith("grad.") else "the input x"
    return {"quantity": quantity, "gradient": quantity, "of": of, "agree": agree,
            "summary": f"{quantity}, the gradient of {of}{_agreeing(agree)}"}


def first_at(case, quantity: str, agree: list) -> dict:
    """What a decode or grad case first diverges at, from its first divergent quantity's name
    (decoded_token, gradient); {} for a block case's (its stage says more: stages.py). agree: the
    quantities judged that agree; those before quantity, in the case's order, are named."""
    names = list(case.quantities())
    earlier = [q for q in names[:names.index(quantity)] if q in agree] if quantity in names else []
    if quantity == "prefill" or quantity.startswith("decode_"):
        return decoded_token(case, quantity, earlier)
    if quantity == "x_bar" or quantity.startswith("grad."):
        return gradient(quantity, earlier)
    return {}

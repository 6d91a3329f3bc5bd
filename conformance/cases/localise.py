"""Where a divergent quantity is off: which batch rows, token positions and heads.

An element is off when its error, relative to the quantity's largest magnitude (the measure of
tolerance.relative_error), exceeds the quantity's tolerance. The sets of rows, positions and heads
holding such elements are described in words a port author can act on: "every token",
"only query positions ≥ 16", "only batch rows ≥ 4", "only heads 0..1".

A state or an output of f is (batch, seq, d_model): its heads are mixed by the output projection,
so only the stage values (q, k, v and the attention output, (batch, seq, heads, head_dim)) say
which heads are off.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

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

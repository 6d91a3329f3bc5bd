"""Memory estimates: a call whose arrays cannot fit is refused from its shapes, before it allocates.

    Need            one kind of array a call allocates: how many are alive at once, their shape, dtype
    check_memory    MemoryLimitError with the estimate when the needs exceed the limit
    memory_limit    (bytes, where the limit comes from): ODEATTN_MEMORY_LIMIT, else physical memory
    scores_needs    the spec's attention (SelfAttention.attn and prepare) for one sequence
    cache_need      the KV cache of prefill(max_len), in every port

Each port states what it allocates (the spec: scores_needs; JAX: its tiles, backends/jax/block.py;
torch: the cache, and the scores only where it writes them out, backends/torch/block.py) and runs
check_memory on it, so the message is written once, here. An estimate counts what the call itself
allocates, not what is in use already (the parameters, a cache passed in, other arrays), and is
compared with the limit, not with the memory free now: it refuses what cannot fit, and a call that
passes may still fail when the machine is busy. docs/specification.md ("Memory estimates") has the
decision.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple

from .cache import evaluations
from .config import BIAS_ENCODINGS, PAPE_ENCODINGS, ODEConfig

LIMIT_VARIABLE = "ODEATTN_MEMORY_LIMIT"  # bytes, an integer; overrides the machine's physical memory

# SelfAttention.attn holds four (batch, heads, seq_q, seq_k) arrays at its peak: the scores, the
# filled scores, exp(s - max) and the weights (tests/ode_ref/test_memory.py measures the spec's
# peak with tracemalloc and holds this estimate to it)
SPEC_SCORE_ARRAYS = 4


class MemoryLimitError(MemoryError, ValueError):
    """A call refused before it allocates: its estimated memory exceeds the limit. A MemoryError,
    and a ValueError like every refused input (the CLI prints it as one line)."""


class Need(NamedTuple):
    """count arrays of shape and dtype alive at once: the arrays of one kind a call allocates."""

    what: str  # "the attention scores"
    count: int
    shape: tuple  # named in the message as given: (batch, heads, seq_q, seq_k)
    dtype: str  # "float32"
    itemsize: int  # bytes per value

    @property
    def nbytes(self) -> int:
        return self.count * math.prod(self.shape) * self.itemsize

    def __str__(self) -> str:
        count = "" if self.count == 1 else f"{self.count} x "
        return f"{self.what}, {count}({', '.join(map(str, self.shape))}) {self.dtype}: {size(self.nbytes)}"


def size(nbytes: float) -> str:
    """'64.0 GiB': bytes in the largest binary unit that keeps the number >= 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(nbytes) < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


_UNKNOWN_WARNED = False


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (os.sysconf), or None where the platform has no
    SC_PHYS_PAGES (Windows)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def memory_limit() -> tuple[int | None, str]:
    """(the limit in bytes, where it comes from): ODEATTN_MEMORY_LIMIT when set (read at every
    call, so a process sets or clears it at any time), else the machine's physical memory.
    (None, why) where neither is known: nothing is refused, and a warning says so once."""
    text = os.environ.get(LIMIT_VARIABLE)
    if text is not None:
        try:
            limit = int(text.strip())
        except ValueError:
            limit = 0
        if limit < 1:
            raise ValueError(f"{LIMIT_VARIABLE}: expected a number of bytes, an integer >= 1 (8589934592 for "
                             f"8 GiB); got {text!r}")
        return limit, f"{LIMIT_VARIABLE}={limit}"
    physical = physical_memory()
    if physical is None:
        global _UNKNOWN_WARNED
        if not _UNKNOWN_WARNED:
            _UNKNOWN_WARNED = True
            warnings.warn(f"odeattn: this platform does not report its physical memory, so no call is refused "
                          f"for its size; set {LIMIT_VARIABLE} (bytes) to have them checked", stacklevel=3)
        return None, "unknown"
    return physical, f"the machine's physical memory; set {LIMIT_VARIABLE} (bytes) to change it"


def check_memory(call: str, *needs: Need) -> int:
    """The estimate in bytes (the sum of the needs), unless it exceeds memory_limit():
    MemoryLimitError naming the call, each need of 1% of the total or more with its shape, the
    total and the limit."""
    total = sum(n.nbytes for n in needs)
    limit, source = memory_limit()
    if limit is not None and total > limit:
        shown = [str(n) for n in needs if n.nbytes * 100 >= total]  # a need under 1% of the total: not listed
        if len(shown) < len(needs):
            shown.append("smaller arrays")
        raise MemoryLimitError(f"{call}: needs an estimated {size(total)} ({'; '.join(shown)}), more than "
                               f"the memory limit of {size(limit)} ({source})")
    return total


def subject(call: str, shape, max_len: int | None = None) -> str:
    """How a refusal names the call and the input it sized: 'prefill: x of shape (1, 5, 64), max_len 10'."""
    return f"{call}: x of shape {tuple(shape)}" + ("" if max_len is None else f", max_len {max_len}")


def scores_needs(cfg: ODEConfig, batch: int, seq_q: int, seq_k: int, dtype: str, itemsize: int, padded: bool, *,
                 score_arrays: int = SPEC_SCORE_ARRAYS, tile_heads: int | None = None,
                 bias_arrays: int = 1) -> list[Need]:
    """What an attention that materialises its scores allocates for one evaluation, and prepare
    once: score_arrays (batch, heads, seq_q, seq_k) arrays (heads: tile_heads when the scores are
    computed a tile of heads at a time), bias_arrays ALiBi biases (batch | 1, heads, seq_q, seq_k)
    and the bool mask (batch | 1, 1, seq_q, seq_k); batch where a padding mask is given (padded),
    else 1. The spec's defaults: SPEC_SCORE_ARRAYS, every head at once, one bias."""
    rows, heads = batch if padded else 1, cfg.num_heads
    scores = "the attention scores" if tile_heads is None else \
        f"the attention scores of a tile of {tile_heads} head{'s' if tile_heads > 1 else ''}"
    needs = [Need(scores, score_arrays, (batch, tile_heads or heads, seq_q, seq_k), dtype, itemsize),
             Need("the mask", 1, (rows, 1, seq_q, seq_k), "bool", 1)]
    if cfg.position_encoding in BIAS_ENCODINGS + PAPE_ENCODINGS:
        needs.insert(1, Need("the score bias", bias_arrays, (rows, heads, seq_q, seq_k), dtype, itemsize))
    return needs


def cache_need(cfg: ODEConfig, batch: int, max_len: int, dtype: str, itemsize: int) -> Need:
    """The KV cache of prefill(max_len): K and V of every evaluation, each (batch, max_len, d_model)
    values (ode_ref/cache.py: cache_values). Its padding mask (batch, max_len) is not counted."""
    return Need("the KV cache (K and V of every evaluation)", 2 * evaluations(cfg), (batch, max_len, cfg.hidden_size),
                dtype, itemsize)

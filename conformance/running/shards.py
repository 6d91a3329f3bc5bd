"""Split the golden cases over a CI's jobs: `--shard I/N` runs the I-th of N parts whose measured
times are near equal, and every part is computed the same way in every job, so the N parts
together hold each case exactly once.

A case's weight is its measured seconds (case_seconds.json beside this file: the main run's
per-case time summed over the default backends and dtypes, written by
benchmarks/case_seconds.py from a --json report); a case the table lacks (a new one) weighs the
table's median. The parts are filled greedily, heaviest case first, each to the lightest part so
far (ties by name, then by part number): the classic longest-processing-time rule, within 4/3 of
the best split.
"""

from __future__ import annotations

import heapq
import json
import re
from functools import lru_cache
from pathlib import Path

SECONDS_FILE = Path(__file__).with_name("case_seconds.json")


def parse_shard(text: str, option: str = "--shard") -> tuple[int, int]:
    """(I, N) from 'I/N', 1 <= I <= N; ValueError naming option otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"{option}: expected I/N with 1 <= I <= N (the I-th of N parts, e.g. 1/2); got {text!r}")
    return int(m.group(1)), int(m.group(2))


@lru_cache(maxsize=None)
def measured_seconds() -> dict:
    """case name -> its measured seconds (case_seconds.json's "seconds")."""
    return json.loads(SECONDS_FILE.read_text())["seconds"]


def weights(cases) -> dict:
    """case name -> its weight: the measured seconds, or the median of the table for a case it lacks."""
    table = measured_seconds()
    known = sorted(table.values())
    median = known[len(known) // 2] if known else 1.0
    return {c.name: float(table.get(c.name, median)) for c in cases}


def parts(cases, count: int) -> list[list]:
    """The cases split into `count` parts of near-equal weight, each in the cases' own order;
    ValueError for more parts than cases (a part would judge nothing)."""
    if count > len(cases):
        raise ValueError(f"--shard: expected at most as many parts as the {len(cases)} selected cases; got {count} parts")
    weight = weights(cases)
    loads = [(0.0, k) for k in range(count)]  # a heap: the lightest part first
    owner = {}
    for c in sorted(cases, key=lambda c: (-weight[c.name], c.name)):
        load, k = heapq.heappop(loads)
        owner[c.name] = k
        heapq.heappush(loads, (load + weight[c.name], k))
    return [[c for c in cases if owner[c.name] == k] for k in range(count)]


def shard(cases, index: int, count: int) -> list:
    """The index-th (1-based) of `count` parts of cases."""
    return parts(cases, count)[index - 1]


def describe(cases, chosen, index: int, count: int) -> str:
    """One line: which part, how many cases and what share of the measured time it holds."""
    weight = weights(cases)
    total = sum(weight.values()) or 1.0
    mine = sum(weight[c.name] for c in chosen)
    return (f"shard {index}/{count}: {len(chosen)} of {len(cases)} cases, {100 * mine / total:.0f}% of their "
            f"measured time ({mine:.1f} of {total:.1f} s)")

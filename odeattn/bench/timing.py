"""The timing harness: timed calls, bursts, interleaved rounds and ratios paired per round.

A shared machine's speed drifts minute to minute, so only ratios of times taken close together
are stable: everything compared is timed in the same rounds, side by side, and compared round by
round (docs/performance-method.md).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

BURST_S = 0.25  # seconds of timed calls per path per round
WAKE_LIMIT_S = 0.5  # no wake call before a burst of calls longer than this
# Idle time before each turn: the previous turn's runtime keeps its threads spinning for a while
# after its last call (OpenMP's and ONNX Runtime's pools, NumPy's BLAS), and they would take the
# cores from whatever runs next.
SETTLE_S = 0.2
MAX_BURST = 30  # timed calls per burst at most


def measure(fn, *, warmup: int, repeats: int) -> list[float]:
    """The seconds of each of `repeats` calls of fn, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def first_and_warm(fn, warmup: int) -> tuple[object, float, float]:
    """(first output, first call s, last call s): the first call, then `warmup` more."""
    start = time.perf_counter()
    out = fn()
    first = last = time.perf_counter() - start
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        last = time.perf_counter() - start
    return out, first, last


@dataclasses.dataclass
class Timed:
    """One thing timed in the rounds: a path, or a matmul of the peak."""

    name: str
    fn: Callable
    flop: float
    call_s: float  # one call's time before the rounds: sizes the burst
    rounds: list = dataclasses.field(default_factory=list)  # per round: the burst's times (s)

    def burst(self, burst_s: float) -> int:
        return max(1, min(MAX_BURST, round(burst_s / max(self.call_s, 1e-9))))


def interleave(entries: list[Timed], repeats: int, burst_s: float) -> None:
    """`repeats` rounds; in each, every entry in turn (the start rotating by one per round): a
    wake call (for calls under WAKE_LIMIT_S), then a burst of timed calls, appended to its rounds.
    Each burst is sized from the entry's previous burst median, so bursts keep their length as
    the machine's speed moves."""
    for r in range(repeats):
        k = r % len(entries)
        for e in entries[k:] + entries[:k]:
            time.sleep(SETTLE_S)
            if e.call_s < WAKE_LIMIT_S:
                e.fn()
            e.rounds.append(measure(e.fn, warmup=0, repeats=e.burst(burst_s)))
            e.call_s = statistics.median(e.rounds[-1])


def interleaved_times(fns: dict, *, repeats: int, burst) -> dict:
    """{key: [seconds, ...]}: for each repeat, each fn in turn is called once (to wake its
    threads), then timed `burst` times (an int, or {key: int})."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            fn()
            times[key] += measure(fn, warmup=0, repeats=burst[key] if isinstance(burst, dict) else burst)
    return times


def round_medians(e: Timed) -> list[float]:
    """The median of each round's burst: the entry's time in that round."""
    return [statistics.median(t) for t in e.rounds]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired_ratio(rows, shape: str, slow: str, fast: str) -> dict | None:
    """slow's time / fast's time per round (both timed in that round), its median, min and max."""
    got = {r["path"]: r for r in rows if r["shape"] == shape and "round_s" in r}
    if slow not in got or fast not in got:
        return None
    return spread([s / f for s, f in zip(got[slow]["round_s"], got[fast]["round_s"])])

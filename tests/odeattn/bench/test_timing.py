"""The timing harness: interleaved rounds with a settle, a wake call and a burst (odeattn.bench.timing)."""

import statistics

from odeattn.bench import timing as T


def test_interleave_is_round_robin_with_a_wake_call_and_a_burst(monkeypatch):
    calls, idle = [], []
    monkeypatch.setattr(T.time, "sleep", lambda s: idle.append((s, len(calls))))
    entries = [T.Timed(name, lambda name=name: calls.append(name), 1.0, call_s)
               for name, call_s in (("a", 0.01), ("b", 0.1), ("slow", 1.0))]
    T.interleave(entries, repeats=3, burst_s=0.05)
    turns = [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert turns == ["a", "b", "slow", "b", "slow", "a", "slow", "a", "b"]  # every entry once a round, the start rotating
    starts = [i for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert idle == [(T.SETTLE_S, i) for i in starts]  # idle before every turn, the previous runtime's threads settling
    # round 0, sized from call_s: a: wake + 5 timed (0.05 / 0.01); b: wake + 1 (at least one); slow: no wake (over 0.5 s) + 1
    assert calls[:9] == ["a"] * 6 + ["b"] * 2 + ["slow"]
    assert [len(e.rounds[0]) for e in entries] == [5, 1, 1]
    for e in entries:  # later rounds: sized from the previous burst's median (these calls take microseconds)
        assert [len(t) for t in e.rounds[1:]] == [T.MAX_BURST] * 2 and e.call_s == statistics.median(e.rounds[-1])
    assert len(calls) == 6 + 2 + 1 + 2 * 3 * (1 + T.MAX_BURST)  # later rounds: every entry woken, then a full burst


def test_interleaved_times_wake_each_in_turn_then_time_its_own_burst():
    calls = []
    fns = {"cached": lambda: calls.append("cached"), "recompute": lambda: calls.append("recompute")}
    times = T.interleaved_times(fns, repeats=2, burst={"cached": 3, "recompute": 1})
    assert calls == (["cached"] * 4 + ["recompute"] * 2) * 2  # per repeat: a wake call, then the burst
    assert [len(times[k]) for k in fns] == [6, 2]
    assert len(T.interleaved_times(fns, repeats=1, burst=2)["recompute"]) == 2  # one burst for every fn

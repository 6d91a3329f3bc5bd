"""The JAX first-call line (odeattn.bench.compile): its probe, its paired ratios and its targets."""

import pytest

from odeattn.bench import compile as C


def test_targets_are_judged_from_ratios_paired_per_round():
    rounds = {"euler x 4": [1.0, 0.5, 0.8], "rk4 x 4": [1.1, 0.4, 0.9], "rk38 x 4": [1.3, 0.7, 0.9],
              "rk4 x 1": [1.0, 1.0, 1.0], "rk4 x 16": [1.2, 1.1, 1.3]}
    result = {"rows": [{"config": k, "round_first_minus_warm_s": v, "first_minus_warm_s": sorted(v)[1]}
                       for k, v in rounds.items()],
              "ratios": {f"{s} / {f}": C._paired(rounds, s, f) for s, f in C.RATIOS}}
    assert result["ratios"]["rk4 x 4 / euler x 4"] == pytest.approx({"median": 1.1, "min": 0.8, "max": 1.125})
    first, stages, steps = C.compile_targets(result)
    assert first["met"] is False and first["value"] == "0.90 s (0.40..1.10)"  # rk4 x 4's median over rounds
    assert stages["met"] is False and stages["value"].startswith("1.10x") and "1.30x (min 1.12, max 1.40)" in stages["value"]
    assert steps["met"] is True and steps["value"].startswith("1.20x")
    assert [t["met"] for t in C.compile_targets(None)] == [None, None, None]


def test_a_probe_times_the_first_call_in_a_fresh_process():
    pytest.importorskip("jax")
    got = C.run_compile_probe("euler", 1, shape=(1, 4, 8, 2), calls=1)
    assert set(got) == {"first_s", "warm_s", "first_minus_warm_s", "first_minus_warm_cpu_s"}, got
    assert got["first_s"] > got["warm_s"] > 0 and got["first_minus_warm_s"] == got["first_s"] - got["warm_s"]

"""The mutation battery: every one-line bug is caught by the golden set in float32 and float64,
through the real runner, and the manual's kill table (docs/conformance.md) is the one this run prints."""

from pathlib import Path

import pytest

from odeattn.conformance.golden import load_cases
from odeattn.conformance.mutants import MUTANTS, format_table, kill_table

CONFORMANCE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


@pytest.fixture(scope="module")
def rows():
    return kill_table(load_cases())


def test_the_battery_covers_every_stage_norm_bitlinear_and_the_solver():
    targets = {m.target for m in MUTANTS}
    assert len(MUTANTS) >= 20 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert targets >= {"attn", "build_mask", "project", "postprocess_attn", "merge_heads", "layer_norm", "rms_norm",
                       "prms_norm", "flash_norm", "dynamic_tanh", "derf", "BitLinear", "tableau", "step times", "trajectory"}


def test_every_mutant_is_killed_in_both_precisions(rows):
    survivors = [(r["mutant"], r["killed_float32"], r["killed_float64"], r["errors"]) for r in rows
                 if not (r["killed_float32"] and r["killed_float64"]) or r["errors"]]
    assert not survivors


def test_where_a_mutant_is_caught_first(rows):
    """A bug in f shows at f0 (one evaluation); a bug in the solver (the gate too) only from the
    first step on; a trajectory out of order at its first state, z(0); a bug in the cache only at
    the first decoded token; a bug in the encoder at its one quantity, z."""
    first = {r["mutant"]: r["first_divergence"] for r in rows}
    where = {"tableau": "step_1", "gated RK2": "step_1", "step times": "step_1", "trajectory": "step_0", "cache": "decode_1",
             "encoder block": "z", "encoder layer": "z"}
    for m in MUTANTS:
        assert first[m.name] == where.get(m.target, "f0"), m.name


def test_the_conformance_page_prints_this_kill_table(rows):
    assert format_table(rows) in CONFORMANCE_PAGE.read_text()

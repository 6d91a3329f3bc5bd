"""The fuzzer's covering array (conformance/fuzzing/cover.py): every feasible pair of levels of two
factors in some row, every infeasible pair named with its reason and in none, and the default
budget large enough to run the whole array."""

import pytest

from odeattn.conformance.fuzzing import cover
from odeattn.conformance.fuzzing.fuzz import DEFAULT_EXAMPLES


@pytest.mark.parametrize("seed", [0, 1])
def test_the_array_holds_every_feasible_pair_and_no_infeasible_one(seed):
    rows = cover.covering_array(seed)
    feasible, infeasible = cover.feasible_pairs()
    held = set().union(*map(cover.pairs_of, rows))
    assert feasible <= held and not held & set(infeasible)
    assert cover.coverage(rows) == (len(feasible), len(feasible))
    assert all(cover.complete(row) == row for row in rows)  # each row a region some draw lies in
    assert len(rows) <= DEFAULT_EXAMPLES  # the default budget runs the whole array first


def test_each_infeasible_pair_says_why_and_two_seeds_fill_the_free_cells_otherwise():
    _, infeasible = cover.feasible_pairs()
    assert infeasible and all(len(why) > 15 for why in infeasible.values())
    assert infeasible[(("kind", "grad"), ("steps", "5-9"))] == "a grad draw takes at most 2 steps"
    assert infeasible[(("mode", "encoder"), ("decoded", "1-3"))].startswith("no kind fits both")
    assert cover.covering_array(0) != cover.covering_array(1)


def test_a_covered_run_searches_every_cell_and_reports_the_pairs_its_examples_hold(capsys):
    """--cover: one search a cell, then draws at random; the report line gives the pairs held."""
    from odeattn.cli import main
    from odeattn.conformance.adapters import SpecAdapter
    from odeattn.conformance.fuzzing.fuzz import fuzz
    from odeattn.conformance.fuzzing.fuzz_report import format_run

    run = fuzz(SpecAdapter(), "float64", seed=0, cover=True)
    feasible, _ = cover.feasible_pairs()
    assert run.cells == len(cover.covering_array(0)) and not run.diverged  # the spec's own kinds: every cell
    assert len(run.held & feasible) > 0.8 * len(feasible)  # the cells a fair input was found for
    assert f"hold {len(run.held & feasible)} of the {len(feasible)} feasible pairs" in format_run(run)
    assert main(["conformance", "fuzz", "--model", "m.onnx", "--config", "c.json", "--weights", "w.npz", "--cover"]) == 2
    assert capsys.readouterr().err == ("odeattn conformance fuzz: --cover: not taken with --model (the file's config is "
                                       "fixed; the array's cells vary configs)\n")

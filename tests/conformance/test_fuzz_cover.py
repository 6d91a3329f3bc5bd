"""The fuzzer's covering array (conformance/fuzzing/cover.py): every feasible pair of levels of two
factors in some row, every infeasible pair named with its reason and in none, and the default
budget large enough to run the whole array."""

import pytest

from odeattn.conformance.fuzzing import cover
from odeattn.conformance.fuzzing.fuzz import DEFAULT_EXAMPLES, fuzz
from odeattn.conformance.mutation import planted

SEEDS = range(20)
# one test process for the file: the covering arrays of seeds 0-19 (a third of a second each) built
# once (cover.covering_array's cache), not once in each process
pytestmark = pytest.mark.xdist_group("conformance/test_fuzz_cover")


def _array(port, seed: int) -> tuple:
    """The covering array a default run of port searches at seed (of the levels its support allows: cover.allowed)."""
    from odeattn.conformance.adapters.support import support_of

    return cover.covering_array(seed, cover.allowed(support_of(port)))


def _trigger_rows(rows, pair) -> list:
    """The indices of rows holding pair (its factors in the table's order, as pairs_of)."""
    pair = tuple(sorted(pair, key=lambda level: list(cover.FACTORS).index(level[0])))
    return [i for i, row in enumerate(rows) if pair in cover.pairs_of(row)]


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


@pytest.mark.parametrize("port", list(planted.TRIGGERS), ids=lambda p: p.__name__)
def test_each_planted_bug_is_caught_by_a_row_holding_its_trigger_pair_at_every_seed(port):
    """By construction: at each seed 0-19 some row of the array holds the bug's trigger pair (it
    is feasible), and the example a default run draws in one of those rows (cells: a row searched
    alone, as the whole array's run searches it) diverges; the same rows through the same adapter
    with no bug planted pass. A default run searches every row until its first finding, so it
    catches the bug at each of these seeds."""
    caught = {}
    for seed in SEEDS:
        array = _array(port(), seed)
        rows = _trigger_rows(array, planted.TRIGGERS[port])
        assert rows, f"no row holds {planted.TRIGGERS[port]} at seed {seed}"
        assert len(array) <= DEFAULT_EXAMPLES  # the default budget reaches every row
        caught[seed] = next((i for i in rows if fuzz(port(), "float32", seed=seed, cells=(i,), examples=1,
                                                     shrink_seconds=0).finding is not None), None)
    assert None not in caught.values(), f"{port.__name__} passed every row holding its pair at seeds " \
        f"{[s for s, i in caught.items() if i is None]}"
    clean = {seed: fuzz(planted.Unplanted(), "float32", seed=seed, cells=(i,), examples=1) for seed, i in caught.items()}
    wrong = {seed: (caught[seed], r.examples, r.finding and r.finding.result.message) for seed, r in clean.items()
             if r.examples != 1 or r.finding is not None}
    assert not wrong, wrong  # seed: (row, examples judged, the divergence)


def test_a_covered_run_searches_every_cell_and_reports_the_pairs_its_examples_hold(capsys):
    """By default one search a cell, then draws at random; the report line gives the pairs held. The
    spec against itself raises no false alarm at the default budget (seeds 0 to 19:
    benchmarks/fuzz_seeds.py, the fuzzing page's table): the spec runs the reference's own float64
    computation, so its error is 0; what could fail is the harness, a draw the spec refuses or
    crashes on, an output of the wrong shape, or fewer than half the draws run."""
    from odeattn.cli import main
    from odeattn.conformance.adapters import SpecAdapter
    from odeattn.conformance.fuzzing.fuzz_report import format_run

    run = fuzz(SpecAdapter(), "float64", seed=0)  # the default: the array first; the spec against itself at seed 0
    feasible, _ = cover.feasible_pairs()
    assert run.cells == len(cover.covering_array(0)) and not run.failed  # the spec's own kinds: every cell
    assert run.finding is None and run.examples >= DEFAULT_EXAMPLES // 2
    assert len(run.held & feasible) > 0.8 * len(feasible)  # the cells a fair input was found for
    assert f"hold {len(run.held & feasible)} of the {len(feasible)} feasible pairs" in format_run(run)
    assert main(["conformance", "fuzz", "--model", "m.onnx", "--config", "c.json", "--weights", "w.npz", "--cover"]) == 2
    assert capsys.readouterr().err == ("odeattn conformance fuzz: --cover: not taken with --model (the file's config is "
                                       "fixed; the array's cells vary configs)\n")
    assert main(["conformance", "--backend", "spec", "--no-cover"]) == 2
    assert capsys.readouterr().err == "odeattn conformance: --no-cover: taken only by 'odeattn conformance fuzz'\n"
    assert main(["conformance", "fuzz", "--replay", "r", "--same-draws"]) == 2
    assert capsys.readouterr().err == ("odeattn conformance fuzz: --same-draws: not taken with --replay (it reruns one "
                                       "example, drawing nothing)\n")
    uncovered = fuzz(SpecAdapter(), "float64", seed=0, examples=5, cover=False)
    assert uncovered.cells == 0 and "no covering array searched: turned off" in format_run(uncovered)

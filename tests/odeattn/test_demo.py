"""odeattn.demo: all three solvers start from the same weights and see the same batches (the
command's training run, counts and plot: tests/odeattn/commands/test_demo.py)."""

import pytest

torch = pytest.importorskip("torch")

from odeattn import demo as D  # noqa: E402


def test_every_solver_starts_from_the_same_weights():
    models = {s: D.build_model(D.Task(), s, seed=0).state_dict() for s in D.SOLVERS}
    gate = {"1.gate.weight", "1.gate.bias"}
    assert set(models["rk2_gated"]) - set(models["euler"]) == gate and set(models["euler"]) == set(models["rk4"])
    for name, value in models["euler"].items():
        assert torch.equal(value, models["rk4"][name]) and torch.equal(value, models["rk2_gated"][name]), name


def test_the_same_seed_gives_the_same_batches_and_targets_are_shifted():
    first = [next(D.batches(D.Task(), seed=3)) for _ in range(2)]
    assert torch.equal(first[0][0], first[1][0])
    tokens, targets = first[0]
    assert (targets[:, 0] == -100).all() and torch.equal(targets[:, 1:], tokens[:, :-1])

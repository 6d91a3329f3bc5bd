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


def test_the_layer_blocks_have_equal_parameter_counts_and_start_from_the_same_embeddings():
    """blocks="layer": the residual layer's one more FFN unit costs what the gate does, 2 d_model + 1."""
    models = {f: D.build_layer_model(D.Task(), f, seed=0) for f in D.LAYER_FAMILIES}
    assert D.count_parameters(models["euler"]) == D.count_parameters(models["rk2_gated"]) == 11137
    gated, residual = (models[f].state_dict() for f in ("rk2_gated", "euler"))
    assert set(gated) - set(residual) == {"1.gate_linear.weight", "1.gate_linear.bias"}
    for name in ("0.tokens.weight", "0.positions.weight", "2.weight", "2.bias"):
        assert torch.equal(gated[name], residual[name]), name


def test_the_layer_blocks_train():
    """100 steps of each (about 2.5 s): the mean loss of the last 10 falls by more than 1 from the
    first 10's (measured 3.3 and 3.1; a model that never attends can reach ln 32, 0.13 below the start)."""
    runs = D.run(steps=100, blocks="layer")["runs"]
    assert [r["solver"] for r in runs] == list(D.LAYER_FAMILIES)
    for r in runs:
        assert sum(r["losses"][-10:]) / 10 < sum(r["losses"][:10]) / 10 - 1.0, r["solver"]


def test_an_unknown_block_kind_is_refused():
    with pytest.raises(ValueError, match=r"blocks: expected one of 'attention', 'layer'; got 'rk'"):
        D.run(steps=1, blocks="rk")


def test_each_kind_of_block_has_its_own_plot_title(drawn_figure):
    runs = [{"solver": "euler", "parameters": 10, "losses": [2.0, 1.0]}]
    titles = {blocks: drawn_figure(lambda path: D.plot({"runs": runs, "blocks": blocks}, path)).axes[0].get_title()
              for blocks in D.BLOCKS}
    assert "--blocks layer" in titles["layer"] and "encoder layer" in titles["layer"]
    assert "--blocks" not in titles["attention"] and titles["attention"] != titles["layer"]

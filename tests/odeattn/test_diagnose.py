"""odeattn.diagnose: the orders it observes, the fewest steps it reports, and the BitLinear floor
(the command's table and plot: tests/odeattn/commands/test_diagnose.py)."""

import dataclasses

import numpy as np
import pytest

import ode_ref as R
from ode_ref.multistep import MULTISTEP
from odeattn import diagnose as D

SMOOTH = R.ODEConfig(hidden_size=16, num_heads=2)
BITNET = R.ODEConfig(hidden_size=16, num_heads=2, use_bitnet=True)
X = np.random.default_rng(0).normal(size=(1, 4, 16))


def with_gate(cfg):
    """The config's parameters and a gate, so every solver runs (rk2_gated reads the gate). Its
    bias is 1 (g near 0.73): away from g = 1/2, where rk2_gated is Heun's method, of order 2."""
    params = R.init_params(dataclasses.replace(cfg, ode_solver="rk2_gated"))
    params["gate.bias"] = params["gate.bias"] + 1.0
    return params


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("odeattn/test_diagnose")


@pytest.fixture(scope="session")
def smooth():
    return D.diagnose(with_gate(SMOOTH), X, SMOOTH, max_steps=64, ref_steps=512, tol=1e-4)


@pytest.fixture(scope="session")
def bitnet():
    return D.diagnose(with_gate(BITNET), X, BITNET, max_steps=64, ref_steps=512, tol=1e-3)


def test_weights_without_a_gate_skip_the_gated_solver_with_the_reason():
    rows = {r.name: r for r in D.solvers(SMOOTH, R.init_params(SMOOTH))}
    assert rows["rk2_gated"].skip == "needs gate.weight, gate.bias, which the weights lack"
    assert all(r.skip is None for name, r in rows.items() if name != "rk2_gated")


def test_a_momentum_config_of_its_own_gamma_runs_every_solver():
    """momentum_gamma is momentum's: each other solver runs at its default, not refused for it."""
    cfg = dataclasses.replace(SMOOTH, ode_solver="momentum", momentum_gamma=0.5)
    rows = {r.name: r for r in D.solvers(cfg, R.init_params(cfg))}
    assert all(r.skip is None for name, r in rows.items() if name != "rk2_gated")
    assert D.solve(rows["momentum"].params, X, cfg, "momentum", 2).shape == X.shape


def test_observed_orders_match_the_tableaus_on_a_smooth_block(smooth):
    # the reference is converged far below every error used: rk4 at 512 vs 256 steps differ by ~6e-15
    assert smooth["reference"]["error"] < 1e-13
    rows = {r["solver"]: r for r in smooth["solvers"]}
    assert set(rows) == set(R.SOLVERS) and all(r["skip"] is None for r in rows.values())
    for name, row in rows.items():
        # measured: every tableau's fitted order within 0.012 of the nominal one (the pre-asymptotic
        # terms at h = 1/16 .. 1/64), ab2's 1.981, ab3's 2.914 (its start's error still counts); a
        # solver of another order would be off by 1 or more. momentum's 0.75: its speed lags f by
        # about 1 / (1 - gamma) = 10 steps, a lag these step counts do not yet outnumber
        nominal = (R.TABLEAUS.get(name) or MULTISTEP[name]).order
        if name == "momentum":
            assert 0.5 < row["order"] < nominal, row["order"]
        else:
            assert abs(row["order"] - nominal) < (0.1 if name == "ab3" else 0.05), (name, row["order"])
        assert row["floor_steps"] is None and row["fit_steps"] == [16, 32, 64]


def test_fewest_steps_agree_with_the_error_table(smooth, bitnet):
    for result in (smooth, bitnet):
        tol, ref = result["tol"], result["reference"]["error"]
        for row in result["solvers"]:
            met = [e + ref <= tol for e in row["errors"]]
            n = row["fewest_steps"]
            if n is None:  # "not reached": the finest step tried misses tol
                assert not met[-1], row["solver"]
                continue
            i = result["steps"].index(n)
            assert all(met[i:]) and (i == 0 or not met[i - 1]), row["solver"]
    # and the answers themselves (errors above): rk4 meets 1e-4 in one step (1.6e-5), midpoint needs
    # 8 (1.6e-4 at 4), euler does not reach it by 64 (3.0e-4)
    fewest = {r["solver"]: r["fewest_steps"] for r in smooth["solvers"]}
    assert (fewest["rk4"], fewest["midpoint"], fewest["euler"]) == (1, 8, None)


def test_bitlinear_reports_a_floor_and_fits_no_order(bitnet):
    rows = {r["solver"]: r for r in bitnet["solvers"]}
    assert all(r["order"] is None and "BitLinear's quantiser" in r["note"] for r in rows.values())
    # the fourth-order methods lose their rate at once: their errors fall by 2^-0.2 .. 2^-1.1 per doubling
    for name in ("rk4", "rk38"):
        assert rows[name]["floor_steps"] is not None and "floor: from" in rows[name]["note"]
        assert max(rows[name]["local_orders"]) < 2  # half the nominal order
    # the reference is not converged to the smooth level either (measured 5.6e-5): a tolerance under
    # the noise level (10x that) is warned of, one above it is not
    assert bitnet["reference"]["error"] > 1e-6
    assert "warning: tol 1e-04 is at or below the noise level" in D.format_report({**bitnet, "tol": 1e-4})
    assert "warning" not in D.format_report(bitnet)


def test_order_fit_and_floor_on_exact_powers():
    steps = [1, 2, 4, 8, 16]
    exact = [3e-2 * n**-3.0 for n in steps]
    assert abs(D.observed_order(steps, exact, 0.0, 3, False)["order"] - 3.0) < 1e-12
    stalled = exact[:3] + [exact[2] * 0.9, exact[2] * 0.85]  # stops falling after 4 steps
    out = D.observed_order(steps, stalled, 0.0, 3, False)
    assert out["order"] is None and out["floor_steps"] == 4 and out["note"].startswith("no order fitted; floor")
    # errors at or below the noise level are left out of the fit and the floor
    assert D.observed_order(steps, exact, exact[3], 3, False)["fit_steps"] == [1, 2, 4]
    # an error that meets tol and is missed again later does not count: every larger step must meet it
    assert D.fewest_steps(steps, [1e-2, 1e-5, 1e-3, 1e-5, 1e-6], 1e-4, 0.0) == 8


def test_a_solver_the_weights_cannot_run_is_skipped_with_the_reason(monkeypatch):
    shapes = R.param_shapes

    def gated(config):  # a solver that reads one more parameter, as a gated one would
        extra = {"gate.weight": (1, 2 * config.hidden_size)} if config.ode_solver == "heun" else {}
        return {**shapes(config), **extra}

    monkeypatch.setattr(R, "param_shapes", gated)
    monkeypatch.setattr(R, "SOLVERS", (*R.SOLVERS, "not_a_solver"))
    rows = {s.name: s for s in D.solvers(SMOOTH, R.init_params(SMOOTH))}
    assert rows["heun"].skip == "needs gate.weight, which the weights lack"
    assert rows["not_a_solver"].skip.startswith("not runnable with this config (ode_solver: expected one of")
    assert rows["rk4"].skip is None and set(rows["rk4"].params) == set(shapes(SMOOTH))


def test_the_plot_draws_each_solver_distinguishably(smooth, drawn_figure):
    """Solvers of one order draw nearly the same line: each has its own (marker, dash, colour),
    its markers hollow, so a line drawn over another still shows."""
    fig = drawn_figure(lambda path: D.plot(smooth, path))
    lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 2]  # not the level lines
    assert len(lines) == sum(r["skip"] is None for r in smooth["solvers"]) >= 6
    styles = [(line.get_marker(), line.get_linestyle(), line.get_color()) for line in lines]
    assert all(len({s[k] for s in styles}) == len(styles) for k in (0, 2)) and len(set(styles)) == len(styles)
    assert len({s[1] for s in styles}) == len(D.DASHES) and {line.get_fillstyle() for line in lines} == {"none"}

import numpy as np
import pytest

import ode_ref as R
from ode_ref.tableaus import ButcherTableau


@pytest.mark.parametrize("tab", list(R.TABLEAUS.values()), ids=list(R.TABLEAUS))
def test_each_tableau_meets_the_order_conditions_of_its_order_and_no_higher(tab):
    """The classical order conditions up to the tableau's claimed order (and not one beyond). A
    gated tableau's weights are (g, 1 - g): checked at g = 0.3, a gate away from 1/2 (Heun's)."""
    c, b = np.array(tab.c), np.array((0.3, 0.7) if tab.gated else tab.b)
    A = np.zeros((tab.num_stages, tab.num_stages))
    for i, row in enumerate(tab.a):
        A[i, : len(row)] = row
    conditions = {
        1: [(b.sum(), 1)],
        2: [(b @ c, 1 / 2)],
        3: [(b @ c**2, 1 / 3), (b @ A @ c, 1 / 6)],
        4: [(b @ c**3, 1 / 4), (b @ (c * (A @ c)), 1 / 8), (b @ A @ c**2, 1 / 12), (b @ A @ A @ c, 1 / 24)],
    }
    for order in range(1, tab.order + 1):
        for got, want in conditions[order]:
            assert got == pytest.approx(want, abs=1e-15)
    if tab.order < 4:
        assert any(abs(g - w) > 1e-3 for g, w in conditions[tab.order + 1])
    np.testing.assert_allclose(A.sum(axis=1), c, atol=1e-15)
    assert c[0] == 0 and not np.triu(A).any()  # explicit


def test_the_two_fourth_order_rules_are_different_methods():
    assert R.TABLEAUS["rk4"].b != R.TABLEAUS["rk38"].b
    assert R.TABLEAUS["rk4"].b == (1 / 6, 1 / 3, 1 / 3, 1 / 6)
    assert R.TABLEAUS["rk38"].b == (1 / 8, 3 / 8, 3 / 8, 1 / 8)


def test_rk4_and_rk38_differ_at_h5_per_step():
    """On y' = y^2 (non-linear: both rules are exact on linear problems to 4th order only)."""
    f = lambda t, y: y * y  # noqa: E731
    diffs = []
    hs = [0.02, 0.01, 0.005]  # small enough for the h^5 term to dominate, large enough to beat rounding
    for h in hs:
        a = R.rk_step(f, 0.0, h, np.float64(1.0), R.TABLEAUS["rk4"])
        b = R.rk_step(f, 0.0, h, np.float64(1.0), R.TABLEAUS["rk38"])
        diffs.append(abs(a - b))
    slopes = np.diff(np.log(diffs)) / np.diff(np.log(hs))
    assert diffs[-1] > 0
    np.testing.assert_allclose(slopes, 5.0, atol=0.15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(dict(c=(0.0, 0.5), a=((), (0.4,)), b=(0.5, 0.5)), "row 1: sum\\(a\\)", id="row-sum-not-its-c"),
        pytest.param(dict(c=(0.0,), a=((),), b=(0.9,)), "sum\\(b\\)", id="weights-not-summing-to-1"),
        pytest.param(dict(c=(0.0, 1.0), a=((), (1.0, 0.0)), b=(0.5, 0.5)), "row 1 of a must have 1 entries",
                     id="row-of-the-wrong-length"),
        pytest.param(dict(c=(0.0,), a=((),), b=(0.5, 0.5)), "must all have 1 rows", id="b-of-another-length"),
    ],
)
def test_an_inconsistent_tableau_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ButcherTableau("bad", 1, **kwargs)

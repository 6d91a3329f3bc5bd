"""The conformance suite inside a pytest run: every golden case on every installed built-in
backend and dtype, the same check as `odeattn conformance` (runner.run_case)."""

import pytest

from conformance.backends import BUILTIN, OPTIONAL_BUILTIN, make_backend
from conformance.golden import load_cases
from conformance.runner import run_case

CASES = load_cases()


def _backends():
    out = []
    for name, source in {**BUILTIN, **OPTIONAL_BUILTIN}.items():
        try:
            backend = make_backend(source)
        except ImportError:
            continue
        out += [pytest.param(backend, d, id=f"{name}-{d}") for d in backend.dtypes]
    return out


@pytest.mark.conformance
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("backend, dtype", _backends())
def test_case(backend, dtype, case):
    result = run_case(backend, case, dtype)
    if result.status == "skipped":
        pytest.skip(result.message)
    assert result.status == "passed", result.message

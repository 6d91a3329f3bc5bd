"""Which cases run, and what a result means once the expected failures are applied.

select and compile_patterns choose the cases by name (the include and exclude regexes) and
chosen_dtypes the dtypes of a backend's that a run asked for; not_run is the result recorded for a
case a backend does not run (untestable in the dtype, or skipped by an expectations file); and
expected_outcome applies the expected failures to a result: an expectations file's xfail
(strict), then the xfail patterns (a failure becomes xfailed, a pass xpassed).
"""

from __future__ import annotations

import re
from typing import Optional

from .compare import CaseResult, untestable
from .expectations import apply as apply_expectation


def compile_patterns(option: str, patterns) -> list:
    """re.compile each pattern; ValueError naming `option` (the parameter, or a command's option)
    and the pattern if one is invalid."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as err:
            raise ValueError(f"{option}: invalid regular expression {p!r} ({err})") from None
    return out


def select(cases, include=(), exclude=()):
    """Cases whose name matches any include regex (all if none) and no exclude regex."""
    inc, exc = compile_patterns("include", include), compile_patterns("exclude", exclude)
    return [c for c in cases
            if (not inc or any(p.search(c.name) for p in inc)) and not any(p.search(c.name) for p in exc)]


def chosen_dtypes(declared, only) -> list:
    """The dtypes of declared that a run asked for (only: those, checked by half.check_dtypes; None: all)."""
    return [d for d in declared if only is None or d in only]


def apply_xfail(result: CaseResult, patterns) -> CaseResult:
    """A failure matching 'backend/dtype/case' becomes xfailed, a pass xpassed (a failure too)."""
    if any(p.search(f"{result.backend}/{result.dtype}/{result.case}") for p in patterns):
        if result.status in ("failed", "error"):
            result.status = "xfailed"
        elif result.status == "passed":
            result.status = "xpassed"
            result.message = "unexpected pass: the case matches an xfail pattern but passed"
    return result


def not_run(backend: str, dtype: str, case, judged, expectations) -> Optional[CaseResult]:
    """The result recorded, not run, for a case on a backend in dtype: untestable there (judged:
    the case its result would be judged against), or skipped by the expectations file (asked
    either way, so that the file knows its skip lines used); None when the case runs."""
    skipped = untestable(CaseResult(backend, dtype, case.name, "passed"), judged)
    expected = expectations.skip(backend, dtype, case=case.name, kind=case.kind, config=case.config)
    if skipped is None and expected is not None:
        skipped = CaseResult(backend, dtype, case.name, "skipped", f"not run: {expected.label}")
    return skipped


def expected_outcome(r: CaseResult, case, expectations, xfail) -> CaseResult:
    """r with the expected failures applied: the expectations file's xfail for its case (strict),
    then the xfail patterns (compiled)."""
    judged = r.status in ("passed", "failed", "error")  # a skip is no use of an xfail line: it stays unnamed otherwise
    expected = expectations.xfail(r.backend, r.dtype, case=r.case, kind=case.kind, config=case.config) if judged else None
    return apply_xfail(apply_expectation(r, expected), xfail)

"""A pytest plugin for port authors: `pytest --odeattn-backend mylib:MyBackend` adds the golden
cases and a fuzz budget to their own suite as test items (registered under the `pytest11` entry
point, so installing odeattn is enough).

    --odeattn-backend REF     a backend as `odeattn conformance --backend` takes it (repeatable)
    --odeattn-dtype DTYPE     only these of its dtypes (repeatable; default all it declares)
    --odeattn-examples N      the fuzz budget per dtype (default fuzz.DEFAULT_EXAMPLES; 0: no fuzz item)
    --odeattn-seed S          the fuzz seed (default 0)

Items are named `odeattn[<backend>/<dtype>/<case>]` and `odeattn[<backend>/<dtype>/fuzz]`, so -k,
-x, xfail markers and --junitxml work on them. A fuzz failure prints its shrunk example and the
repro folder it wrote (under pytest's basetemp). Without --odeattn-backend the plugin adds nothing.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("odeattn", "odeattn conformance of a backend")
    group.addoption("--odeattn-backend", action="append", default=[], metavar="REF",
                    help="run the odeattn golden cases and a fuzz budget on this backend (module:object or a built-in name)")
    group.addoption("--odeattn-dtype", action="append", default=[], metavar="DTYPE", help="only this dtype (repeatable)")
    group.addoption("--odeattn-examples", type=int, default=None, metavar="N", help="fuzz examples per dtype (0: none)")
    group.addoption("--odeattn-seed", type=int, default=0, metavar="S", help="the fuzz seed")


class ConformanceFailure(Exception):
    """A case or fuzz item's divergence, printed as its message alone."""


class _Item(pytest.Item):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class GoldenItem(_Item):
    def __init__(self, *, adapter, case, dtype, **kw):
        super().__init__(**kw)
        self.adapter, self.case, self.dtype = adapter, case, dtype

    def runtest(self):
        from .running.runner import run_case

        result = run_case(self.adapter, self.case, self.dtype)
        if result.status == "skipped":
            pytest.skip(result.message)
        if result.status == "untestable":
            pytest.skip(result.message)
        if result.failed:
            raise ConformanceFailure(f"{self.case.name}: {result.status}: {result.message}")


def fuzz_test(adapter, dtype: str, examples: int, seed: int, reference: str):
    """The fuzz item's test function; its repro folder goes under pytest's tmp_path_factory (a
    fixture: the item is a pytest.Function, so it gets fixtures as any test does)."""
    def odeattn_fuzz(tmp_path_factory):
        from .fuzzing.fuzz import fuzz
        from .fuzzing.fuzz_report import format_finding
        from .fuzzing.repro import folder_name, write_repro

        run = fuzz(adapter, dtype, examples=examples, seed=seed)
        if run.examples == 0:
            raise ConformanceFailure(f"the backend ran none of the drawn configs in {dtype}: that is not a pass")
        if run.finding is not None:
            base = tmp_path_factory.mktemp("odeattn-fuzz-repro")
            run.finding.repro = str(write_repro(base / folder_name(reference, dtype), run.finding, reference, dtype))
            raise ConformanceFailure(f"fuzz: a counterexample after {run.examples} examples\n{format_finding(run.finding)}")

    return odeattn_fuzz


class FuzzItem(pytest.Function):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they then apply to these items too
def pytest_collection_modifyitems(session, config, items):
    references = config.getoption("odeattn_backend")
    if not references:
        return
    from .adapters import BUILTIN, make_adapter
    from .fuzzing.fuzz import DEFAULT_EXAMPLES
    from .golden import load_cases

    cases = load_cases()
    examples = config.getoption("odeattn_examples")
    examples = DEFAULT_EXAMPLES if examples is None else examples
    only = config.getoption("odeattn_dtype")
    for reference in references:
        adapter = make_adapter(BUILTIN[reference].reference if reference in BUILTIN else reference)
        for dtype in [d for d in adapter.dtypes if not only or d in only]:
            label = f"{adapter.name}/{dtype}"
            items += [GoldenItem.from_parent(session, name=f"odeattn[{label}/{c.name}]", adapter=adapter, case=c, dtype=dtype)
                      for c in cases]
            if examples > 0:
                test = fuzz_test(adapter, dtype, examples, config.getoption("odeattn_seed"), reference)
                items.append(FuzzItem.from_parent(session, name=f"odeattn[{label}/fuzz]", callobj=test))

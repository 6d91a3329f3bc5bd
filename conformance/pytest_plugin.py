"""A pytest plugin for port authors: `pytest --odeattn-backend mylib:MyBackend` adds the golden
cases and a fuzz budget to their own suite as test items (registered under the `pytest11` entry
point, so installing odeattn is enough).

    --odeattn-backend REF     a backend as `odeattn conformance --backend` takes it (repeatable)
    --odeattn-dtype DTYPE     only these of its dtypes (repeatable; default all it declares)
    --odeattn-examples N      the fuzz budget per dtype (default fuzz.DEFAULT_EXAMPLES; 0: no fuzz item)
    --odeattn-min-examples N  fewer fuzz examples judged fails the fuzz item (default: the budget)
    --odeattn-seed S          the fuzz seed (default 0)
    --odeattn-no-cover        no covering array first: the fuzz budget drawn at random alone
    --odeattn-same-draws      the same fuzz examples in every dtype (default: each dtype its own)
    --odeattn-encoder-examples N  the encoder stack's fuzz budget per dtype, float32 and float64, where
                              the backend runs encoder cases (default fuzz.DEFAULT_ENCODER_EXAMPLES,
                              0 beside --odeattn-examples 0; 0: none)
    --odeattn-database DIR    keep failing fuzz examples there and judge them first next time
    --odeattn-expectations F  a port's expectations file (repeatable): its xfails (strict) and skips
    --odeattn-shard I/N       only the I-th of N parts of the golden cases (running/shards.py); the
                              fuzz items go round the shards, one (backend, dtype) each in turn
    --odeattn-timeout S       the seconds a backend may take to import and construct, and to run one
                              case or fuzz example (default 120)

Items are named `odeattn[<backend>/<dtype>/<case>]`, `odeattn[<backend>/<dtype>/fuzz]` and
`odeattn[<backend>/<dtype>/fuzz-encoder]`, so -k,
-x, xfail markers and --junitxml work on them. A fuzz failure prints its shrunk example and the
repro folder it wrote (under pytest's basetemp). Without --odeattn-backend the plugin adds nothing.
A module:object backend is found in the working folder, as `odeattn conformance` finds it; a
backend or option that cannot be used is a one-line usage error (pytest.UsageError), before any item runs.
Each backend runs in a worker process of its own (running/client.RemoteAdapter), started at
collection and stopped when pytest ends: a port that raises, exits, hangs or crashes fails its
item, never the session.
"""

from __future__ import annotations


import pytest


def pytest_addoption(parser):
    group = parser.getgroup("odeattn", "odeattn conformance of a backend")
    group.addoption("--odeattn-backend", action="append", default=[], metavar="REF",
                    help="run the odeattn golden cases and a fuzz budget on this backend (module:object or a built-in name)")
    group.addoption("--odeattn-dtype", action="append", default=[], metavar="DTYPE", help="only this dtype (repeatable)")
    group.addoption("--odeattn-examples", type=int, default=None, metavar="N", help="fuzz examples per dtype (0: none)")
    group.addoption("--odeattn-min-examples", type=int, default=None, metavar="N",
                    help="fewer fuzz examples judged than N (too many draws refused) fails the fuzz item (default: the budget)")
    group.addoption("--odeattn-seed", type=int, default=0, metavar="S", help="the fuzz seed")
    group.addoption("--odeattn-no-cover", action="store_true",
                    help="no covering array over the fuzzer's factors first: the fuzz budget drawn at random alone")
    group.addoption("--odeattn-same-draws", action="store_true",
                    help="the same fuzz examples in every dtype (default: each dtype its own, from the same seed)")
    group.addoption("--odeattn-encoder-examples", type=int, default=None, metavar="N",
                    help="the encoder stack's fuzz examples per dtype (float32, float64), where the backend runs encoder "
                         "cases (default 10; 0: none)")
    group.addoption("--odeattn-database", default=None, metavar="DIR",
                    help="keep failing fuzz examples in this folder and judge them first on the next run")
    group.addoption("--odeattn-expectations", action="append", default=[], metavar="FILE",
                    help="a port's expectations file (JSON, repeatable): known failures (strict xfail) and skips")
    group.addoption("--odeattn-shard", default=None, metavar="I/N",
                    help="only the I-th of N parts of the golden cases, balanced by measured case time")
    group.addoption("--odeattn-timeout", type=float, default=120.0, metavar="S",
                    help="seconds a backend may take to import and construct, and to run a case or fuzz example (default 120)")


class ConformanceFailure(Exception):
    """A case or fuzz item's divergence, printed as its message alone."""


class _Item(pytest.Item):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, self.name  # a line, which pytest needs to report a skip marker's skip


class GoldenItem(_Item):
    def __init__(self, *, adapter, case, dtype, **kw):
        super().__init__(**kw)
        self.adapter, self.case, self.dtype = adapter, case, dtype

    def runtest(self):
        from .running.compare import run_case

        result = run_case(self.adapter, self.case, self.dtype)
        if result.status == "skipped":
            pytest.skip(result.message)
        if result.status == "untestable":
            pytest.skip(result.message)
        if result.failed:
            raise ConformanceFailure(f"{self.case.name}: {result.status}: {result.message}")


def fuzz_test(adapter, dtype: str, examples: int, seed: int, reference: str, min_examples=None, database=None,
              expectations=None, cover=True, share_draws=False, kinds=None):
    """The fuzz item's test function; its repro folder goes under pytest's tmp_path_factory (a
    fixture: the item is a pytest.Function, so it gets fixtures as any test does). kinds (ENCODER,):
    the encoder stack's search, where min_examples 0 (its default) lets a port refuse every draw."""
    def odeattn_fuzz(tmp_path_factory):
        from .fuzzing.fuzz import fuzz
        from .fuzzing.fuzz_report import format_finding, format_refusals, found_in, shortfall
        from .fuzzing.repro import folder_name, write_repro

        run = fuzz(adapter, dtype, examples=examples, seed=seed, min_examples=min_examples, database=database,
                   expectations=expectations, cover=cover, share_draws=share_draws, kinds=kinds)
        if run.examples == 0 and min_examples == 0:  # the encoder stack's default search: the port runs no encoder config
            pytest.skip(f"the backend ran none of the drawn encoder stacks ({format_refusals(run.refusals) or 'none drawn'})")
        if run.examples == 0:
            raise ConformanceFailure(f"the backend ran none of the drawn configs in {dtype} "
                                     f"({format_refusals(run.refusals) or 'none drawn'}): that is not a pass")
        if run.short:
            raise ConformanceFailure(f"fuzz: {shortfall(run)}; that is not a pass (--odeattn-min-examples N accepts fewer)")
        if run.finding is not None:
            try:
                base = tmp_path_factory.mktemp("odeattn-fuzz-repro")
                run.finding.repro = str(write_repro(base / folder_name(reference, dtype, run.suffix), run.finding, reference, dtype))
            except OSError as err:  # the finding is still reported, below, without its folder
                run.finding.repro = f"not written ({err.strerror or err})"
            raise ConformanceFailure(f"fuzz: a counterexample after {run.examples} examples, found in "
                                     f"{found_in(run.found_in)}\n{format_finding(run.finding)}")
        if run.unexpected:
            raise ConformanceFailure(f"fuzz: unexpected pass: {'; '.join(run.unexpected)}: none of the examples it selects failed")

    return odeattn_fuzz


def _skipped(reason: str):
    """A test function that skips with reason (an item asked for that the backend cannot run)."""
    def odeattn_fuzz():
        pytest.skip(reason)

    return odeattn_fuzz


class FuzzItem(pytest.Function):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


def check_options(config) -> tuple:
    """The fuzz budgets (the block's; the encoder stack's, None for its default), once --odeattn-dtype, --odeattn-examples,
    --odeattn-encoder-examples, --odeattn-min-examples and --odeattn-database are checked;
    pytest.UsageError naming the option otherwise."""
    from ode_ref.precision import DTYPES

    from .fuzzing.fuzz import DEFAULT_EXAMPLES

    bad = [d for d in config.getoption("odeattn_dtype") if d not in DTYPES]
    if bad:
        raise pytest.UsageError(f"--odeattn-dtype: expected one of {', '.join(DTYPES)}; got {bad[0]!r}")
    examples, least = config.getoption("odeattn_examples"), config.getoption("odeattn_min_examples")
    examples = DEFAULT_EXAMPLES if examples is None else examples
    if examples < 0:
        raise pytest.UsageError(f"--odeattn-examples: expected an integer >= 0; got {examples}")
    encoder_examples = config.getoption("odeattn_encoder_examples")  # None: the default (0 beside --odeattn-examples 0)
    if encoder_examples is not None and encoder_examples < 0:
        raise pytest.UsageError(f"--odeattn-encoder-examples: expected an integer >= 0; got {encoder_examples}")
    if encoder_examples is None and examples == 0:
        encoder_examples = 0  # no fuzzing asked for
    if least is not None and not 1 <= least <= examples:
        raise pytest.UsageError(f"--odeattn-min-examples: expected an integer from 1 to the budget ({examples}); got {least}")
    database = config.getoption("odeattn_database")
    if database is not None:
        from .fuzzing.repro import check_writable_folder

        try:
            check_writable_folder("--odeattn-database", database, "a failing example would not be kept")
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
    timeout = config.getoption("odeattn_timeout")
    if not timeout > 0 or timeout == float("inf"):
        raise pytest.UsageError(f"--odeattn-timeout: expected a finite number of seconds > 0; got {timeout}")
    return examples, encoder_examples


ADAPTERS = pytest.StashKey[list]()  # the session's [(reference, client.RemoteAdapter)], stopped at its end


def load_adapters(config, references, timeout: float) -> list:
    """[(reference as typed, adapter)], each found (a module in the working folder too, as
    `odeattn conformance` finds it: search_path.py) and constructed in a worker process within
    timeout seconds (its import probed first, as the main run does); pytest.UsageError in one line
    for one that cannot be."""
    from .adapters.search_path import import_from_working_folder
    from .running.remote import remote_adapters

    import_from_working_folder()
    try:
        config.stash[ADAPTERS] = remote_adapters(references, timeout)
    except (ValueError, ModuleNotFoundError) as err:  # its message begins 'backend'
        raise pytest.UsageError(f"--odeattn-{err}") from None
    return config.stash[ADAPTERS]


def pytest_unconfigure(config):
    """The backends' worker processes stopped with the session."""
    for _, adapter in config.stash.get(ADAPTERS, []):
        adapter.close()


SHARD = pytest.StashKey[tuple]()  # (I, N) of --odeattn-shard, for the hook that splits after -k


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they then apply to these items too
def pytest_collection_modifyitems(session, config, items):
    references = config.getoption("odeattn_backend")
    if not references:
        return
    from ode_ref.precision import HALF_DTYPES

    from .cases.kinds import ENCODER
    from .fuzzing.fuzz import ENCODER_SUFFIX, encoder_search
    from .golden import load_cases

    examples, encoder_examples = check_options(config)
    index, count, expected = check_ci_options(config)
    cases = load_cases()
    only = config.getoption("odeattn_dtype")
    fuzz_options = (config.getoption("odeattn_min_examples"), config.getoption("odeattn_database"), expected,
                    not config.getoption("odeattn_no_cover"), config.getoption("odeattn_same_draws"))
    adapters = load_adapters(config, references, config.getoption("odeattn_timeout"))
    if not any(d in only for _, adapter in adapters for d in adapter.dtypes) and only:
        raise pytest.UsageError(f"--odeattn-dtype: no backend runs any of the dtypes asked for ({', '.join(only)})")
    added = []
    for reference, adapter in adapters:
        for dtype in [d for d in adapter.dtypes if not only or d in only]:
            label = f"{adapter.name}/{dtype}"
            for c in cases:
                item = GoldenItem.from_parent(session, name=f"odeattn[{label}/{c.name}]", adapter=adapter, case=c, dtype=dtype)
                mark_expected(item, expected, adapter.name, dtype, c)
                added.append(item)
            if examples > 0:
                test = fuzz_test(adapter, dtype, examples, config.getoption("odeattn_seed"), reference, *fuzz_options)
                added.append(FuzzItem.from_parent(session, name=f"odeattn[{label}/fuzz]", callobj=test))
            encoder = encoder_search(adapter, dtype, encoder_examples, fuzz_options[0])
            if encoder is not None:
                _, database, expectations, _, share = fuzz_options  # no covering array: the encoder's draws are random
                test = fuzz_test(adapter, dtype, encoder[0], config.getoption("odeattn_seed"), reference, encoder[1], database,
                                 expectations, None, share, kinds=(ENCODER,))
                added.append(FuzzItem.from_parent(session, name=f"odeattn[{label}/fuzz{ENCODER_SUFFIX}]", callobj=test))
            elif encoder_examples and ENCODER.missing(adapter) and dtype not in HALF_DTYPES:  # asked for: said
                test = _skipped(ENCODER.missing(adapter))
                added.append(FuzzItem.from_parent(session, name=f"odeattn[{label}/fuzz{ENCODER_SUFFIX}]", callobj=test))
    items += added
    # counted as collected, as a file's items are (the header's "collected N items", -k's "selected")
    config.hook.pytest_collectreport(report=pytest.CollectReport("odeattn", "passed", None, added))
    config.stash[SHARD] = (index, count)


class ShardSplitter:
    """A plugin of its own (registered by pytest_configure), as a module holds one implementation
    of a hook: after -k and -m, the shard keeps its part of the cases selected, as --shard does,
    and the fuzz items go round the shards in turn."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        index, count = config.stash.get(SHARD, (1, 1))
        if count == 1:
            return
        from .running.shards import shard

        cases = list({item.case.name: item.case for item in items if isinstance(item, GoldenItem)}.values())
        try:
            chosen = {c.name for c in shard(cases, index, count)}
        except ValueError as err:
            raise pytest.UsageError(str(err).replace("--shard", "--odeattn-shard", 1)) from None
        fuzz_items = [item for item in items if isinstance(item, FuzzItem)]
        keep = [item for item in items if not isinstance(item, (GoldenItem, FuzzItem)) or
                (item.case.name in chosen if isinstance(item, GoldenItem) else fuzz_items.index(item) % count == index - 1)]
        dropped = [item for item in items if item not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_configure(config):
    if config.getoption("odeattn_backend"):
        config.pluginmanager.register(ShardSplitter(), "odeattn-shards")


def check_ci_options(config) -> tuple:
    """(I, N, the expectations) of --odeattn-shard (1, 1 without it) and --odeattn-expectations;
    pytest.UsageError in one line naming the option, the file and the field otherwise."""
    from .running.expectations import load
    from .running.shards import parse_shard

    try:
        index, count = parse_shard(config.getoption("odeattn_shard"), "--odeattn-shard") \
            if config.getoption("odeattn_shard") is not None else (1, 1)
        return index, count, load(config.getoption("odeattn_expectations"))
    except ValueError as err:
        raise pytest.UsageError(str(err) if str(err).startswith("--") else f"--odeattn-expectations: {err}") from None


def mark_expected(item, expected, backend: str, dtype: str, case) -> None:
    """A golden item under the expectations file: skipped (not run), or a strict xfail."""
    skip = expected.skip(backend, dtype, case=case.name, kind=case.kind, config=case.config)
    if skip is not None:
        item.add_marker(pytest.mark.skip(reason=f"not run: {skip.label}"))
        return
    xfail = expected.xfail(backend, dtype, case=case.name, kind=case.kind, config=case.config)
    if xfail is not None:
        item.add_marker(pytest.mark.xfail(reason=xfail.label, strict=True, raises=ConformanceFailure))

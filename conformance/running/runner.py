"""Run every case on every backend, each backend in worker processes, and gather the report.

run_suite hands each backend's jobs (a case in a dtype: its request frame and its reply limit) to
the worker pool (conformance.running.pool, conformance.running.worker) and answers the pool's
events in one loop (_Run): each reply is judged in this process (compare.judge), the expected
failures applied (selection.expected_outcome), the progress told, and the report ordered at the
end. compare.run_case runs one backend object in this process instead.
"""

from __future__ import annotations

import time

from ode_ref.precision import DTYPES

from ..cases import at_steps
from ..cases.half import check_dtypes
from .compare import STATUSES, BackendError, CaseResult, Report, UsageRefusal, judge
from .requests import reply_limit, request_frame
from .selection import chosen_dtypes, compile_patterns, expected_outcome, not_run
from . import profile
from .expectations import Expectations
from .pool import BackendFailed, Constructed, Pool, Result, WorkerStarted, core_count
from ..adapters import reference_steps


def busy_note(measured: dict) -> str:
    """What a result's backend was busy with, for the progress: 'JAX compiling' when its case
    compiled XLA programs (not all read from JAX's persistent cache), else ""."""
    return "JAX compiling" if measured.get("programs", 0) > measured.get("cache_hits", 0) else ""


def run_suite(refs, cases, *, xfail=(), fail_fast=False, jobs=None, timeout=120.0, float64_bound=None,
              progress=None, taken=(), dtypes=None, first_failure=(), gate=None, init_timeout=None,
              expectations=None, usage_stops=False) -> Report:
    """Every case on every backend (odeattn.conformance.adapters.BackendRef) in every dtype it declares,
    each backend in worker processes of its own (those whose refs have shares_process: shared among them),
    at most `jobs` (default: the core count) at once.

    dtypes: only these of the dtypes each backend declares (None: all; ValueError for one not in
    ode_ref.precision.DTYPES). first_failure: dtypes in which a backend stops at its first failed case, the
    rest of that dtype's cases neither run nor reported (the mutation battery's "killed at all");
    gate: a dtype whose passed cases a backend does not run in a first_failure dtype (the battery's
    float64: a mutant float64 cannot see on a case changes nothing a half dtype could see).
    xfail: regexes matched against 'backend/dtype/case'; expectations: a port's expectations file
    (expectations.Expectations): its skips are not run, its xfails are strict. taken: names no backend may report
    besides the built-in it is (a plug-in called 'spec' is refused, not merged into spec's row: a
    UsageRefusal; usage_stops: it also ends the run, no further job started, for a command that
    reports it as a usage error).
    progress: an object told of the run as it goes: begin(total) with the number of results
    expected (a backend whose dtypes its ref does not state counts one dtype until it starts),
    grow(n) when that number changes, advance(label, note) per result (label 'backend/dtype';
    note 'JAX compiling' when the case compiled XLA programs, not read them from the cache, else ""),
    finished(backend, counts, seconds, note) when a backend is done (counts: status -> number;
    note: why it ran nothing, or ""), and close() at the end, however the run ends.

    The report's profile holds, per backend, the phases and counters of conformance.running.profile,
    and each result's profile its own share. timeout: the seconds a worker may take to run one
    case; init_timeout: to start and construct its backend (None: timeout), unless its ref has a
    start_timeout of its own."""

    run = _Run(refs, cases, compile_patterns("xfail", xfail), None if dtypes is None else check_dtypes(dtypes),
               progress, fail_fast=fail_fast, taken=taken, first_failure=first_failure, gate=gate,
               float64_bound=float64_bound, expectations=expectations, usage_stops=usage_stops)
    pool = Pool(refs, jobs=jobs or core_count(), timeout=timeout, init_timeout=init_timeout)
    run.begin()
    try:
        for event in pool.events():
            if isinstance(event, Constructed):
                run.constructed(pool, event.backend, event.name, event.dtypes)
            elif isinstance(event, WorkerStarted):
                run.worker_started(event.backend, event.profile, event.seconds)
            elif isinstance(event, Result):
                run.result(pool, event.backend, event.job, event.reply, event.arrays, event.seconds)
            elif isinstance(event, BackendFailed):
                run.backend_error(event.backend, event.message, event.traceback)
    finally:
        if progress:
            progress.close()
    return run.report_()


class _Run:
    """run_suite's state and its answers to the pool's events: the report, the progress, and per
    backend (the index of its ref) its name, the results expected and done."""

    def __init__(self, refs, cases, xfail, only, progress, *, fail_fast, taken, first_failure, gate, float64_bound,
                 expectations=None, usage_stops=False):

        self.refs, self.cases, self.xfail, self.only, self.progress = refs, cases, xfail, only, progress
        self.expectations = expectations if expectations is not None else Expectations()
        self.fail_fast, self.taken, self.first_failure, self.gate = fail_fast, taken, first_failure, gate
        self.float64_bound, self.usage_stops = float64_bound, usage_stops
        self.report = Report()
        self.names = {}  # backend index -> the name it reported
        self.expected = {i: len(chosen_dtypes(ref.dtypes, self.only) if ref.dtypes else ("?",)) * len(cases) for i, ref in enumerate(refs)}
        self.done = {i: 0 for i in range(len(refs))}
        self.began = time.perf_counter()
        self.spawned = {}  # backend index -> when its first worker was spawned
        self.requests = {}  # (id of a case of self.cases, dtype) -> its request frame, encoded once for every backend
        self.by_name = {c.name: c for c in cases}
        self.stopped = False

    def begin(self) -> None:
        if self.progress:
            self.progress.begin(sum(self.expected.values()))

    def row(self, i) -> dict:
        return self.report.profile.setdefault(self.names.get(i, self.refs[i].label), profile.empty())

    def constructed(self, pool, i, name, dtypes) -> None:
        """Backend i's name and dtypes: its jobs to the pool, or a refusal (a taken name)."""
        ref = self.refs[i]
        if name in self.names.values() or (name in self.taken and not (ref.builtin and name == ref.label)):
            self.backend_error(i, f"reports the name {name!r}, which another backend has taken", kind=UsageRefusal)
            pool.refuse(i)
            if self.usage_stops:
                self.stopped = True
                pool.stop()
            return
        self.names[i] = name
        dtypes = chosen_dtypes(dtypes, self.only)
        if not dtypes:
            self.report.notes.append(f"{name}: runs none of the dtypes asked for ({', '.join(self.only)})")
        self._grow(i, len(dtypes) * len(self.cases) - self.expected[i])
        pool.give(i, self.jobs(i, dtypes))

    def jobs(self, i, dtypes) -> list:
        """Backend i's jobs: ((dtype, the case it is judged against), request frame, reply limit);
        the cases not run in a dtype (untestable, or skipped by the expectations) are recorded."""

        restep = reference_steps(self.refs[i])
        judged = {c.name: at_steps(c, restep(c.config.ode_steps)) if restep and c.kind.restepable else c for c in self.cases}
        out = []
        for d in dtypes:
            for c in self.cases:
                skipped = not_run(self.names[i], d, c, judged[c.name], self.expectations)
                if skipped is not None:
                    self.record(None, i, skipped)  # reported, not run
                else:
                    if (id(c), d) not in self.requests:
                        self.requests[id(c), d] = request_frame(c, d)
                    out.append(((d, judged[c.name]), self.requests[id(c), d], reply_limit(judged[c.name])))
        return out

    def worker_started(self, i, timings, seconds) -> None:
        r = self.row(i)
        self.spawned.setdefault(i, time.perf_counter() - seconds)
        r["workers"] += 1
        r["import"] += timings.get("import", 0.0)
        r["construction"] += timings.get("construction", 0.0)
        r["start"] += max(0.0, seconds - timings.get("import", 0.0) - timings.get("construction", 0.0))

    def result(self, pool, i, job, reply, arrays, seconds) -> None:
        """A job's reply judged against its case, with its profile, and recorded."""

        dtype, case = job
        start = time.perf_counter()
        r = judge(CaseResult(self.names[i], dtype, case.name, "passed"), case, reply, arrays, self.float64_bound)
        r.seconds = seconds
        worker = reply.get("profile", {})
        compilation = worker.get("compilation", 0.0)
        r.profile = {"compilation": compilation, "run": max(0.0, worker.get("seconds", seconds) - compilation),
                     "transfer": max(0.0, seconds - worker.get("seconds", seconds)),
                     "comparison": time.perf_counter() - start,
                     **{k: worker.get(k, 0) for k in ("jax_trace", "jax_lower", "jax_xla", "programs", "cache_hits",
                                                      "exports", "sessions")}}
        profile.add_case(self.row(i), r.profile)
        self.row(i)["wall"] = time.perf_counter() - self.spawned.get(i, self.began)
        self.record(pool, i, r)

    def record(self, pool, i, r: CaseResult) -> None:
        """r into the report and the progress; with a pool, what r means for the jobs still queued:
        a failure in a first_failure dtype drops the rest of that dtype, a pass in the gate dtype
        that case in the first_failure dtypes, and a failure under fail_fast stops the run."""
        self.report.results.append(expected_outcome(r, self.by_name[r.case], self.expectations, self.xfail))
        self.done[i] += 1
        if self.progress:
            self.progress.advance(f"{r.backend}/{r.dtype}", busy_note(r.profile))
            self.finished_if_done(i)
        if pool is None:
            return
        dropped = 0
        if r.status == "failed" and r.dtype in self.first_failure:
            dropped = pool.drop(i, lambda job: job[0] == r.dtype)
        if r.status == "passed" and r.dtype == self.gate:
            dropped = pool.drop(i, lambda job: job[0] in self.first_failure and job[1].name == r.case)
        if dropped:
            self._grow(i, -dropped)
            if self.progress:
                self.finished_if_done(i)
        if self.fail_fast and r.failed:
            self.stopped = True
            pool.stop()

    def _grow(self, i, n: int) -> None:
        """Backend i's expected results change by n."""
        self.expected[i] += n
        if self.progress and n:
            self.progress.grow(n)

    def finished_if_done(self, i) -> None:
        if self.done[i] == self.expected[i]:
            mine = [x for x in self.report.results if x.backend == self.names[i]]
            counts = {st: sum(x.status == st for x in mine) for st in STATUSES}
            self.progress.finished(self.names[i], counts, self.row(i)["wall"], "")

    def backend_error(self, i, message, tb="", kind=BackendError) -> None:
        """Backend i runs nothing (more): its error (of kind: BackendError or UsageRefusal), and its
        share leaves the progress total."""
        self.report.errors.append(kind(self.refs[i].label, message, tb))
        if self.progress:
            self.progress.grow(self.done[i] - self.expected[i])
            if kind is not UsageRefusal:  # the command says that one itself, as a usage error
                self.progress.finished(self.names.get(i, self.refs[i].label), {},
                                       time.perf_counter() - self.spawned.get(i, self.began), message)
        self.expected[i] = self.done[i]

    def report_(self) -> Report:
        """The report, its results in the order of the backends, dtypes and cases."""
        report = self.report
        report.wall = time.perf_counter() - self.began
        report.refs = {name: self.refs[i] for i, name in self.names.items()}
        ran = {r.backend for r in report.results if r.status != "skipped"}  # untestable: not refused by supports()
        for i, name in self.names.items():
            if name not in ran and not self.stopped and self.expected[i]:
                report.errors.append(BackendError(self.refs[i].label, f"ran no case: {_why_none(report.results, name)}"))
        if self.only is not None and not report.results and not report.errors:
            report.errors.append(BackendError("dtypes", f"no backend runs any of the dtypes asked for ({', '.join(self.only)})"))
        order = {n: i for i, n in self.names.items()}
        case_order = {c.name: i for i, c in enumerate(self.cases)}
        dtype_order = {d: i for i, d in enumerate(DTYPES)}
        report.results.sort(key=lambda r: (order[r.backend], dtype_order[r.dtype], case_order[r.case]))
        return report


def _why_none(results, name: str) -> str:
    """Why a backend ran no case: its supports(), an expectations file's skips (their results'
    messages begin 'not run: '), or both."""
    mine = [r for r in results if r.backend == name]
    listed = sum(r.message.startswith("not run: ") for r in mine)
    if not listed:
        return "supports() refused every one"
    if listed == len(mine):
        return "the expectations file skips every selected case"
    return f"supports() refused {len(mine) - listed} and the expectations file skips the other {listed}"

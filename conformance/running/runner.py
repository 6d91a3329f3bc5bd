"""Run cases on backends, compare with the goldens, report where a backend diverges first.

Each (backend, dtype, case) yields a CaseResult. The comparison checks, in order: the output's
dtype, its shape, finiteness, then every quantity the backend provides (step_0 = z(0), which is
x, f0, step_1 .. step_n, z1) against its tolerance. The first quantity over tolerance is the divergence reported: a
failure at f0 points at ODEFunc, a failure first at step k points at the solver or at error
growth over steps.

run_suite runs every backend in worker processes (conformance.running.pool, conformance.running.worker) and
compares in this process; run_case runs one backend object in this process (for a backend
under development, and for the tests of the comparison itself).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..cases import Case, at_steps
from ..cases.half import HALF_DTYPES, cast, check_dtypes
from ..cases.tolerance import half_tolerance, relative_error, tolerance
from .expectations import apply as apply_expectation
from .frames import encode
from .worker import attempt

STATUSES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "untestable")  # untestable: not run (case.untestable)
FAILING = ("failed", "error", "xpassed")


@dataclass
class QuantityResult:
    quantity: str
    error: float
    tolerance: float

    @property
    def ratio(self) -> float:
        return self.error / self.tolerance


@dataclass
class CaseResult:
    backend: str
    dtype: str
    case: str
    status: str  # one of STATUSES
    message: str = ""
    worst_ratio: float = 0.0  # max error / tolerance over the quantities checked
    quantities: list = field(default_factory=list)
    seconds: float = 0.0
    traceback: str = ""
    profile: dict = field(default_factory=dict)  # run_suite's: phase -> seconds, counter -> count (conformance.running.profile)

    @property
    def failed(self) -> bool:
        return self.status in FAILING


@dataclass
class BackendError:
    """A backend that could not run at all: not constructible, a taken name, a broken import."""

    backend: str
    message: str
    traceback: str = ""


@dataclass
class UsageRefusal(BackendError):
    """A backend refused for how the run was asked, not for a fault of its own: a plug-in that
    reports a name another backend has (a built-in's). The command reports it as a usage error
    (one line, exit 2), not as a failure of the run."""


@dataclass
class Report:
    results: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # BackendError
    notes: list = field(default_factory=list)  # str: backends not installed
    warnings: list = field(default_factory=list)  # str: lines after the table (an expectation that selected nothing)
    profile: dict = field(default_factory=dict)  # backend -> phases and counters (conformance.running.profile.empty)
    wall: float = 0.0  # run_suite's seconds, start to end
    refs: dict = field(default_factory=dict)  # the name each backend reported -> its BackendRef
    triage: dict = field(default_factory=dict)  # (backend, dtype, divergence) -> what triage.triage found

    @property
    def exit_code(self) -> int:
        """0: everything passed; 1: any failure, error or unexpected pass."""
        return 1 if self.errors or any(r.failed for r in self.results) else 0


def _step_time(case: Case, quantity: str) -> str:
    if quantity == "step_0":
        return f" (t = 0/{case.config.ode_steps}: z(0), which is x, the input)"
    if quantity.startswith("step_"):
        return f" (t = {int(quantity[5:])}/{case.config.ode_steps})"
    if quantity.startswith("decode_"):
        return f" (token {case.prompt + int(quantity[7:]) - 1}, decoded with the cache)"
    if quantity == "z" and case.kind == "encoder":
        return " (the encoder stack's output)"
    if quantity.startswith("grad."):
        return f" (the gradient of the parameter {quantity[5:]})"
    return ""


def compare(case: Case, dtype: str, outputs: dict, *, float64_bound: Optional[float] = None) -> tuple[str, str, list]:
    """(status, message, quantity results) for a backend's outputs: quantity -> array.

    float64_bound: in float64, also fail a quantity whose relative error exceeds this absolute
    bound (a port that claims float64 agreement to ~1e-14, say)."""
    golden = case.quantities()
    results = []
    for name, got in outputs.items():
        got = np.asarray(got)
        if str(got.dtype) != dtype:
            return "failed", f"{name}: expected dtype {dtype}; got {got.dtype}", results
        if got.shape != golden[name].shape:
            return "failed", f"{name}: expected shape {golden[name].shape}; got {got.shape}", results
        if not np.isfinite(got).all():
            return "failed", f"{name}: non-finite values (NaN or inf) at {np.argwhere(~np.isfinite(got))[0].tolist()}", results
        tol = half_tolerance(case.e_half(dtype)[name], dtype) if dtype in HALF_DTYPES else tolerance(case.e32_of(name), dtype)
        if float64_bound is not None and dtype == "float64":
            tol = min(tol, float64_bound)
        results.append(QuantityResult(name, relative_error(got, golden[name]), tol))
    bad = next((r for r in results if r.error > r.tolerance), None)
    if bad is None:
        return "passed", "", results
    where = "f0 = f(0, x), one evaluation of ODEFunc: the error is in f, not the solver" if bad.quantity == "f0" else (
        f"{bad.quantity}{_step_time(case, bad.quantity)}")
    if bad.quantity == "z1" and "f0" not in outputs:  # the block alone: the optional methods would say more
        where += (" (only z(1) was compared: an adapter's optional run_func and run_trajectory would show whether f "
                  "or which step diverges first)")
    return "failed", (f"diverges first at {where}: relative error {bad.error:.2e} > tolerance "
                      f"{bad.tolerance:.2e} ({bad.ratio:.0f}x)"), results


def judge(result: CaseResult, case: Case, reply: dict, outputs: dict, float64_bound=None) -> CaseResult:
    """Fill result from a backend's reply ({"status": ran|skipped|error, ...}) and outputs."""
    status = reply.get("status")
    if status == "skipped":
        result.status, result.message = "skipped", reply.get("message", "")
    elif status == "ran":
        try:
            result.status, result.message, result.quantities = compare(
                case, result.dtype, case.split_outputs(outputs), float64_bound=float64_bound)
        except ValueError as err:
            result.status, result.message = "error", str(err)
    else:
        result.status, result.message = "error", reply.get("message", "error")
        result.traceback = reply.get("traceback", "")
    result.worst_ratio = max((q.ratio for q in result.quantities), default=0.0)
    return result


def attempt_case(backend, case: Case, dtype: str) -> tuple[dict, dict]:
    """(reply, outputs) of one case on one backend object in this process, its inputs cast to
    dtype (worker.attempt's); the backend's exception is an error reply, reported, not raised."""
    import traceback

    try:
        params = {k: cast(v, dtype) for k, v in case.params.items()}
        return attempt(backend, case.config, params, cast(case.x, dtype), case.padding_mask, dtype, **case.inputs(dtype))
    except Exception as err:  # a backend's crash is its result
        return {"status": "error", "message": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}, {}


def run_case(backend, case: Case, dtype: str, *, float64_bound=None) -> CaseResult:
    """Run one case on one backend object in this process (no isolation)."""
    start = time.perf_counter()
    result = CaseResult(backend.name, dtype, case.name, "passed")
    if untestable(result, case) is not None:
        return result
    reply, outputs = attempt_case(backend, case, dtype)
    judge(result, case, reply, outputs, float64_bound)
    result.seconds = time.perf_counter() - start
    return result


def untestable(result: CaseResult, case: Case) -> Optional[CaseResult]:
    """result marked untestable, with the reason, if its case has no meaning in its dtype (a half
    dtype: case.untestable); None otherwise. An untestable case is not run."""
    reason = case.untestable(result.dtype) if result.dtype in HALF_DTYPES else None
    if reason is None:
        return None
    result.status, result.message = "untestable", reason
    return result


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


def apply_xfail(result: CaseResult, patterns) -> CaseResult:
    """A failure matching 'backend/dtype/case' becomes xfailed, a pass xpassed (a failure too)."""
    if any(p.search(f"{result.backend}/{result.dtype}/{result.case}") for p in patterns):
        if result.status in ("failed", "error"):
            result.status = "xfailed"
        elif result.status == "passed":
            result.status = "xpassed"
            result.message = "unexpected pass: the case matches an xfail pattern but passed"
    return result


def request_frame(case: Case, dtype: str, stages: bool = False) -> bytes:
    """The run request for a case in a dtype, encoded (frames.encode): the same for every backend.
    stages: the request for f(0, x)'s stage values instead (triage.py), its inputs alone."""
    arrays = {"x": cast(case.x, dtype), **{f"param/{k}": cast(v, dtype) for k, v in case.params.items()}}
    if case.padding_mask is not None:
        arrays["padding_mask"] = case.padding_mask
    if stages:
        return encode({"op": "run", "case": case.name, "dtype": dtype, "config": case.config.to_dict(), "stages": True}, arrays)
    inputs = case.inputs(dtype)
    if inputs["z1_bar"] is not None:
        arrays["z1_bar"] = inputs["z1_bar"]
    return encode({"op": "run", "case": case.name, "dtype": dtype, "config": case.config.to_dict(), "decoded": inputs["decoded"],
                   "vjp": inputs["z1_bar"] is not None, "encoder": inputs["encoder"]}, arrays)


def reply_limit(case: Case) -> int:
    """The most bytes a correct reply for case can take: f0, the trajectory and z1 in float64 (a
    grad case's every parameter gradient too), twice over, plus 1 MB for the message (a
    traceback). A larger announced reply is refused."""
    b, t, d = case.x.shape
    grads = sum(p.size for p in case.params.values()) if case.kind == "grad" else 0
    return 2 * 8 * (b * t * d * (case.reply_states() + 3) + grads) + (1 << 20)


def busy_note(profile: dict) -> str:
    """What a result's backend was busy with, for the progress: 'JAX compiling' when its case
    compiled XLA programs (not all read from JAX's persistent cache), else ""."""
    return "JAX compiling" if profile.get("programs", 0) > profile.get("cache_hits", 0) else ""


def run_suite(refs, cases, *, xfail=(), fail_fast=False, jobs=None, timeout=120.0, float64_bound=None,
              progress=None, taken=(), dtypes=None, first_failure=(), gate=None, init_timeout=None,
              expectations=None, usage_stops=False) -> Report:
    """Every case on every backend (odeattn.conformance.adapters.BackendRef) in every dtype it declares,
    each backend in worker processes of its own (those whose refs have shares_process: shared among them),
    at most `jobs` (default: the core count) at once.

    dtypes: only these of the dtypes each backend declares (None: all; ValueError for one not in
    half.DTYPES). first_failure: dtypes in which a backend stops at its first failed case, the
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
    from .pool import BackendFailed, Constructed, Pool, Result, WorkerStarted, core_count

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
        from .expectations import Expectations

        self.refs, self.cases, self.xfail, self.only, self.progress = refs, cases, xfail, only, progress
        self.expectations = expectations if expectations is not None else Expectations()
        self.fail_fast, self.taken, self.first_failure, self.gate = fail_fast, taken, first_failure, gate
        self.float64_bound, self.usage_stops = float64_bound, usage_stops
        self.report = Report()
        self.names = {}  # backend index -> the name it reported
        self.expected = {i: len(self.chosen(ref.dtypes) if ref.dtypes else ("?",)) * len(cases) for i, ref in enumerate(refs)}
        self.done = {i: 0 for i in range(len(refs))}
        self.began = time.perf_counter()
        self.spawned = {}  # backend index -> when its first worker was spawned
        self.requests = {}  # (id of a case of self.cases, dtype) -> its request frame, encoded once for every backend
        self.by_name = {c.name: c for c in cases}
        self.stopped = False

    def chosen(self, declared) -> list:
        return [d for d in declared if self.only is None or d in self.only]

    def begin(self) -> None:
        if self.progress:
            self.progress.begin(sum(self.expected.values()))

    def row(self, i) -> dict:
        from . import profile as P

        return self.report.profile.setdefault(self.names.get(i, self.refs[i].label), P.empty())

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
        dtypes = self.chosen(dtypes)
        if not dtypes:
            self.report.notes.append(f"{name}: runs none of the dtypes asked for ({', '.join(self.only)})")
        self._grow(i, len(dtypes) * len(self.cases) - self.expected[i])
        pool.give(i, self.jobs(i, dtypes))

    def jobs(self, i, dtypes) -> list:
        """Backend i's jobs: ((dtype, the case it is judged against), request frame, reply limit);
        the cases untestable in a dtype are recorded, not run."""
        from ..adapters import reference_steps

        restep = reference_steps(self.refs[i])
        judged = {c.name: at_steps(c, restep(c.config.ode_steps)) if restep and c.kind == "block" else c for c in self.cases}
        out = []
        for d in dtypes:
            for c in self.cases:
                skipped = untestable(CaseResult(self.names[i], d, c.name, "passed"), judged[c.name])
                expected = self.expectations.skip(self.names[i], d, case=c.name, kind=c.kind, config=c.config)
                if skipped is None and expected is not None:
                    skipped = CaseResult(self.names[i], d, c.name, "skipped", f"not run: {expected.label}")
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
        from . import profile as P

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
        P.add_case(self.row(i), r.profile)
        self.row(i)["wall"] = time.perf_counter() - self.spawned.get(i, self.began)
        self.record(pool, i, r)

    def record(self, pool, i, r: CaseResult) -> None:
        """r into the report and the progress; with a pool, what r means for the jobs still queued:
        a failure in a first_failure dtype drops the rest of that dtype, a pass in the gate dtype
        that case in the first_failure dtypes, and a failure under fail_fast stops the run."""
        case = self.by_name[r.case]
        judged = r.status in ("passed", "failed", "error")  # a skip is no use of an xfail line: it stays unnamed otherwise
        expected = self.expectations.xfail(r.backend, r.dtype, case=r.case, kind=case.kind, config=case.config) if judged else None
        self.report.results.append(apply_xfail(apply_expectation(r, expected), self.xfail))
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
        dtype_order = {d: i for i, d in enumerate(("float32", "float64", "bfloat16", "float16"))}
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

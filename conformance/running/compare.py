"""The results of running cases and the comparison that judges them against the goldens.

Each (backend, dtype, case) yields a CaseResult. The comparison checks, in order: the output's
dtype, its shape, finiteness, then every quantity the backend provides (step_0 = z(0), which is
x, f0, step_1 .. step_n, z1) against its tolerance (tolerance.quantity_tolerance). The first
quantity over tolerance is the divergence reported: a failure at f0 points at ODEFunc, a failure
first at step k points at the solver or at error growth over steps.

run_case runs one backend object in this process and judges it (for a backend under
development, and for the tests of the comparison itself); runner.run_suite runs every backend in
worker processes and judges their replies here (judge).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ode_ref.precision import HALF_DTYPES

from ..cases import Case
from ..cases.half import cast
from ..cases.tolerance import quantity_tolerance, relative_error
from .requests import reply_limit, request_frame
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
    artifacts: list = field(default_factory=list)  # each file the case ran, as its runtime got it (wire/counters.ARTIFACTS)

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
        e_half = case.e_half(dtype)[name] if dtype in HALF_DTYPES else None  # the case stores it in a half dtype
        tol = quantity_tolerance(dtype, case.e32_of(name), e_half, float64_bound)
        results.append(QuantityResult(name, relative_error(got, golden[name]), tol))
    bad = next((r for r in results if r.error > r.tolerance), None)
    if bad is None:
        return "passed", "", results
    return "failed", (f"diverges first at {case.kind.where(case, bad.quantity, outputs)}: relative error {bad.error:.2e} > tolerance "
                      f"{bad.tolerance:.2e} ({bad.ratio:.0f}x)"), results


def judge(result: CaseResult, case: Case, reply: dict, outputs: dict, float64_bound=None) -> CaseResult:
    """Fill result from a backend's reply ({"status": ran|skipped|error, ...}) and outputs."""
    status, result.artifacts = reply.get("status"), reply.get("artifacts", [])
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
        arrays = {k: cast(v, dtype) for k, v in case.kind.request_arrays(case).items()}
        return attempt(backend, case.kind, case.config, params, cast(case.x, dtype), case.padding_mask, dtype,
                       case.kind.request_fields(case), arrays)
    except Exception as err:  # a backend's crash is its result
        return {"status": "error", "message": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}, {}


def run_case(backend, case: Case, dtype: str, *, float64_bound=None, fault: Optional[dict] = None,
             outputs: Optional[dict] = None) -> CaseResult:
    """Run one case on one backend and judge it: a client.RemoteAdapter in its worker, any other
    backend object in this process (no isolation); the backend's exception is its error result.
    The one way to run a single case: the fuzzer, the pytest plugin and the tests call it.
    fault: an error reply the backend gave already (its supports() failed), judged instead of
    running it. outputs: a dict that receives the backend's quantities (quantity -> array) when
    it ran. A case with no meaning in a half dtype is not run: status 'untestable'."""
    start = time.perf_counter()
    result = CaseResult(backend.name, dtype, case.name, "passed")
    if untestable(result, case) is not None:
        return result
    if fault is not None:
        reply, raw = fault, {}
    elif getattr(backend, "remote", False):
        reply, raw = backend.run_request(request_frame(case, dtype), reply_limit(case))
    else:
        reply, raw = attempt_case(backend, case, dtype)
    judge(result, case, reply, raw, float64_bound)
    if outputs is not None and result.status in ("passed", "failed"):
        outputs.update(case.split_outputs(raw))
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

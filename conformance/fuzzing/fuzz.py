"""`odeattn conformance fuzz`: drawn cases, judged live against the spec, shrunk when one fails.

For a backend and a dtype, hypothesis draws examples from draw.draws (configs, shapes, padding,
inputs); the spec computes each one's quantities and its own float32 error in the run
(draw.build), and the backend is judged by the golden set's comparison (runner.judge: f0, the
trajectory and z1, the decode steps, the gradient, whatever the adapter offers). The first
divergent example is shrunk by hypothesis toward the simplest one that still diverges; the
smallest is the finding, localised (localise.py) at its first divergent quantity and, where the
adapter returns the stage values of f (stages.py), at the first divergent stage.

The adapter runs in this process: the command constructs it once (adapters.make_adapter) and
every example calls it directly, so a draw costs no process start or transfer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException
from threadpoolctl import threadpool_limits

from ode_ref.precision import HALF_DTYPES

from ..cases import Case
from .draw import KINDS, Draw, build, draws, reject
from ..cases.half import NO_POLICY
from .localise import localise
from ..running.runner import CaseResult, attempt_case, judge, untestable
from ..running.worker import unsupported

DEFAULT_EXAMPLES = 100  # per backend and dtype: docs/fuzzing.md gives what it costs
SHRINK_SECONDS = 60.0  # shrinking stops improving after this, keeping the smallest failure so far


class Diverged(AssertionError):
    """Raised inside the hypothesis test for a failing example, so that hypothesis shrinks it."""


@dataclass
class Finding:
    """The smallest divergent example found, and where it was first found."""

    draw: Draw
    case: Case
    result: CaseResult
    outputs: dict  # quantity -> the backend's array
    first: Draw  # the example that failed first, before shrinking
    quantity: str = ""
    localisation: dict = field(default_factory=dict)
    stage: Optional[dict] = None  # stages.first_divergent_stage's, where the adapter has run_stages
    repro: str = ""  # the folder written (repro.write_repro)


@dataclass
class FuzzRun:
    backend: str
    dtype: str
    examples: int = 0  # examples the backend ran, shrinking included
    skipped: int = 0  # draws the backend does not support (supports() or a missing method)
    unfair: int = 0  # draws with no fair input (fair.py), redrawn by hypothesis
    worst_ratio: float = 0.0  # the largest err/tol of a passing example
    seconds: float = 0.0
    finding: Optional[Finding] = None
    shrinks: int = 0  # failing examples seen while shrinking
    unrun: int = 0  # draws passed unrun once the time budget was spent

    @property
    def diverged(self) -> bool:
        return self.finding is not None


def kinds_of(adapter) -> tuple:
    """The kinds of example an adapter can run: block always; decode and grad where it has the method."""
    have = {"block": True, "decode": getattr(adapter, "run_decode", None) is not None,
            "grad": getattr(adapter, "run_vjp", None) is not None}
    return tuple(k for k in KINDS if have[k])


def refused(adapter, d: Draw, dtype: str) -> bool:
    """Whether a draw is not run, known before its case is built: the adapter does not support it,
    or it is a grad draw in a half dtype, which has no meaning there whatever its input (half.NO_POLICY)."""
    return unsupported(adapter, d.config, dtype, d.decoded, d.kind == "grad") is not None or (
        dtype in HALF_DTYPES and d.kind in NO_POLICY)


def run_one(adapter, case: Case, dtype: str) -> tuple[CaseResult, dict]:
    """(result, quantity -> the backend's array) of one case on an adapter in this process; the
    backend's exception is its error result, as in runner.run_case. A draw with no meaning in a
    half dtype (the half policy's rules, runner.untestable) is not run: status 'untestable'."""
    result = CaseResult(adapter.name, dtype, case.name, "passed")
    outputs = {}
    if untestable(result, case) is not None:
        return result, outputs
    start = time.perf_counter()
    reply, raw = attempt_case(adapter, case, dtype)
    judge(result, case, reply, raw)
    if result.status in ("passed", "failed"):
        outputs = case.split_outputs(raw)
    result.seconds = time.perf_counter() - start
    return result, outputs


def first_divergent(result: CaseResult) -> str:
    """The first quantity over its tolerance, or '' (an error, a wrong dtype or shape)."""
    return next((q.quantity for q in result.quantities if q.error > q.tolerance), "")


def explain(finding: Finding, adapter, dtype: str) -> Finding:
    """finding with its quantity, its localisation and, where the adapter has run_stages, the
    first divergent stage of f (stages.py)."""
    from .stages import first_divergent_stage

    q = first_divergent(finding.result)
    finding.quantity = q
    if q:
        want = finding.case.quantities()[q]
        tol = next(r.tolerance for r in finding.result.quantities if r.quantity == q)
        finding.localisation = localise(q, finding.outputs[q], want, tol, prompt=finding.case.prompt)
    if finding.case.kind == "block" and getattr(adapter, "run_stages", None) is not None:
        finding.stage = first_divergent_stage(adapter, finding.case, dtype)
    return finding


def fuzz(adapter, dtype: str, *, examples: int = DEFAULT_EXAMPLES, seed: int = 0, time_budget: Optional[float] = None,
         shrink_seconds: float = SHRINK_SECONDS, kinds: Optional[tuple] = None, strategy=None,
         params: Optional[dict] = None) -> FuzzRun:
    """Draw up to `examples` examples (fewer once time_budget seconds have passed) for one adapter
    in one dtype; shrink the first divergent one. The same seed draws the same examples.
    strategy and params: a model file's (draw.fixed_draws, its weights) in place of drawn configs."""
    run = FuzzRun(adapter.name, dtype)
    kinds = kinds or kinds_of(adapter)
    start = time.perf_counter()
    state = {"shrink_start": None}

    @settings(max_examples=examples, database=None, deadline=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))
    @hypothesis_seed(seed)
    @given(d=strategy if strategy is not None else draws(kinds))
    def probe(d):
        now = time.perf_counter()
        if run.finding is None and time_budget is not None and now - start > time_budget:
            run.unrun += 1
            return  # the budget is spent: the remaining draws pass unrun
        if state["shrink_start"] is not None and now - state["shrink_start"] > shrink_seconds:
            return  # shrinking has had its time: the smallest failure so far stands
        if refused(adapter, d, dtype):
            run.skipped += 1  # asked before the spec builds the case: a refused draw costs nothing
            reject(None)
        case = build(d, dtype, name=f"fuzz_{d.kind}", params=params)
        if case is None:
            run.unfair += 1
            reject(None)
        result, outputs = run_one(adapter, case, dtype)
        if result.status in ("skipped", "untestable"):
            run.skipped += 1  # not supported, or no meaning in this half dtype: not an example
            reject(None)
        run.examples += 1
        if not result.failed:
            run.worst_ratio = max(run.worst_ratio, result.worst_ratio)
            return
        if run.finding is None:
            state["shrink_start"] = time.perf_counter()
            run.finding = Finding(d, case, result, outputs, first=d)
        elif d.size() <= run.finding.draw.size():
            run.finding = Finding(d, case, result, outputs, first=run.finding.first)
            run.shrinks += 1
        raise Diverged(result.message)

    try:
        with threadpool_limits(1):  # a draw's arrays are small: threads only contend (NumPy's BLAS; OpenMP's: torch's, MKL's)
            probe()
    except Exception as err:
        if run.finding is None and not isinstance(err, HypothesisException):
            raise  # not the backend's divergence (those are recorded before raising): a bug here
        # with a finding: it is recorded; hypothesis's own report (its final replay) adds nothing.
        # Unsatisfiable (every draw skipped or unfair) leaves run.examples at 0, which the caller reports
    run.seconds = time.perf_counter() - start
    if run.finding is not None:
        explain(run.finding, adapter, dtype)
    return run

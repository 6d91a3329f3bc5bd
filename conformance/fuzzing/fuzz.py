"""`odeattn conformance fuzz`: drawn cases, judged live against the spec, shrunk when one fails.

For a backend and a dtype, one example is drawn in each row of a covering array over the draw
space's factors (cover.py: every pair of two factors' levels), then hypothesis draws the rest of
the examples from draw.draws (configs, shapes, padding, inputs), each dtype its own, each example
judged once. The spec computes each one's quantities and its own float32 error in the run
(draw.build), and the backend is judged by the golden set's comparison (compare.judge: f0, the
trajectory and z1, the decode steps, the gradient, whatever the adapter offers). The first
divergent example is shrunk by hypothesis toward the simplest one that still diverges, then its
sizes, config fields and input choices each to the simplest that still diverges (essence.py);
the result is the finding, localised (cases/localise.py) at its first divergent
quantity (a decode finding at its token and cache slot, a grad finding at its gradient) and, where
the adapter returns the stage values of f (stages.py), at the first divergent stage.

The command and the pytest plugin run the backend in a worker process of its own
(running/client.RemoteAdapter), each request within a timeout: a port that raises, exits, hangs or
crashes its process gives an error result, never the command's traceback, exit or hang. A worker
lost (a timeout, a crash) ends the run at that example, unshrunk: every further try would cost
the timeout or a fresh worker. An adapter object given directly runs in this process.

The draws keep within the adapter's declared support (adapters/support.py); a draw it refuses
anyway, or with no fair input, is counted under its reason (FuzzRun.refusals), and a run that
judges fewer examples than its minimum is short (FuzzRun.short: not a pass). With a database
folder (database.py), the failing examples of earlier runs are judged first.
"""

from __future__ import annotations

import contextlib

import time
import unittest
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException
from threadpoolctl import threadpool_limits

from ode_ref.precision import HALF_DTYPES

from ..cases import Case
from ..cases.kinds import ENCODER, kind_of
from .database import CountingDatabase, RowDatabase, scratch_home
from .cover import allowed, cell, covering_array, levels_of, pairs_of, relaxed
from .draw import DRAWN_KINDS, FUZZED_KINDS, Draw, build, describe_input, describe_padding, draws, reject
from .encoder_draw import encoder_draws
from .essence import Essence, essential
from ..adapters.support import support_of
from ..cases.localise import first_at, localise
from ..running.client import BackendFault
from ..running.compare import CaseResult, run_case
from ..running.worker import unsupported
from .stages import first_divergent_stage
from ..running.expectations import Expectations

CELL_DRAWS = 6  # a covering array cell's draws before it is given up (no fair input, or refused): each up to REDRAWS inputs
DEFAULT_EXAMPLES = 100  # per backend and dtype: docs/fuzzing.md gives what it costs
DEFAULT_ENCODER_EXAMPLES = 10  # the encoder stack's, per backend that runs it, in float32 and float64 (encoder_draw.py)
ENCODER_STACK, ENCODER_SUFFIX = "encoder stack", "-encoder"  # its run's drew; its repro folder's and database's suffix
NO_FAIR_INPUT = "no fair input"  # a refused draw's reason: fair.py found none in draw.REDRAWS tries
NO_FINITE_REFERENCE = "no finite reference: the spec's output or its float32 error is not finite with these weights"
SHRINK_SECONDS = 60.0  # shrinking stops improving after this, keeping the smallest failure so far


class Diverged(AssertionError):
    """Raised inside the hypothesis test for a failing example, so that hypothesis shrinks it."""


class _Stop(BaseException):
    """Raised inside the hypothesis test to end the run at once (the time budget or shrinking's
    time spent, or the worker lost): a BaseException, so that hypothesis neither shrinks nor
    replays it, and fuzz() catches it."""


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
    first_at: dict = field(default_factory=dict)  # localise.first_at's: a decode finding's token, a grad finding's gradient
    essence: Optional[Essence] = None  # the resets to the simplest values tried after shrinking (essence.py)
    repro: str = ""  # the folder written (repro.write_repro)
    lost: str = ""  # why the worker was lost on it (timed out, killed by a signal, ...): not shrunk


def judgement(d: Draw, case: Case, result) -> dict:
    """One judged example as a report lists it (fuzz_report.write_json's runs[].judged): what a
    deployer reads beside an artifact, each input drawn and how near its tolerance it came."""
    return {"kind": d.kind.name, "shape": list(case.x.shape), "padding": describe_padding(d), "input": describe_input(d),
            "status": result.status, "worst_ratio": result.worst_ratio}


@dataclass
class FuzzRun:
    backend: str
    dtype: str
    examples: int = 0  # examples the backend ran, shrinking included (the essence's resets not: Finding.essence.tries)
    skipped: int = 0  # draws not supported (its declared support, supports(), a missing method, its refusal)
    unfair: int = 0  # draws with no fair input (fair.py), redrawn by hypothesis
    worst_ratio: float = 0.0  # the largest err/tol of a passing example
    seconds: float = 0.0
    finding: Optional[Finding] = None
    shrinks: int = 0  # failing examples seen while shrinking
    unrun: int = 0  # draws left unrun when the time budget was spent (the run stops there: 0 or 1)
    asked: int = 0  # the examples asked for
    minimum: int = 0  # the fewest examples judged that make a pass; fewer is a shortfall
    draws: int = 0  # draws hypothesis made, refused ones included
    refusals: dict = field(default_factory=dict)  # reason -> draws refused for it (skipped and unfair, by reason)
    replayed: int = 0  # examples judged first from the database: failures an earlier run kept
    expected: dict = field(default_factory=dict)  # an xfail expectation's label -> [examples failed, examples passed]
    cells: int = 0  # rows of the covering array searched (cover.py), each for one example
    repeats: int = 0  # draws building an example judged before in the run, redrawn: each example is judged once
    held: set = field(default_factory=set)  # the pairs of factor levels (cover.py) the judged examples lie in, shrink tries too
    judged: list = field(default_factory=list)  # each example judged, in order (as examples counts them): judgement()
    kept: Optional[frozenset] = None  # the factor levels its declared support allows (cover.allowed), None: all
    drew: str = "attention block"  # what its draws are: the attention block's kinds, or ENCODER_STACK (encoder_draw.py)
    found_in: str = ""  # where the first divergent example was drawn: "row i" of the covering array, "random",
    # "database" (kept by an earlier run's random draws), "database, row i" (by its row i)

    @property
    def suffix(self) -> str:
        """ENCODER_SUFFIX for the encoder stack's run (its repro folder's), else ''."""
        return ENCODER_SUFFIX if self.drew == ENCODER_STACK else ""

    @property
    def search(self) -> str:
        """' (encoder stack)' for the encoder stack's run, as its lines name it after 'backend/dtype'; else ''."""
        return f" ({ENCODER_STACK})" if self.suffix else ""

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.dtype}{self.search}"

    @property
    def failed(self) -> bool:
        """Not a pass: a divergence, a shortfall, or an xfail expectation none of whose examples failed."""
        return self.diverged or self.short or bool(self.unexpected)

    @property
    def unexpected(self) -> list[str]:
        """The xfail expectations that selected examples of which none failed: unexpected passes."""
        return [label for label, (failed, passed) in self.expected.items() if passed and not failed]

    @property
    def diverged(self) -> bool:
        return self.finding is not None

    @property
    def short(self) -> bool:
        """Fewer examples judged than the minimum, with no divergence and no time budget spent:
        hypothesis stopped drawing (too many draws refused), which is not a pass."""
        return self.finding is None and not self.unrun and self.examples < self.minimum

    def refuse(self, reason: str) -> None:
        """Count a draw that is not an example, under its reason (NO_FAIR_INPUT, NO_FINITE_REFERENCE:
        its input; or why not supported)."""
        if reason in (NO_FAIR_INPUT, NO_FINITE_REFERENCE):
            self.unfair += 1
        else:
            self.skipped += 1
        self.refusals[reason] = self.refusals.get(reason, 0) + 1


def dtype_seed(seed: int, dtype: str, share: bool = False) -> int:
    """The hypothesis seed of a run in one dtype: the same seed draws other examples in each dtype
    (float32 the seed's own, another dtype's a 32-bit hash of the two, far from any small seed),
    unless share (the same examples in every dtype)."""
    return seed if share or dtype == "float32" else zlib.crc32(f"{dtype}:{seed}".encode()) + 2**32


def encoder_search(adapter, dtype: str, asked: Optional[int] = None, min_examples: Optional[int] = None):
    """(examples, the fewest judged that pass) of the encoder stack's search on adapter in dtype, or
    None where it has none: 0 asked, a half dtype (the encoder has no half-precision policy), or no
    run_encoder. asked None is the default, DEFAULT_ENCODER_EXAMPLES with any count judged passing
    (a port may refuse every encoder config); asked N counts a shortfall as --examples does, below
    min_examples where given."""
    examples = DEFAULT_ENCODER_EXAMPLES if asked is None else asked
    if examples == 0 or dtype in HALF_DTYPES or ENCODER.missing(adapter) is not None:
        return None
    return examples, 0 if asked is None else min(examples, min_examples or examples)


def kinds_of(adapter) -> tuple:
    """The kinds of example an adapter can run: those of DRAWN_KINDS whose method it has (block: always)."""
    return tuple(k for k in DRAWN_KINDS if k.missing(adapter) is None)


def refusal(adapter, d: Draw, dtype: str) -> Optional[str]:
    """Why a draw is not run, known before its case is built, or None: the adapter does not support
    it (worker.unsupported: its declared support first), or it is a grad draw in a half dtype, which
    has no meaning there whatever its input (its kind's no_policy)."""
    reason = unsupported(adapter, d.config, dtype, d.kind)
    if reason is None and dtype in HALF_DTYPES and d.kind.no_policy is not None:
        reason = f"no meaning in {dtype}: {d.kind.no_policy}"
    return reason


def fault_reply(err: Exception) -> dict:
    """The error reply of a backend's failure outside a case's run (its supports()): a worker's
    (client.BackendFault), or this one's, with its traceback."""
    import traceback

    if isinstance(err, BackendFault):
        return err.reply
    return {"status": "error", "message": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def first_divergent(result: CaseResult) -> str:
    """The first quantity over its tolerance, or '' (an error, a wrong dtype or shape)."""
    return next((q.quantity for q in result.quantities if q.error > q.tolerance), "")


def unjudgeable(case: Case, dtype: str) -> Optional[str]:
    """Why no backend can be judged on a case (a replayed folder's), or None: an input that is not
    finite, or a reference or tolerance of the spec's that is not (an input overflowing float64,
    or float32, whose error sets the tolerance). error > tolerance is then False, or True, whatever
    the backend gives, as a non-finite golden value would be (golden.py refuses those)."""
    inputs = {"x.npy": case.x, **{f"{k}.npy": v for k, v in case.inputs.items()},
              **{f"weights.safetensors ({k})": v for k, v in case.params.items()}}
    for name, a in inputs.items():
        if a is not None and not np.isfinite(a).all():
            at = np.argwhere(~np.isfinite(a))[0]
            return f"{name} holds {a[tuple(at)]} at {at.tolist()}; expected finite values"
    reach = f"x.npy's values reach {np.abs(case.x).max():.3g}"
    half = case.e_half(dtype) if dtype in HALF_DTYPES and case.untestable(dtype) is None else None
    for q, want in case.quantities().items():
        if not np.isfinite(want).all():
            return f"the spec's float64 {q} is not finite on this input ({reach}, beyond what float64 holds through the block)"
        e = half[q] if half is not None else 0.0 if dtype in HALF_DTYPES else case.e32_of(q)
        if not np.isfinite(e):
            dt = dtype if dtype in HALF_DTYPES else "float32"
            return (f"the spec's own {dt} error on {q} is {e} on this input ({reach}, beyond what {dt} holds), and "
                    "the tolerance derives from it")
    return None


def explain(finding: Finding, adapter, dtype: str) -> Finding:
    """finding with its quantity, its localisation, what it first diverges at (a decode finding's
    token and cache slot, a grad finding's gradient: localise.first_at) and, where the adapter has
    run_stages, the first divergent stage of f (stages.py). A grad finding is asked the stages too:
    they say whether the forward pass it differentiates agrees."""

    q = first_divergent(finding.result)
    finding.quantity = q
    if q:
        want = finding.case.quantities()[q]
        tol = next(r.tolerance for r in finding.result.quantities if r.quantity == q)
        finding.localisation = localise(q, finding.outputs[q], want, tol, prompt=finding.case.prompt)
        agree = [r.quantity for r in finding.result.quantities if r.error <= r.tolerance]
        finding.first_at = first_at(finding.case, q, agree)
    kind = finding.case.kind
    if (kind.stages or kind.backward) and getattr(adapter, "run_stages", None) is not None and not finding.lost:
        finding.stage = first_divergent_stage(adapter, finding.case, dtype)
    return finding


def _example(d: Draw, case: Case) -> tuple:
    """What makes an example: two draws that build the same one (an input seed and its redraw, a
    padding count past the prompt) are one."""
    mask = None if case.padding_mask is None else case.padding_mask.tobytes()
    return d.kind.name, d.config, d.batch, d.seq, d.decoded, d.param_seed, d.scale, d.offset, case.input_seed, mask


class Probe:
    """The hypothesis test's body: one draw, refused (counted by reason), judged, or raised as a
    divergence for hypothesis to shrink. database: the CountingDatabase the run replays, or None."""

    def __init__(self, run: FuzzRun, adapter, *, params, time_budget, shrink_seconds, database, expectations=None):
        self.run, self.adapter, self.params, self.database = run, adapter, params, database
        self.expectations = expectations if expectations is not None else Expectations()
        self.time_budget, self.shrink_seconds = time_budget, shrink_seconds
        self.start, self.shrink_start = time.perf_counter(), None
        self.limit, self.drawn = None, 0  # a search's most draws before a finding (a cell's: CELL_DRAWS), and its count
        self.judged = set()  # the examples judged so far (_example): a repeat before a finding is redrawn
        self.searching = ""  # the search under way (FuzzRun.found_in)

    def spent(self) -> bool:
        """Whether the time budget is spent (no finding yet): no further search starts."""
        return self.run.finding is None and self.time_budget is not None and time.perf_counter() - self.start > self.time_budget

    def __call__(self, d: Draw) -> None:
        run, now = self.run, time.perf_counter()
        replaying = self.database is not None and run.draws < self.database.fetched  # the reuse phase runs them first
        run.draws += 1
        self.drawn += 1
        if run.finding is None and self.limit is not None and self.drawn > self.limit:
            raise _Stop  # a cell none of whose draws was judged: the array goes on to the next
        if run.finding is None and self.time_budget is not None and now - self.start > self.time_budget:
            run.unrun += 1
            raise _Stop  # the budget is spent: hypothesis draws no more
        if self.shrink_start is not None and now - self.shrink_start > self.shrink_seconds:
            raise _Stop  # shrinking has had its time: the smallest failure so far stands
        skip = self.expectations.skip(run.backend, run.dtype, kind=d.kind, config=d.config)
        if skip is not None:  # before the backend is asked anything: what must not run may hang its supports() too
            self.refuse(f"not run: {skip.label}")
        try:
            reason, fault = refusal(self.adapter, d, run.dtype), None
        except Exception as err:  # supports() raised, answered garbage or hung: the backend's error, judged below
            reason, fault = None, fault_reply(err)
        if reason is not None:
            self.refuse(reason)  # asked before the spec builds the case: a refused draw costs nothing
        with np.errstate(over="ignore", invalid="ignore") if self.params is not None else contextlib.nullcontext():
            case = build(d, run.dtype, name=f"fuzz_{d.kind}", params=self.params)  # a file's weights may overflow: refused below
        if case is None:
            self.refuse(NO_FAIR_INPUT)
        if self.params is not None and unjudgeable(case, run.dtype) is not None:
            self.refuse(NO_FINITE_REFERENCE)  # a model file's weights beyond what the block holds: nothing to judge
        example = _example(d, case)
        if run.finding is None and example in self.judged:
            run.repeats += 1
            reject(None)  # judged already (two draws may build one example; hypothesis repeats in a small region)
        outputs = {}
        result = run_case(self.adapter, case, run.dtype, fault=fault, outputs=outputs)
        lost = getattr(self.adapter, "lost", "")
        if result.status in ("skipped", "untestable"):
            self.refuse(result.message)  # the backend's own refusal, or no meaning in this half dtype
        run.examples += 1
        run.judged.append(judgement(d, case, result))
        self.judged.add(example)
        if d.kind is not ENCODER:  # the covering array's factors are the block's
            run.held |= pairs_of(levels_of(d))
        if replaying and run.finding is None:
            run.replayed += 1
        xfail = self.expectations.xfail(run.backend, run.dtype, kind=d.kind, config=d.config)
        if xfail is not None:  # a known failure's region: counted, never a finding
            run.expected.setdefault(xfail.label, [0, 0])[0 if result.failed else 1] += 1
            return
        if not result.failed:
            run.worst_ratio = max(run.worst_ratio, result.worst_ratio)
            return
        if run.finding is None:
            self.shrink_start = time.perf_counter()
            run.finding, run.found_in = Finding(d, case, result, outputs, first=d, lost=lost), self.searching
        elif d.size() <= run.finding.draw.size() and (result.status, first_divergent(result)) == (
                run.finding.result.status, first_divergent(run.finding.result)):  # a smaller example of the same failure
            run.finding = Finding(d, case, result, outputs, first=run.finding.first, lost=lost)
            run.shrinks += 1
        if lost:
            raise _Stop  # each further try would cost the timeout or a fresh worker: the example stands
        raise Diverged(result.message)

    def retry(self, d: Draw) -> Optional[bool]:
        """essence.essential's still_fails: d judged as a draw is, True (d then the finding) where it
        fails as the finding does (a divergence, or an error), False where it passes, None where it
        is not judged (an expectation's region, a refusal, no fair input) or fails otherwise; _Stop
        where the worker is lost on it (the finding so far stands)."""
        run = self.run
        if any(region(run.backend, run.dtype, kind=d.kind, config=d.config) is not None
               for region in (self.expectations.skip, self.expectations.xfail)):
            return None
        try:
            if refusal(self.adapter, d, run.dtype) is not None:
                return None
        except Exception:  # supports() failing: no verdict on this reset
            return None
        with np.errstate(over="ignore", invalid="ignore") if self.params is not None else contextlib.nullcontext():
            case = build(d, run.dtype, name=f"fuzz_{d.kind}", params=self.params)
        if case is None or (self.params is not None and unjudgeable(case, run.dtype) is not None):
            return None
        outputs = {}
        result = run_case(self.adapter, case, run.dtype, outputs=outputs)  # counted in the essence's tries, not run.examples
        if getattr(self.adapter, "lost", ""):
            raise _Stop
        if result.status in ("skipped", "untestable") or (result.failed and result.status != run.finding.result.status):
            return None  # not judged, or another failure than the finding's (an error for a divergence)
        if result.failed:
            run.finding = Finding(d, case, result, outputs, first=run.finding.first)
        return result.failed

    def refuse(self, reason: str) -> None:
        """The draw counted under its reason, and hypothesis told to draw another."""
        self.run.refuse(reason)
        reject(None)


def fuzz(adapter, dtype: str, *, examples: int = DEFAULT_EXAMPLES, seed: int = 0, time_budget: Optional[float] = None,
         shrink_seconds: float = SHRINK_SECONDS, kinds: Optional[tuple] = None, strategy=None,
         params: Optional[dict] = None, min_examples: Optional[int] = None, database=None, expectations=None,
         cover: Optional[bool] = None, cells: Optional[tuple] = None, share_draws: bool = False) -> FuzzRun:
    """Draw up to `examples` examples (fewer once time_budget seconds have passed) for one adapter
    in one dtype, within its declared support (adapters/support.py); shrink the first divergent
    one. The same seed draws the same examples. strategy and params: a model file's
    (draw.fixed_draws, its weights) in place of drawn configs. min_examples (default examples):
    fewer judged is a shortfall (FuzzRun.short). database: a folder where failing examples are
    kept (database.py): those of earlier runs are judged first. expectations: a port's file
    (running/expectations.py): a draw in a skip region is not run, one in an xfail region is
    counted (FuzzRun.expected), never a finding. cover (default: on for drawn configs): search each
    cell of the covering array (cover.py) first, one example each (a cell given up after
    CELL_DRAWS draws, then at its fairest levels: cover.relaxed), then draw at random for the rest;
    cells: only these rows of the array, nothing drawn at random
    (each searched as the whole array's run searches it). Each example is judged once in a run;
    each dtype draws its own examples (dtype_seed) unless share_draws. kinds (default: those of
    DRAWN_KINDS the adapter runs): ENCODER alone draws the encoder stack (encoder_draw.py), at
    random, with no covering array. ValueError for a malformed support, or cover with a model
    file's fixed config or the encoder's draws."""
    drawn = strategy is None and params is None
    kinds = tuple(kind_of(k, "kinds", FUZZED_KINDS) for k in kinds) if kinds else kinds_of(adapter)
    encoder = ENCODER in kinds  # the encoder stack's draws: a search of their own (encoder_draw.py)
    if encoder and len(kinds) > 1:
        raise ValueError(f"kinds: the encoder stack's draws are a run of their own; got {', '.join(k.name for k in kinds)}")
    if cover and not drawn:
        raise ValueError("cover: a covering array varies configs; a model file's config is fixed")
    if cover and encoder:
        raise ValueError("cover: the covering array's factors are the block's; the encoder stack's draws are random")
    cover = drawn and not encoder if cover is None else cover
    if cells is not None and not cover:
        raise ValueError("cells: rows of the covering array, searched only where it is (cover, drawn configs)")
    run = FuzzRun(adapter.name, dtype, asked=examples, minimum=examples if min_examples is None else min_examples,
                  drew=ENCODER_STACK if encoder else "attention block")
    seed_of_dtype = dtype_seed(seed, dtype, share_draws)
    support = support_of(adapter)
    strategy = strategy if strategy is not None else encoder_draws() if encoder else draws(kinds, support)
    db = None if database is None else CountingDatabase(database, adapter.name, dtype, run.suffix)
    probe = Probe(run, adapter, params=params, time_budget=time_budget, shrink_seconds=shrink_seconds, database=db,
                  expectations=expectations)
    run.kept = allowed(support)
    rows = covering_array(seed, run.kept) if cover else ()
    searched = range(min(len(rows), examples)) if cells is None else cells
    if db is not None:  # the failures an earlier run kept, first: each row's (a row's finding ends the array), then the random search's
        _search_rows(probe, rows, searched, kinds, support, seed_of_dtype, db, replay=True)
        if run.finding is None and cells is None:
            _search(probe, strategy, examples, seed_of_dtype, db, (Phase.reuse, Phase.shrink))
    if run.finding is None:  # drawn configs: the covering array next
        _search_rows(probe, rows, searched, kinds, support, seed_of_dtype, db)
    if probe.spent() and run.examples < examples:
        run.unrun = max(run.unrun, 1)  # the budget ran out between two searches
    # then drawn at random, up to the examples asked (a finding's sizes are shrunk past its cell's by essence.py)
    if cells is None and run.finding is None and not probe.spent() and examples > run.examples:
        _search(probe, strategy, examples - run.examples, seed_of_dtype, db, (Phase.generate, Phase.shrink))
    if run.finding is not None and not run.finding.lost:
        reduce_to_essence(run, probe, shrink_seconds, fields=drawn, sizes="row" in run.found_in)
    run.seconds = time.perf_counter() - probe.start
    if run.finding is not None:
        explain(run.finding, adapter, dtype)
    return run


def _search_rows(probe: Probe, rows, searched, kinds, support, seed: int, db, replay: bool = False) -> None:
    """One example searched in each of the covering array's rows searched (its index in rows), until
    a finding: a row, then, where none of its draws was judged, its fairest (_tried). replay: the
    failures db keeps under each row judged instead (hypothesis's reuse phase), nothing drawn."""
    run = probe.run
    for i in searched:
        counted = False  # the row counted in run.cells, once, at its first search
        for row in _tried(rows[i]):
            if run.finding is not None or probe.spent():
                return
            region = cell(row, kinds, support)
            if region is None:
                continue  # outside the backend's support: its fairest may be inside
            strategy, kept = draws((region[0],), *region[1:]), None if db is None else RowDatabase(db, row)
            if replay:
                _search(probe, strategy, 1, seed, kept, (Phase.reuse, Phase.shrink), searching=f"database, row {i}")
                continue
            judged, counted, run.cells = run.examples, True, run.cells + (not counted)  # a row counted once
            _search(probe, strategy, 1, seed * 1000 + i, kept, (Phase.generate, Phase.shrink), CELL_DRAWS, f"row {i}")
            if run.examples > judged:
                break


def _tried(row: dict) -> tuple:
    """A row's searches: the row, then its fairest (cover.relaxed) where that differs."""
    fairest = relaxed(row)
    return (row,) if fairest == row else (row, fairest)


def _search(probe: Probe, strategy, examples: int, seed: int, db, phases, limit: Optional[int] = None,
            searching: str = "random") -> None:
    """hypothesis's search for a divergence: up to examples judged, drawn by strategy, shrunk;
    limit: the most draws before a finding (None: hypothesis's own); searching: its name (FuzzRun.found_in)."""
    probe.limit, probe.drawn = limit, 0
    probe.searching = "database" if Phase.reuse in phases and searching == "random" else searching
    @settings(max_examples=examples, database=db, deadline=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=phases)
    @hypothesis_seed(seed)
    @given(d=strategy)
    def test(d):
        probe(d)

    try:
        # a draw's arrays are small: threads only contend (NumPy's BLAS; OpenMP's: torch's, MKL's)
        with scratch_home(), threadpool_limits(1):
            test()
    except _Stop:
        pass  # the run ended where it stood: its finding, if any, is recorded
    except unittest.SkipTest:
        pass  # a reuse phase with nothing kept: hypothesis ran no example
    except Exception as err:
        if probe.run.finding is None and not isinstance(err, HypothesisException):
            raise  # not the backend's divergence (those are recorded before raising): a bug here
        # with a finding: it is recorded; hypothesis's own report (its final replay) adds nothing.
        # Unsatisfiable (every draw skipped or unfair) leaves run.examples at 0, which the caller reports


def reduce_to_essence(run: FuzzRun, probe: Probe, seconds: float, fields: bool = True, sizes: bool = False) -> None:
    """run's finding after each of its config fields and input choices is reset to its simplest
    value while it still diverges (essence.essential, within seconds); fields False (a model
    file's): its config and weights kept. A worker lost on a reset keeps the finding so far."""
    essence = Essence()
    try:
        essential(run.finding.draw, probe.retry, seconds=seconds, fields=fields, sizes=sizes, essence=essence)
    except _Stop:
        essence.stopped = "the worker was lost"
    run.finding.essence = essence

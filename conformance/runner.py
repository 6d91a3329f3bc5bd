"""Run cases on backends, compare with the goldens, report where a backend diverges first.

Each (backend, dtype, case) yields a CaseResult. The comparison checks, in order: the output's
dtype, its shape, finiteness, then every quantity the backend provides (f0, step_1 .. step_n,
z1) against its tolerance. The first quantity over tolerance is the divergence reported: a
failure at f0 points at ODEFunc, a failure first at step k points at the solver or at error
growth over steps.
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from .cases import Case
from .tolerance import relative_error, tolerance


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
    status: str  # passed | failed | error | skipped | xfailed | xpassed
    message: str = ""
    worst_ratio: float = 0.0  # max error / tolerance over the quantities checked
    quantities: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "error")


def _step_time(case: Case, quantity: str) -> str:
    if quantity.startswith("step_"):
        k = int(quantity[5:])
        return f" (t = {k}/{case.config.ode_steps})"
    return ""


def compare(case: Case, dtype: str, outputs: dict) -> tuple[str, str, list]:
    """(status, message, quantity results) for a backend's outputs: quantity -> array."""
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
        results.append(QuantityResult(name, relative_error(got, golden[name]), tolerance(case.e32[name], dtype)))
    bad = next((r for r in results if r.error > r.tolerance), None)
    if bad is None:
        return "passed", "", results
    where = "f0 = f(0, x), one evaluation of ODEFunc: the error is in f, not the solver" if bad.quantity == "f0" else (
        f"{bad.quantity}{_step_time(case, bad.quantity)}")
    return "failed", (f"diverges first at {where}: relative error {bad.error:.2e} > tolerance "
                      f"{bad.tolerance:.2e} ({bad.ratio:.0f}x)"), results


def run_case(backend, case: Case, dtype: str) -> CaseResult:
    """Run one case on one backend in one dtype."""
    start = time.perf_counter()
    result = CaseResult(backend.name, dtype, case.name, "passed")
    reason = backend.supports(case.config, dtype)
    if reason:
        result.status, result.message = "skipped", reason
        return result
    params = {k: np.asarray(v, dtype=dtype) for k, v in case.params.items()}
    x = case.x.astype(dtype)
    try:
        outputs = {}
        if hasattr(backend, "run_func"):
            outputs["f0"] = backend.run_func(case.config, params, 0.0, x, case.padding_mask, dtype)
        if hasattr(backend, "run_trajectory"):
            traj = np.asarray(backend.run_trajectory(case.config, params, x, case.padding_mask, dtype))
            if traj.shape[:1] != (case.config.ode_steps + 1,):
                raise ValueError(f"run_trajectory: expected {case.config.ode_steps + 1} states; got shape {traj.shape}")
            outputs.update({f"step_{k}": traj[k] for k in range(1, len(traj))})
            outputs["z1"] = traj[-1]
        else:
            outputs["z1"] = backend.run_block(case.config, params, x, case.padding_mask, dtype)
        result.status, result.message, result.quantities = compare(case, dtype, outputs)
    except Exception as err:  # a backend's crash is its result, reported, not raised
        result.status, result.message = "error", f"{type(err).__name__}: {err}"
    result.worst_ratio = max((q.ratio for q in result.quantities), default=0.0)
    result.seconds = time.perf_counter() - start
    return result


def select(cases, include=(), exclude=()):
    """Cases whose name matches any include regex (all if none) and no exclude regex."""
    return [c for c in cases
            if (not include or any(re.search(p, c.name) for p in include))
            and not any(re.search(p, c.name) for p in exclude)]


def run_suite(backends, cases, *, xfail=(), fail_fast=False, progress=None) -> list[CaseResult]:
    """Every case on every backend in every dtype it declares; xfail patterns match
    'backend/dtype/case' and turn a failure into xfailed (and a pass into xpassed)."""
    jobs = [(b, d, c) for b in backends for d in b.dtypes for c in cases]
    bar = progress(total=len(jobs)) if progress else None
    results = []
    for backend, dtype, case in jobs:
        r = run_case(backend, case, dtype)
        if any(re.search(p, f"{backend.name}/{dtype}/{case.name}") for p in xfail):
            r.status = "xfailed" if r.failed else ("xpassed" if r.status == "passed" else r.status)
        results.append(r)
        if bar:
            bar.update(1)
            bar.set_postfix_str(f"{backend.name}/{dtype}", refresh=False)
        if fail_fast and r.failed:
            break
    if bar:
        bar.close()
    return results


def summary(results) -> list[dict]:
    """One row per (backend, dtype): counts and the worst error / tolerance (the headroom)."""
    rows = {}
    for r in results:
        row = rows.setdefault((r.backend, r.dtype), {"backend": r.backend, "dtype": r.dtype, "passed": 0, "failed": 0,
                                                     "skipped": 0, "xfailed": 0, "worst_ratio": 0.0, "worst_case": ""})
        key = {"error": "failed", "xpassed": "failed"}.get(r.status, r.status)
        row[key] += 1
        if r.worst_ratio >= row["worst_ratio"] and r.status != "skipped":
            row["worst_ratio"], row["worst_case"] = r.worst_ratio, r.case
    return list(rows.values())


def format_report(results) -> str:
    rows = summary(results)
    w = max([len("backend")] + [len(r["backend"]) for r in rows]) + 2
    lines = [f"{'backend':<{w}}{'dtype':<9}{'passed':>7}{'failed':>7}{'skipped':>8}{'xfail':>6}  {'worst err/tol':>13}  worst case"]
    for row in rows:
        lines.append(f"{row['backend']:<{w}}{row['dtype']:<9}{row['passed']:>7}{row['failed']:>7}{row['skipped']:>8}"
                     f"{row['xfailed']:>6}  {row['worst_ratio']:>13.3g}  {row['worst_case'] if row['worst_ratio'] else '-'}")
    failures = [r for r in results if r.failed]
    if failures:
        lines.append("")
        lines.append("failures:")
        lines += [f"  {r.backend}/{r.dtype}/{r.case}: {r.message}" for r in failures]
    return "\n".join(lines)


def write_json(results, path) -> None:
    payload = {"summary": summary(results), "results": [asdict(r) for r in results]}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def write_junit(results, path) -> None:
    suites = ET.Element("testsuites")
    for row in summary(results):
        members = [r for r in results if (r.backend, r.dtype) == (row["backend"], row["dtype"])]
        suite = ET.SubElement(suites, "testsuite", name=f"{row['backend']}-{row['dtype']}", tests=str(len(members)),
                              failures=str(row["failed"]), skipped=str(row["skipped"] + row["xfailed"]))
        for r in members:
            tc = ET.SubElement(suite, "testcase", classname=f"conformance.{r.backend}.{r.dtype}", name=r.case,
                               time=f"{r.seconds:.4f}")
            if r.failed:
                ET.SubElement(tc, "failure", message=r.message).text = r.message
            elif r.status in ("skipped", "xfailed"):
                ET.SubElement(tc, "skipped", message=r.message or r.status)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)

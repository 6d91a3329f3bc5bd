"""The run's reports: the table and its failure groups (format_report), the JSON report
(write_json, versioned by REPORT_FORMAT and described by report.schema.json) and JUnit XML."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict

from .compare import CaseResult, Report
from ..cases.stages import format_stage
import ode_ref


def summary(results) -> list[dict]:
    """One row per (backend, dtype): counts and the worst error / tolerance (the headroom)."""
    rows = {}
    for r in results:
        row = rows.setdefault((r.backend, r.dtype), {"backend": r.backend, "dtype": r.dtype, "passed": 0, "failed": 0,
                                                     "skipped": 0, "xfailed": 0, "untestable": 0, "worst_ratio": 0.0,
                                                     "worst_case": ""})
        row[{"error": "failed", "xpassed": "failed"}.get(r.status, r.status)] += 1
        if r.worst_ratio >= row["worst_ratio"] and r.status not in ("skipped", "untestable"):
            row["worst_ratio"], row["worst_case"] = r.worst_ratio, r.case
        if r.failed and "first_failure" not in row:
            row["first_failure"] = divergence(r)
    return list(rows.values())


def _worst(row: dict) -> tuple[str, str]:
    """(worst err/tol, worst case) as the table shows them. A row whose failures were never
    measured against a tolerance (a dtype, a shape, NaN, an exception) shows its first failure's
    kind instead of a headroom that reads as a pass."""
    if row["failed"] and row["worst_ratio"] <= 1:
        return "-", f"failed: {row['first_failure']}"
    return f"{row['worst_ratio']:.3g}", row["worst_case"] if row["worst_ratio"] else "-"


SHOWN_PER_GROUP = 3  # failures printed per group; the JSON report holds them all


def divergence(result: CaseResult) -> str:
    """Where a failing result goes wrong first, as its failure group names it: the quantity over
    tolerance ('f0', 'step_3', 'grad.w'), a quantity and the check it failed ('z1 (dtype)'), an
    unexpected pass, or an error and its exception type (or its message, if it names none)."""
    message = result.message
    if result.status == "xpassed":
        return "unexpected pass"
    if result.status == "error":
        kind, sep, _ = message.partition(": ")
        return f"error: {kind if sep and ' ' not in kind else message[:80]}"
    if message.startswith("diverges first at "):
        return re.match(r"[^\s:]+", message[len("diverges first at "):]).group()
    name, _, rest = message.partition(": ")
    check = next((c for c in ("dtype", "shape") if rest.startswith(f"expected {c}")), None)
    return f"{name} ({check or ('non-finite' if rest.startswith('non-finite') else rest[:40])})"


def failure_groups(results) -> list[dict]:
    """The failing results grouped by (backend, dtype, divergence), in the results' order: a dict
    per group with those three and its results."""
    groups = {}
    for r in results:
        if r.failed:
            key = (r.backend, r.dtype, divergence(r))
            groups.setdefault(key, {"backend": key[0], "dtype": key[1], "divergence": key[2], "results": []})["results"].append(r)
    return list(groups.values())


def format_report(report: Report) -> str:
    rows = summary(report.results)
    w = max([len("backend")] + [len(r["backend"]) for r in rows]) + 2
    lines = [f"{'backend':<{w}}{'dtype':<9}{'passed':>7}{'failed':>7}{'skipped':>8}{'xfail':>6}{'untestable':>11}"
             f"  {'worst err/tol':>13}  worst case"]
    for row in rows:
        ratio, case = _worst(row)
        lines.append(f"{row['backend']:<{w}}{row['dtype']:<9}{row['passed']:>7}{row['failed']:>7}{row['skipped']:>8}"
                     f"{row['xfailed']:>6}{row['untestable']:>11}  {ratio:>13}  {case}")
    groups = failure_groups(report.results)
    if groups:
        count = sum(len(g["results"]) for g in groups)
        lines += ["", f"failures: {count}, in {len(groups)} group{'s' if len(groups) > 1 else ''} by backend, dtype and "
                      f"where each diverges first (the first {SHOWN_PER_GROUP} of each shown; every one in the --json report):"]
        for g in groups:
            members = g["results"]
            lines.append(f"  {g['backend']}/{g['dtype']}, {g['divergence']}: {len(members)} case{'s' if len(members) > 1 else ''}")
            lines += [f"    {r.case}: {r.message}" for r in members[:SHOWN_PER_GROUP]]
            if len(members) > SHOWN_PER_GROUP:
                lines.append(f"    ... and {len(members) - SHOWN_PER_GROUP} more")
            lines += _triage_lines(report.triage.get((g["backend"], g["dtype"], g["divergence"])), members[0].case)
    if report.errors:
        lines += ["", "backend errors (see the JSON report for tracebacks):"]
        lines += [f"  {e.backend}: {e.message}" for e in report.errors]
    lines += [f"skipped backend {n}" for n in report.notes]
    lines += report.warnings
    return "\n".join(lines)


def _triage_lines(found, first_case: str) -> list[str]:
    """A group's triage (triage.py) as the table's lines: its shared settings and its stage."""

    if not found:
        return []
    lines = [f"    every one has: {', '.join(found['shared'])}"] if found["shared"] else []
    stage = found.get("stage")
    if stage and "skipped" in stage:
        lines.append(f"    stages of {first_case}: not asked ({stage['skipped']})")
    elif stage:
        lines.append(f"    stages of {first_case}: {format_stage(stage)}")
    return lines


REPORT_FORMAT = "odeattn-conformance-report/1"  # the JSON report's schema: report.schema.json beside the package
# the versions a report records: the ports' libraries and every deployment target's runtime (and IREE's compiler)
RUNTIMES = ("numpy", "torch", "jax", "jaxlib", "flax", "onnx", "onnxruntime", "openvino", "tract", "iree-base-runtime",
            "iree-base-compiler", "executorch", "ai-edge-litert", "litert-torch")


def environment() -> dict:
    """Where a run happened, for the report and the matrix: odeattn's, Python's and the runtimes'
    installed versions (read from their metadata, nothing imported) and the platform."""
    import importlib.metadata
    import platform


    packages = {}
    for name in RUNTIMES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"odeattn": ode_ref.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "machine": platform.machine(), "packages": packages}


def _group_json(g: dict, report: Report) -> dict:
    found = report.triage.get((g["backend"], g["dtype"], g["divergence"]), {})
    return {**{k: g[k] for k in ("backend", "dtype", "divergence")}, "cases": [r.case for r in g["results"]],
            "shared_settings": found.get("shared", []), "stage": found.get("stage")}


def write_json(report: Report, path, header: dict) -> None:
    groups = [_group_json(g, report) for g in failure_groups(report.results)]
    payload = {"format": REPORT_FORMAT, **header, "exit_code": report.exit_code, "summary": summary(report.results),
               "backend_errors": [asdict(e) for e in report.errors], "notes": report.notes, "warnings": report.warnings,
               "failure_groups": groups, "profile": {"wall": report.wall, "backends": report.profile},
               "untestable": [{"backend": r.backend, "dtype": r.dtype, "case": r.case, "reason": r.message}
                              for r in report.results if r.status == "untestable"],
               "results": [asdict(r) for r in report.results]}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    """text without the characters XML 1.0 cannot hold (a backend's ANSI colours, NULs)."""
    return _NOT_XML.sub("?", text)


def write_junit(report: Report, path, header: dict) -> None:
    suites = ET.Element("testsuites")
    props = ET.SubElement(suites, "properties")
    for k, v in header.items():
        ET.SubElement(props, "property", name=k, value=str(v))
    for row in summary(report.results):
        members = [r for r in report.results if (r.backend, r.dtype) == (row["backend"], row["dtype"])]
        suite = ET.SubElement(suites, "testsuite", name=f"{row['backend']}-{row['dtype']}", tests=str(len(members)),
                              failures=str(row["failed"]), skipped=str(row["skipped"] + row["xfailed"] + row["untestable"]))
        for r in members:
            tc = ET.SubElement(suite, "testcase", classname=f"conformance.{r.backend}.{r.dtype}", name=r.case,
                               time=f"{r.seconds:.4f}")
            if r.failed:
                ET.SubElement(tc, "failure", message=_xml_text(r.message), type=r.status).text = _xml_text(r.traceback or r.message)
            elif r.status in ("skipped", "xfailed", "untestable"):
                ET.SubElement(tc, "skipped", message=_xml_text(r.message or r.status))
    if report.errors:
        suite = ET.SubElement(suites, "testsuite", name="backends", tests=str(len(report.errors)), failures=str(len(report.errors)))
        for e in report.errors:
            tc = ET.SubElement(suite, "testcase", classname="odeattn.conformance.adapters", name=e.backend)
            ET.SubElement(tc, "failure", message=_xml_text(e.message), type="error").text = _xml_text(e.traceback or e.message)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)

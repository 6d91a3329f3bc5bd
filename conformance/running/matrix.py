"""The compliance matrix: several JSON reports of one suite (backends, machines, runtimes, shards)
joined into one table, as Markdown or HTML, so a project can publish "conforms to odeattn suite
<digest>" with its evidence beside it.

A report is read only after it validates against report.schema.json. Reports of one suite only:
two digests are refused. A column is a (backend, dtype) of a report, named by the report's file
when two reports hold the same pair; the shards of one run (their `shard` I/N, the same backend,
dtype and machine) make one column. A column conforms when every case of the suite has a result
in it and none failed; a skip (the backend's supports()), an expected failure or an untestable
case is counted beside the verdict, never hidden.
"""

from __future__ import annotations

import hashlib
import html
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .expectations import read_json
from .reports import REPORT_FORMAT

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "report.schema.json"
MARKS = {"passed": "✓", "failed": "✗", "error": "✗", "xpassed": "✗", "skipped": "s", "xfailed": "x", "untestable": "u"}
LEGEND = ("✓ passed, ✗ failed (an error or an unexpected pass too), s skipped (the backend's supports() or an expectations "
          "file: the reasons are listed above), x expected failure, u untestable in that dtype")


@lru_cache(maxsize=None)
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def load_report(path) -> dict:
    """A parsed report with its file's sha256 under "_sha256", or ValueError naming the file and
    the field that is wrong."""
    from jsonschema.exceptions import best_match

    where = str(path)
    data, report = read_json(path)
    if isinstance(report, dict) and report.get("format") != REPORT_FORMAT:
        raise ValueError(f"{where}: format: expected {REPORT_FORMAT!r} (an `odeattn conformance --json` report); "
                         f"got {report.get('format')!r}")
    error = best_match(_validator().iter_errors(report))
    if error is not None:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or " (the whole report)"
        raise ValueError(f"{where}: ${field}: {error.message}")
    return {**report, "_sha256": hashlib.sha256(data).hexdigest(), "_file": str(path)}  # as given: CI artifacts share names


@dataclass
class Column:
    backend: str
    dtype: str
    report: str  # the file (files, for shards) it came from
    machine: str
    results: dict = field(default_factory=dict)  # case -> (status, message, worst err/tol, the report's file)
    errors: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.dtype}"

    def counts(self) -> dict:
        out = {s: 0 for s in MARKS}
        for status, *_ in self.results.values():
            out[status] += 1
        return out

    def skip_reasons(self) -> dict:
        """reason -> how many cases it skipped, the most first."""
        reasons = {}
        for status, message, *_ in self.results.values():
            if status == "skipped":
                reasons[message] = reasons.get(message, 0) + 1
        return dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))

    def verdict(self, suite_cases: int) -> str:
        c = self.counts()
        failing = c["failed"] + c["error"] + c["xpassed"]
        if failing or self.errors:
            why = ([f"{failing} case{'s' * (failing != 1)}"] if failing else []) + [f"a backend error: {m}" for m in self.errors[:1]]
            return f"fails ({', '.join(why)})"
        if len(self.results) < suite_cases:
            return f"incomplete ({len(self.results)} of {suite_cases} cases reported)"
        ran, expected = c["passed"], c["xfailed"]
        if not ran:
            return "runs no case"
        but = f", {expected} expected failure{'s' * (expected != 1)}" if expected else ""
        return "conforms" if ran == suite_cases else f"conforms on the {ran} cases it runs{but}"


def join(reports: list) -> tuple[str, int, list]:
    """(digest, the suite's case count, columns) of reports of one suite; ValueError otherwise."""
    digests = {r["digest"] for r in reports}
    if len(digests) > 1:
        files = ", ".join(f"{r['_file']} ({r['digest'][:12]})" for r in reports)
        raise ValueError(f"reports: expected reports of one suite (one golden digest); got {len(digests)}: {files}")
    seen = {}
    for r in reports:  # a report given twice would count its cases twice
        if r["_sha256"] in seen:
            raise ValueError(f"reports: {seen[r['_sha256']]} and {r['_file']} are the same report; expected each once")
        seen[r["_sha256"]] = r["_file"]
    columns = {}
    for r in reports:
        machine = f"{r['environment']['platform']}, Python {r['environment']['python']}"
        for res in r["results"]:
            key = (res["backend"], res["dtype"], machine, r.get("shard") is None and r["_file"])
            col = columns.setdefault(key, Column(res["backend"], res["dtype"], r["_file"], machine))
            if r["_file"] not in col.report.split(", "):
                col.report += f", {r['_file']}"
            if res["case"] in col.results:  # two shards of one run hold each case once: one answer a case
                raise ValueError(f"reports: {res['case']} on {col.label} is in both {col.results[res['case']][3]} and "
                                 f"{r['_file']}; expected the shards of one run, each case in one of them")
            col.results[res["case"]] = (res["status"], res["message"], res["worst_ratio"], r["_file"])
        for e in r["backend_errors"]:  # named as typed (a module, exec:), not as the backend reports: a row of its own
            col = columns.setdefault(("error", e["backend"], r["_file"]), Column(e["backend"], "-", r["_file"], machine))
            col.errors.append(e["message"])
    cols = list(columns.values())
    labels = [c.label for c in cols]
    for c in cols:
        if labels.count(c.label) > 1:
            c.backend = f"{c.backend} ({c.report})"
    return digests.pop(), max(r["suite_cases"] for r in reports), cols


def statement(digest: str, suite_cases: int, cols: list) -> str:
    conforming = [c.label for c in cols if c.verdict(suite_cases) == "conforms"]
    if conforming and len(conforming) == len(cols):
        return f"{', '.join(conforming)} conform to odeattn suite {digest} ({suite_cases} cases), every case passed."
    return (f"odeattn suite {digest} ({suite_cases} cases): {len(conforming)} of {len(cols)} columns conform on every case "
            f"({', '.join(conforming) or 'none'}).")


def _summary_rows(suite_cases: int, cols: list) -> list[list[str]]:
    rows = []
    for c in cols:
        n = c.counts()
        rows.append([c.label, c.machine, c.report, str(n["passed"]), str(n["failed"] + n["error"] + n["xpassed"]),
                     str(n["skipped"]), str(n["xfailed"]), str(n["untestable"]), c.verdict(suite_cases)])
    return rows


SUMMARY_HEADER = ["backend/dtype", "machine", "report", "passed", "failed", "skipped", "xfail", "untestable", "verdict"]


def _cases(cols: list) -> list[str]:
    """Every case any column holds, by name (shards' reports hold the suite's order in parts)."""
    return sorted({case for c in cols for case in c.results})


def _reasons(cols: list) -> list[str]:
    """A Markdown line per column that skipped cases: its reasons and how many each skipped."""
    return [f"- {c.label}: " + "; ".join(f"{n} {reason}" for reason, n in c.skip_reasons().items())
            for c in cols if c.skip_reasons()]


def markdown(reports: list) -> str:
    digest, suite_cases, cols = join(reports)

    def table(header, rows):
        return [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"] + [f"| {' | '.join(r)} |" for r in rows]

    lines = ["# odeattn conformance matrix", "", statement(digest, suite_cases, cols), ""]
    lines += table(SUMMARY_HEADER, _summary_rows(suite_cases, cols))
    lines += ["", "Evidence: " + "; ".join(f"`{r['_file']}` sha256 {r['_sha256']}" for r in reports), ""]
    lines += ["Skipped, by reason:", "", *_reasons(cols), ""] if _reasons(cols) else []
    lines += [f"Per case ({LEGEND}; blank: not in the reports):", ""]
    lines += table(["case"] + [c.label for c in cols],
                   [[f"`{case}`"] + [MARKS[c.results[case][0]] if case in c.results else " " for c in cols] for case in _cases(cols)])
    return "\n".join(lines) + "\n"


def to_html(reports: list) -> str:
    digest, suite_cases, cols = join(reports)
    e = html.escape

    def row(cells, tag="td"):
        return "<tr>" + "".join(f"<{tag}>{cell}</{tag}>" for cell in cells) + "</tr>"

    summary = [row(map(e, SUMMARY_HEADER), "th")] + [row(map(e, r)) for r in _summary_rows(suite_cases, cols)]
    cases = [row(["case"] + [e(c.label) for c in cols], "th")]
    for case in _cases(cols):
        cells = [f"<code>{e(case)}</code>"]
        for c in cols:
            status, message, ratio, _ = c.results.get(case, ("", "", 0.0, ""))
            tip = message or (f"{status}, worst err/tol {ratio:.3g}" if status else "")
            cells.append(f'<span class="{status}" title="{e(tip, quote=True)}">{MARKS.get(status, "")}</span>')
        cases.append(row(cells))
    evidence = "".join(f"<li><code>{e(r['_file'])}</code> sha256 <code>{r['_sha256']}</code></li>" for r in reports)
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:center}.passed{color:#080}"
             ".failed,.error,.xpassed{color:#c00;font-weight:bold}.skipped,.xfailed,.untestable{color:#888}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>odeattn conformance matrix</title>"
            f"<style>{style}</style></head><body>\n<h1>odeattn conformance matrix</h1>\n"
            f"<p>{e(statement(digest, suite_cases, cols))}</p>\n<table>{''.join(summary)}</table>\n"
            f"<p>Evidence:</p><ul>{evidence}</ul>\n{_reasons_html(cols)}<p>Per case ({e(LEGEND)}; blank: not in the reports; a mark's "
            f"tooltip is its message):</p>\n<table>{''.join(cases)}</table>\n</body></html>\n")


def _reasons_html(cols: list) -> str:
    items = "".join(f"<li>{html.escape(line[2:])}</li>" for line in _reasons(cols))
    return f"<p>Skipped, by reason:</p><ul>{items}</ul>\n" if items else ""

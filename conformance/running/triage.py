"""What a run's failures have in common, said after the table: for each failure group, the
config settings that every failing case of the group shares (and how many of the cases run with
that setting fail), and the first divergent stage of f(0, x) on the group's first case, asked of
the backend's optional run_stages in a worker of its own (cases/stages.py judges the values).

A setting is named when every case of the group has it and some case run on that backend and
dtype does not: a setting every case has (the default of a field no case changes) says nothing.
"""

from __future__ import annotations

from ode_ref.precision import HALF_DTYPES

from ..adapters.support import settings_of
from .reports import failure_groups
from ..cases.stages import judge_stages, stages_failed
from .pool import BackendFailed, Constructed, Pool, Result
from .requests import reply_limit, request_frame


def settings(case) -> dict:
    """A case's settings as the triage compares them: its kind and its config's fields (the
    encoding in effect as positional_encoding: support.settings_of)."""
    return {"kind": case.kind.name, **settings_of(case.config)}


SHOWN_SETTINGS = 3  # the settings named per group, those whose cases fail most often first


def shared_settings(group: list, ran: list, cases: dict) -> list[str]:
    """'field=value (F of the N cases run with it fail)' for the settings that every result of
    group shares and that tell something: the cases run with it (of ran, the backend and dtype's
    results that ran) fail more often than the cases run at all. The SHOWN_SETTINGS that fail most
    often, fewest cases first on a tie."""
    if not group or not ran:
        return []
    first = settings(cases[group[0].case])
    common = {k: v for k, v in first.items() if all(settings(cases[r.case]).get(k) == v for r in group[1:])}
    overall = sum(r.failed for r in ran) / len(ran)
    found = []
    for k, v in common.items():
        having = [r for r in ran if settings(cases[r.case]).get(k) == v]
        failing = sum(r.failed for r in having)
        if having and failing / len(having) > overall:
            found.append((-failing / len(having), len(having), f"{k}={v} ({failing} of the {len(having)} cases run with it fail)"))
    return [text for *_, text in sorted(found)[:SHOWN_SETTINGS]]


def stage_targets(report, cases: dict) -> dict:
    """(backend, dtype, divergence) -> the group's first case, for the groups whose stages are
    asked: a failure measured against a tolerance, not in a half dtype (the stages' half errors
    are not measured), of a block case (a decode or grad bug is past f(0, x), whose stages would
    agree and mislead), as the fuzzer asks."""
    out = {}
    for g in failure_groups(report.results):
        first = g["results"][0]
        case = cases[first.case]
        if first.status == "failed" and g["dtype"] not in HALF_DTYPES and case.kind.stages and first.quantities:
            out[g["backend"], g["dtype"], g["divergence"]] = case
    return out


def name_stages(report, cases: dict, *, jobs: int, timeout: float) -> dict:
    """(backend, dtype, divergence) -> cases.stages' judgement for the group's first case (a dict;
    "skipped" when the backend has no run_stages), each backend in a fresh worker."""

    targets = stage_targets(report, cases)
    wanted = [report.refs[name] for name in dict.fromkeys(key[0] for key in targets) if name in report.refs]
    if not wanted:
        return {}
    out = {}
    pool = Pool(wanted, jobs=jobs, timeout=timeout)
    for event in pool.events():
        if isinstance(event, Constructed):
            mine = [(key, case) for key, case in targets.items() if key[0] == event.name]
            pool.give(event.backend, [((key, case), request_frame(case, key[1], stages=True), reply_limit(case)) for key, case in mine])
        elif isinstance(event, Result):
            key, case = event.job
            status = event.reply.get("status")
            if status == "ran":
                try:
                    out[key] = judge_stages(case, event.arrays, key[1])
                except ValueError as err:  # a stage of the wrong shape
                    out[key] = stages_failed(f"run_stages: {err}")
            elif status == "skipped":
                out[key] = {"skipped": event.reply.get("message", "")}
            else:
                out[key] = stages_failed(f"run_stages raised {event.reply.get('message', 'an error')}")
        elif isinstance(event, BackendFailed):
            continue
    return out


def triage(report, cases, *, jobs: int, timeout: float, stages: bool = True) -> None:
    """report.triage: (backend, dtype, divergence) -> {"shared": [...], "stage": dict or None}."""
    by_name = {c.name: c for c in cases}
    found = name_stages(report, by_name, jobs=jobs, timeout=timeout) if stages else {}
    for g in failure_groups(report.results):
        key = (g["backend"], g["dtype"], g["divergence"])
        ran = [r for r in report.results if (r.backend, r.dtype) == key[:2] and r.status not in ("skipped", "untestable")]
        report.triage[key] = {"shared": shared_settings(g["results"], ran, by_name), "stage": found.get(key)}

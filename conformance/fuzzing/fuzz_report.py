"""What `odeattn conformance fuzz` prints and writes: a line per backend and dtype, the shrunk
example of a divergence in full, and the JSON and JUnit reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Optional

from .cover import feasible_pairs
from .draw import describe_input, describe_padding
from ..cases.stages import format_stage


SHOWN_REASONS = 4  # the most frequent reasons a report names for refused draws


def format_run(run) -> str:
    """A line for a run (fuzz.FuzzRun), the draws refused by reason and any shortfall below it; a
    divergence's minimal example below those."""
    replayed = f"{run.replayed} replayed from the database, " if run.replayed else ""
    head = (f"{run.label}: {run.examples} examples, {'1 diverged' if run.diverged else 'none diverged'}"
            f" ({replayed}{run.skipped} draws not supported, {run.unfair} with no fair input, {run.seconds:.1f} s)")
    lines = [head if run.diverged else head + f", worst err/tol {run.worst_ratio:.3g}"]
    if run.refusals:
        lines.append(f"  refused: {format_refusals(run.refusals)}")
    if run.held:
        lines.append(f"  coverage: {format_coverage(run)}")
    if run.found_in:
        lines.append(f"  found in: {found_in(run.found_in)}")
    for label, (failed, passed) in run.expected.items():
        lines.append(f"  {'unexpected pass' if label in run.unexpected else 'expected failures'}: {label}: "
                     f"{failed} of the {failed + passed} examples it selects failed")
    if run.short:
        lines.append(f"  shortfall: {shortfall(run, reasons=False)}")
    elif run.unrun and run.examples < run.asked:
        lines.append(f"  time budget: judged {run.examples} of {run.asked} examples asked before it ran out")
    if run.diverged:
        lines.append(format_finding(run.finding))
    return "\n".join(lines)


FOUND_IN = {"random": "the random draws", "database": "the failures an earlier run's random draws kept"}


def found_in(where: str) -> str:
    """FuzzRun.found_in in words."""
    if where.startswith("database, "):
        return f"the failures an earlier run's {where.split(', ')[1]} of the covering array kept"
    return FOUND_IN.get(where, f"{where} of the covering array")


def pairs_held(run) -> tuple[int, int]:
    """(the feasible pairs of factor levels the run's judged examples lie in, the feasible pairs)."""
    feasible = feasible_pairs(run.kept)[0]
    return len(run.held & feasible), len(feasible)


def format_coverage(run) -> str:
    """The pairs of factor levels (cover.py) the judged examples lie in, of those feasible, after
    the covering array's rows searched."""
    held, feasible = pairs_held(run)
    infeasible = feasible_pairs(run.kept)[1]
    cells = (f"{run.cells} covering-array rows searched" if run.cells else
             "no covering array searched: turned off, a model file's fixed config, or a failure replayed first")
    narrowed = " its declared support allows" if run.kept is not None else ""  # cover.allowed
    return (f"the examples judged hold {held} of the {feasible} feasible pairs of two factors' "
            f"levels{narrowed} ({cells}; {len(infeasible)} pairs infeasible: "
            f"{'docs/fuzzing.md' if run.kept is None else 'cover.feasible_pairs'} names them)")


def format_refusals(refusals: dict) -> str:
    """'566 not supported: ...; 393 no fair input', the most frequent first, the rest summed."""
    ranked = sorted(refusals.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = "; ".join(f"{n} {reason}" for reason, n in ranked[:SHOWN_REASONS])
    rest = ranked[SHOWN_REASONS:]
    return shown + (f"; {sum(n for _, n in rest)} for {len(rest)} other reasons" if rest else "")


def shortfall(run, reasons: bool = True) -> str:
    """What a short run (fuzz.FuzzRun.short) judged, of what was asked, and why hypothesis stopped:
    the reasons draws were refused, or (reasons False: a report's line below them) a pointer to them."""
    need = f" (at least {run.minimum} needed)" if run.minimum != run.asked else ""
    refused = run.skipped + run.unfair
    why = f" ({format_refusals(run.refusals)})" if reasons else " (above)"
    return (f"judged {run.examples} of {run.asked} examples asked{need}: hypothesis stopped drawing after {run.draws} "
            f"draws, {refused} of them refused" + (why if refused else ""))


def format_finding(f) -> str:
    d, case = f.draw, f.case
    bad = next((q for q in f.result.quantities if q.quantity == f.quantity), None)
    shape = f"batch {case.x.shape[0]}, seq {case.x.shape[1]}, d_model {case.x.shape[2]} (heads {case.config.num_heads}, head_dim {case.config.head_dim})"
    kind = case.kind.describe(case)
    first, last = (f"batch {b.batch}, seq {b.seq}, d_model {b.config.hidden_size}, {b.steps} steps" for b in (f.first, d))
    # sizes that shrinking left as they were are said so, not "shrunk from X to X"
    sizes = f"shrunk from {first} to {last}" if first != last else f"{last}, not shrunk further in size"
    if f.lost:  # a hang or a crash: each try to shrink it would cost the timeout or a fresh worker
        sizes = f"{last}, not shrunk (the worker {f.lost})"
    lines = [f"  {'example' if f.lost else 'minimal example'} ({kind}), {sizes}:",
             f"    config:   {json.dumps(d.fields())}",
             *([f"    essence:  {format_essence(f.essence)}"] if f.essence is not None and f.essence.tries else []),
             f"    shapes:   {shape}",
             f"    padding:  {describe_padding(d)}",
             f"    input:    {describe_input(d)}"]
    if bad is not None:
        lines.append(f"    quantity: {f.quantity}: relative error {bad.error:.2e} > tolerance {bad.tolerance:.2e} "
                     f"(err/tol {bad.ratio:.3g})")
        lines.append(f"    where:    {f.localisation.get('summary', '')}")
        if f.first_at:  # a decode finding's token and cache slot, a grad finding's gradient
            lines.append(f"    {'token:   ' if 'token' in f.first_at else 'gradient:'} {f.first_at['summary']}")
    else:
        lines.append(f"    result:   {f.result.status}: {f.result.message}")
    if f.stage is not None:
        lines.append(f"    stage:    {format_stage(f.stage)}")
    if f.repro:
        lines.append(f"    repro:    {f.repro}")
    return "\n".join(lines)


def format_essence(essence) -> str:
    """What resetting each field and input choice to its simplest showed (essence.py): those whose
    reset still diverges (dropped from the example), and those whose reset passes (they matter)."""
    parts = [f"needed (with each reset to its simplest the example passes): {', '.join(essence.needed)}"] if essence.needed else []
    if essence.reset:
        parts.append(f"reset to the simplest, still diverging: {', '.join(essence.reset)}")
    stopped = f" (stopped early: {essence.stopped})" if essence.stopped else ""
    return "; ".join(parts or [f"no reset tried could be judged ({essence.tries} tried)"]) + stopped


def _essence_dict(essence) -> Optional[dict]:
    if essence is None:
        return None
    return {"reset": essence.reset, "needed": essence.needed, "tries": essence.tries, "stopped": essence.stopped}


def _finding_dict(f) -> dict:
    bad = next((q for q in f.result.quantities if q.quantity == f.quantity), None)
    return {"config": f.case.config.to_dict(), "kind": f.draw.kind.name, "shape": list(f.case.x.shape), "decoded": f.case.decoded,
            "padding": describe_padding(f.draw), "input": describe_input(f.draw), "quantity": f.quantity,
            "error": bad.error if bad else None, "tolerance": bad.tolerance if bad else None,
            "message": f.result.message, "traceback": f.result.traceback, "lost": f.lost, "localisation": f.localisation, "stage": f.stage, "repro": f.repro,
            "first_at": f.first_at, "essence": _essence_dict(f.essence),
            "first_found": {"batch": f.first.batch, "seq": f.first.seq, "d_model": f.first.config.hidden_size,
                            "steps": f.first.steps}}


def write_json(runs, path, header: dict) -> None:
    payload = {**header, "exit_code": 1 if any(r.failed for r in runs) else 0,
               "runs": [{"backend": r.backend, "dtype": r.dtype, "drew": r.drew, "examples": r.examples,
                         "asked": r.asked,
                         "minimum": r.minimum, "short": r.short, "replayed": r.replayed, "draws": r.draws,
                         "skipped": r.skipped, "unfair": r.unfair, "refusals": r.refusals, "unrun": r.unrun,
                         "cells": r.cells, "found_in": r.found_in, "repeats": r.repeats,
                         # the covering array's pairs are the attention block's factors: none for the encoder stack's run
                         **dict(zip(("pairs_held", "pairs_feasible"), (None, None) if r.suffix else pairs_held(r))),
                         "seconds": r.seconds, "worst_ratio": r.worst_ratio, "expected": r.expected,
                         "unexpected": r.unexpected, "judged": r.judged,
                         "finding": _finding_dict(r.finding) if r.finding else None} for r in runs]}
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1)


def write_junit(runs, path, header: dict) -> None:
    suites = ET.Element("testsuites")
    props = ET.SubElement(suites, "properties")
    for k, v in header.items():
        ET.SubElement(props, "property", name=k, value=str(v))
    for r in runs:
        suite = ET.SubElement(suites, "testsuite", name=f"fuzz-{r.backend}-{r.dtype}{r.suffix}", tests="1",
                              failures=str(int(r.failed)))
        tc = ET.SubElement(suite, "testcase", classname=f"conformance.fuzz.{r.backend}", name=r.dtype + r.suffix,
                           time=f"{r.seconds:.3f}")
        if r.diverged:
            ET.SubElement(tc, "failure", message=r.finding.result.message[:500], type="diverged").text = format_finding(r.finding)
        elif r.short:
            ET.SubElement(tc, "failure", message=shortfall(r)[:500], type="shortfall").text = shortfall(r)
        elif r.unexpected:
            text = f"unexpected pass: {'; '.join(r.unexpected)}: none of the examples it selects failed"
            ET.SubElement(tc, "failure", message=text[:500], type="xpassed").text = text
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)

"""What `odeattn conformance fuzz` prints and writes: a line per backend and dtype, the shrunk
example of a divergence in full, and the JSON and JUnit reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from .draw import describe_input, describe_padding
from .stages import format_stage


def format_run(run) -> str:
    """A line for a run (fuzz.FuzzRun); a divergence's minimal example below it."""
    head = (f"{run.backend}/{run.dtype}: {run.examples} examples, {'1 diverged' if run.diverged else 'none diverged'}"
            f" ({run.skipped} draws not supported, {run.unfair} with no fair input, {run.seconds:.1f} s)")
    if not run.diverged:
        return head + f", worst err/tol {run.worst_ratio:.3g}"
    return head + "\n" + format_finding(run.finding)


def format_finding(f) -> str:
    d, case = f.draw, f.case
    bad = next((q for q in f.result.quantities if q.quantity == f.quantity), None)
    shape = f"batch {case.x.shape[0]}, seq {case.x.shape[1]}, d_model {case.x.shape[2]} (heads {case.config.num_heads}, head_dim {case.config.head_dim})"
    kind = {"block": "a block forward", "decode": f"cached decoding, {case.decoded} tokens after a prompt of {case.prompt}",
            "grad": "the backward pass"}[d.kind]
    b0, b1 = f.first, d
    lines = [f"  minimal example ({kind}), shrunk from batch {b0.batch}, seq {b0.seq}, d_model {b0.config.hidden_size}, "
             f"{b0.config.ode_steps} steps to batch {b1.batch}, seq {b1.seq}, d_model {b1.config.hidden_size}, {b1.config.ode_steps} steps:",
             f"    config:   {json.dumps(d.fields())}",
             f"    shapes:   {shape}",
             f"    padding:  {describe_padding(d)}",
             f"    input:    {describe_input(d)}"]
    if bad is not None:
        lines.append(f"    quantity: {f.quantity}: relative error {bad.error:.2e} > tolerance {bad.tolerance:.2e} "
                     f"(err/tol {bad.ratio:.3g})")
        lines.append(f"    where:    {f.localisation.get('summary', '')}")
    else:
        lines.append(f"    result:   {f.result.status}: {f.result.message}")
    if f.stage is not None:
        lines.append(f"    stage:    {format_stage(f.stage)}")
    if f.repro:
        lines.append(f"    repro:    {f.repro}")
    return "\n".join(lines)


def _finding_dict(f) -> dict:
    bad = next((q for q in f.result.quantities if q.quantity == f.quantity), None)
    return {"config": f.case.config.to_dict(), "kind": f.draw.kind, "shape": list(f.case.x.shape), "decoded": f.case.decoded,
            "padding": describe_padding(f.draw), "input": describe_input(f.draw), "quantity": f.quantity,
            "error": bad.error if bad else None, "tolerance": bad.tolerance if bad else None,
            "message": f.result.message, "localisation": f.localisation, "stage": f.stage, "repro": f.repro,
            "first_found": {"batch": f.first.batch, "seq": f.first.seq, "d_model": f.first.config.hidden_size,
                            "steps": f.first.config.ode_steps}}


def write_json(runs, path, header: dict) -> None:
    payload = {**header, "exit_code": 1 if any(r.diverged for r in runs) else 0,
               "runs": [{"backend": r.backend, "dtype": r.dtype, "examples": r.examples, "skipped": r.skipped,
                         "seconds": r.seconds, "worst_ratio": r.worst_ratio,
                         "finding": _finding_dict(r.finding) if r.finding else None} for r in runs]}
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1)


def write_junit(runs, path, header: dict) -> None:
    suites = ET.Element("testsuites")
    props = ET.SubElement(suites, "properties")
    for k, v in header.items():
        ET.SubElement(props, "property", name=k, value=str(v))
    for r in runs:
        suite = ET.SubElement(suites, "testsuite", name=f"fuzz-{r.backend}-{r.dtype}", tests="1",
                              failures=str(int(r.diverged)))
        tc = ET.SubElement(suite, "testcase", classname=f"conformance.fuzz.{r.backend}", name=r.dtype, time=f"{r.seconds:.3f}")
        if r.diverged:
            ET.SubElement(tc, "failure", message=r.finding.result.message[:500], type="diverged").text = format_finding(r.finding)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)

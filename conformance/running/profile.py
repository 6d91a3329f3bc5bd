"""Where a conformance run spends its time: per backend and per phase, and what each backend compiled.

The phases, each summed over a backend's worker processes (so they can add up to more than the
backend's wall time when it had several workers):

    start         a worker process starting: the interpreter, numpy, safetensors and ode_ref,
                  measured by the run from the spawn to the worker's first read of its request
                  (a worker handed over from a backend sharing its process: from the hand-over;
                  it counts among `workers` for each backend it serves)
    import        importing the backend's module (and what it imports: torch, jax, onnx)
    construction  calling its class or factory, and checking it against the protocol
    compilation   JAX: tracing, lowering and XLA compiling, reads of the persistent cache
                  included (jax.monitoring's events); the exported graphs: every export to ONNX
                  and every runtime session (or reference evaluator) built from one
    run           the backend's calls for each case, less its compilation
    transfer      framing the case's arrays and the outputs through the pipes
    comparison    in the run's process: the outputs against the goldens

JAX's compilation is also split, in the JSON report only, into jax_trace (Python to jaxpr),
jax_lower (jaxpr to the MLIR module) and jax_xla (XLA compiling, or reading the persistent cache:
what the cache saves; tracing and lowering happen warm too).

The counters, per backend: programs (JAX programs lowered and handed to XLA), cache_hits (those
read from the persistent cache instead of compiled), xla_compilations (programs - cache_hits),
exports and sessions. A backend that imports JAX only inside a call has its first call's
compilations counted as run time. A worker counts them (wire/counters.py) and reports each case's
share; this module sums them per backend.
"""

from __future__ import annotations

PHASES = ("start", "import", "construction", "compilation", "run", "transfer", "comparison")
COUNTERS = ("programs", "cache_hits", "xla_compilations", "exports", "sessions")
CASE_KEYS = ("compilation", "jax_trace", "jax_lower", "jax_xla", "run", "transfer", "comparison", "programs", "cache_hits",
             "exports", "sessions")  # what a case's profile holds, summed into its backend's row


def empty() -> dict:
    """A backend's profile before anything ran: every phase 0 s, every counter 0."""
    return {"wall": 0.0, "workers": 0, **{p: 0.0 for p in PHASES}, "jax_trace": 0.0, "jax_lower": 0.0, "jax_xla": 0.0,
            **{c: 0 for c in COUNTERS}}


def add_case(row: dict, case: dict) -> None:
    """Add one case's profile (CaseResult.profile) to a backend's row."""
    for key in CASE_KEYS:
        row[key] += case.get(key, 0)
    row["xla_compilations"] = row["programs"] - row["cache_hits"]


def format_profile(rows: dict, total: float) -> str:
    """The table `odeattn conformance --profile` prints: a row per backend (wall time first,
    then the phases, then the counters) and the run's own wall time."""
    w = max([len("backend")] + [len(n) for n in rows]) + 2
    names = ("wall",) + PHASES
    short = {"construction": "construct", "compilation": "compile", "comparison": "compare"}
    head = f"{'backend':<{w}}" + "".join(f"{short.get(n, n):>10}" for n in names)
    head += f"{'workers':>8}{'programs':>9}{'cached':>7}{'XLA':>6}{'exports':>8}{'sessions':>9}"
    lines = [f"profile (seconds; the phases summed over each backend's workers; run wall time {total:.1f} s):", head]
    for name, row in rows.items():
        lines.append(f"{name:<{w}}" + "".join(f"{row[n]:>10.2f}" for n in names)
                     + f"{row['workers']:>8}{row['programs']:>9}{row['cache_hits']:>7}{row['xla_compilations']:>6}"
                     + f"{row['exports']:>8}{row['sessions']:>9}")
    lines.append("(programs: JAX programs lowered for XLA; cached: read from the persistent cache; XLA: compiled; "
                 "exports and sessions: ONNX exports and runtime sessions built)")
    return "\n".join(lines)

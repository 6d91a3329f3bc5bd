"""This process's compilation counters: what a worker, and the adapters it runs, count while they
work, and report with each reply (running/profile.py sums them per backend).

compilation is seconds: JAX's tracing, lowering and XLA compiling (jax.monitoring's events, read
from the persistent cache included), every export to ONNX and every runtime session built
(compiling). The counts: programs (JAX programs lowered and handed to XLA), cache_hits (those
read from the persistent cache instead of compiled), exports and sessions. ARTIFACTS: the files a
runtime's own worker ran during the current request, which the reply names by digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time

# this process's totals (a worker's): the seconds spent compiling and the counts, read before and
# after each call to report the call's share
TOTALS = {"compilation": 0.0, "jax_trace": 0.0, "jax_lower": 0.0, "jax_xla": 0.0, "programs": 0, "cache_hits": 0,
          "exports": 0, "sessions": 0}

_JAX_COMPILE = {"/jax/core/compile/jaxpr_trace_duration": "jax_trace",
                "/jax/core/compile/jaxpr_to_mlir_module_duration": "jax_lower",
                "/jax/core/compile/backend_compile_duration": "jax_xla"}
_JAX_PROGRAM = "/jax/core/compile/backend_compile_duration"  # one per program compiled or read from the cache
_JAX_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_watching_jax = [False]
# the artifacts a runtime's own worker ran for this process during the current request, in order:
# {"target": the export's --target ("onnx": an ONNX file an external row ran), "sha256", "bytes"};
# the worker's reply carries them, and empties the list before the next request
ARTIFACTS: list[dict] = []


@contextlib.contextmanager
def compiling(counter: str):
    """Count one `counter` ("exports", "sessions") and add the block's seconds to compilation."""
    start = time.perf_counter()
    try:
        yield
    finally:
        TOTALS["compilation"] += time.perf_counter() - start
        TOTALS[counter] += 1


def _on_duration(event: str, seconds: float, **_) -> None:
    if event in _JAX_COMPILE:
        TOTALS["compilation"] += seconds
        TOTALS[_JAX_COMPILE[event]] += seconds
    if event == _JAX_PROGRAM:
        TOTALS["programs"] += 1


def _on_event(event: str, **_) -> None:
    if event == _JAX_CACHE_HIT:
        TOTALS["cache_hits"] += 1


def watch_jax() -> None:
    """Count JAX's compilations from now on, if this process has imported JAX (never imports it)."""
    if _watching_jax[0] or "jax" not in sys.modules:
        return
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_on_duration)
    monitoring.register_event_listener(_on_event)
    _watching_jax[0] = True


def artifact(target: str, data: bytes) -> dict:
    """An artifact's record: ran() adds it to the current request's."""
    return {"target": target, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def ran(record: dict) -> None:
    """The artifact ran in the current request (once each, however often it is called)."""
    if record not in ARTIFACTS:
        ARTIFACTS.append(record)


def snapshot() -> dict:
    return dict(TOTALS)


def since(before: dict) -> dict:
    """What TOTALS gained since `before` (a snapshot)."""
    return {k: TOTALS[k] - before[k] for k in TOTALS}

"""The worker process that runs one backend, so nothing it does reaches another backend's verdict
(a backend that shares its process, BackendRef.shares_process, may be followed by another: a
second init replaces it).

The run (conformance.running.pool) starts `python -m conformance.running.worker IN OUT` with two pipe file
descriptors. Messages are frames (wire/frames.py): a JSON object and a safetensors payload of arrays.
Nothing is pickled. These messages are the suite's own, not the public protocol (an external
backend's program speaks that one, adapters/external.py, to an adapter running in this worker):
a run names a case kind, whose block case a backend answers with f0 and its trajectory as well.

    init  {"op": "init", "reference", "sys_path", "imports"} -> {"name", "dtypes", "profile"} or {"error", "traceback"}
          with "describe": true, also "methods" (its optional ones) and "support" (or "support_error")
    supports {"op": "supports", "config", "dtype"} -> {"status": "answered", "reason"} or {"status": "error", ...}
    run   {"op": "run", "case", "kind", "dtype", "config", "prompt"?} + x, padding_mask, param/<name>, z1_bar?
          -> {"status": "skipped", "message"} | {"status": "ran"} + the kind's outputs (a block case:
             f0, trajectory or z1) | {"status": "error", "message", "traceback"}; each with "profile",
             and "artifacts" where the backend sent files to a runtime's worker (their sha256)
          kind: a case kind's name (cases/kinds.py, whose request_fields and request_arrays add
          prompt and z1_bar, named as the public protocol names them)
    stages {"op": "stages", "case", "dtype", "config"} + x, padding_mask, param/<name>
          -> the backend's run_stages (stage -> array), for a failure's triage (requests.stages_frame)
    exit  {"op": "exit"}

A profile (wire/counters.py, running/profile.py) is what the worker measured: at init, the seconds importing and
constructing the backend; per case, the seconds the backend's calls took, the compilation among
them, and the programs, cache hits, exports and sessions counted.

The worker only runs the backend: it never sees a golden output, and the comparison happens in
the run's process. Every call gets fresh arrays, so a backend writing into its inputs changes
nothing but its own result. The backend's prints go to stderr; any exception, SystemExit
included, is its result for that call.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from ..wire.frames import _write_all, encode, read_frame, write_frame
from ..wire.lifetime import PARENT_VARIABLE, arm
from ..adapters.protocol import NotSupported
from ..adapters.support import outside, support_of
from ..cases.case import numbers
from ..cases.kinds import kind_of
from ..wire import counters
from .client import OPTIONAL
from ..adapters import check_adapter, make_adapter
import ode_ref as R

def _failure(err: BaseException) -> dict:
    try:
        text = str(err)
    except BaseException:  # an exception whose __str__ raises
        text = "<the exception's str() raised>"
    return {"message": f"{type(err).__name__}: {text}", "traceback": traceback.format_exc()}


def unsupported(adapter, config, dtype, kind) -> str | None:
    """Why the adapter does not run a case of this kind (cases/kinds.py) and config, or None: a
    config outside its declared support (adapters/support.py), its supports() answer, or the lack
    of the optional method the kind needs (not supported, not failed). A kind whose configs no
    declared support covers (the encoder's) is asked of supports() only when the method is there."""
    if not kind.declared_support:
        return kind.missing(adapter) or check_supports(adapter.supports(config, dtype))
    return outside(support_of(adapter), config) or check_supports(adapter.supports(config, dtype)) or kind.missing(adapter)


def attempt(adapter, kind, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> tuple[dict, dict]:
    """(reply, outputs) of one case: skipped for unsupported()'s reason or a NotSupported raised
    by the backend (protocol.py), else ran with the kind's call (message and arrays: the run
    request's fields and its inputs beside x, the mask and the parameters). Anything else raised
    is the caller's to report as the backend's error."""
    reason = unsupported(adapter, config, dtype, kind)
    if reason is not None:
        return {"status": "skipped", "message": reason}, {}
    try:
        return {"status": "ran"}, kind.call(adapter, config, params, x, padding_mask, dtype, message, arrays)
    except NotSupported as err:
        return {"status": "skipped", "message": str(err)}, {}


def stage_values(adapter, config, params, x, padding_mask, dtype) -> tuple[dict, dict]:
    """(reply, stage -> array) of the optional run_stages (cases/stages.py), for a failure's triage;
    skipped when the backend has none."""
    if getattr(adapter, "run_stages", None) is None:
        return {"status": "skipped", "message": "the backend has no run_stages"}, {}
    got = adapter.run_stages(config, params, x, padding_mask, dtype)
    if not isinstance(got, dict):
        raise TypeError(f"run_stages: expected a dict of stage -> array; got {type(got).__name__}")
    return {"status": "ran"}, {str(k): numbers(f"run_stages: stage {k}", v) for k, v in got.items()}


def check_supports(reason) -> str | None:
    """supports() must return None or a string; anything else is the backend's error."""
    if reason is None or isinstance(reason, str):
        return reason
    raise TypeError(f"supports() must return None or a reason string; got {reason!r}")


def _construct(message: dict) -> tuple:
    """(the adapter or None, the init reply); with "describe", the reply also holds its optional
    methods and its declared support (or why that is malformed), for a client.RemoteAdapter."""

    sys.path[:] = message["sys_path"]
    timings = {}
    try:
        adapter = make_adapter(message["reference"], timings, message.get("imports", ()))
        counters.watch_jax()
        reply = {"name": adapter.name, "dtypes": list(check_adapter(adapter)), "profile": timings}
        if message.get("describe"):
            reply["methods"] = [m for m in OPTIONAL if getattr(adapter, m, None) is not None]
            try:
                reply["support"] = {"config": {k: list(v) for k, v in support_of(adapter).items()}}
            except ValueError as err:
                reply["support_error"] = str(err)
        return adapter, reply
    except BaseException as err:  # SystemExit from a plug-in is its error
        failure = _failure(err)
        return None, {"error": failure["message"], "traceback": failure["traceback"]}


CONFIG_TYPES = {c.__name__: c for c in (R.ODEConfig, R.ODEEncoderConfig, R.LMConfig)}  # a supports request's config_type


def supports_answer(adapter, message: dict) -> dict:
    """The reply to {"op": "supports", "config", "config_type" (default ODEConfig), "dtype"}:
    {"status": "answered", "reason": the backend's supports() answer}, or its error (it raised, or
    answered neither None nor a string)."""

    try:
        kind = message.get("config_type", "ODEConfig")
        if kind not in CONFIG_TYPES:
            raise ValueError(f"config_type: expected one of {', '.join(CONFIG_TYPES)}; got {kind!r}")
        config = CONFIG_TYPES[kind].from_any(message["config"])
        return {"status": "answered", "reason": check_supports(adapter.supports(config, message["dtype"]))}
    except BaseException as err:  # SystemExit too: the backend's answer
        return {"status": "error", **_failure(err)}


def serve(fd_in: int, fd_out: int) -> None:
    adapter = None
    while True:
        try:
            message, arrays = read_frame(fd_in)
        except EOFError:
            return
        op = message["op"]
        if op == "exit":
            return
        if op == "init":
            adapter, reply = _construct(message)
            write_frame(fd_out, reply)
            continue
        if op == "supports":
            write_frame(fd_out, supports_answer(adapter, message))
            continue
        out = {}  # op "run" or "stages"
        counters.watch_jax()  # a backend that imported JAX in its last call
        before, start = counters.snapshot(), time.perf_counter()
        counters.ARTIFACTS.clear()
        try:
            params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
            if op == "stages":
                config = R.ODEConfig.from_any(message["config"])
                reply, out = stage_values(adapter, config, params, arrays["x"], arrays.get("padding_mask"), message["dtype"])
            else:
                kind = kind_of(message.get("kind"), "run: kind")
                reply, out = attempt(adapter, kind, kind.config_type.from_any(message["config"]), params, arrays["x"],
                                     arrays.get("padding_mask"), message["dtype"], message, arrays)
        except BaseException as err:  # a backend's crash is its result
            out, reply = {}, {"status": "error", **_failure(err)}
        reply["profile"] = {"seconds": time.perf_counter() - start, **counters.since(before)}
        if counters.ARTIFACTS:
            reply["artifacts"] = list(counters.ARTIFACTS)
        try:
            frame = encode(reply, out)
        except Exception as err:  # an output safetensors cannot hold (object dtype, ...)
            kept = {k: reply[k] for k in ("profile", "artifacts") if k in reply}  # what the worker measured and ran
            frame = encode({"status": "error", **_failure(err), **kept})
        _write_all(fd_out, frame)


def main() -> None:
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    if PARENT_VARIABLE in os.environ:
        arm(int(os.environ.pop(PARENT_VARIABLE)))  # die with the run, even a kill -9 of it (wire/lifetime.py)
    serve(fd_in, fd_out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: a backend's threads cannot hold the worker open


if __name__ == "__main__":
    main()

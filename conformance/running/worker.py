"""The worker process that runs one backend, so nothing it does reaches another backend's verdict
(a backend that shares its process, BackendRef.shares_process, may be followed by another: a
second init replaces it).

The run (conformance.running.pool) starts `python -m conformance.running.worker IN OUT` with two pipe file
descriptors. Messages are frames (frames.py): a JSON object and a safetensors payload of arrays.
Nothing is pickled. (An external backend's program speaks the public protocol of external.py to
an adapter running in this worker.)

    init  {"op": "init", "reference", "sys_path", "imports"} -> {"name", "dtypes", "profile"} or {"error", "traceback"}
          with "describe": true, also "methods" (its optional ones) and "support" (or "support_error")
    supports {"op": "supports", "config", "dtype"} -> {"status": "answered", "reason"} or {"status": "error", ...}
    run   {"op": "run", "case", "dtype", "config"} + x, padding_mask, param/<name>
          -> {"status": "skipped", "message"} | {"status": "ran"} + f0, trajectory or z1
             | {"status": "error", "message", "traceback"}; each with "profile"
          with "stages": true, the backend's run_stages instead (stage -> array), for a failure's triage
    exit  {"op": "exit"}

A profile (conformance.running.profile) is what the worker measured: at init, the seconds importing and
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

import numpy as np

from .frames import _write_all, encode, read_frame, write_frame
from .lifetime import PARENT_VARIABLE, arm

def _failure(err: BaseException) -> dict:
    try:
        text = str(err)
    except BaseException:  # an exception whose __str__ raises
        text = "<the exception's str() raised>"
    return {"message": f"{type(err).__name__}: {text}", "traceback": traceback.format_exc()}


def unsupported(adapter, config, dtype, decoded: int = 0, vjp: bool = False, encoder: bool = False) -> str | None:
    """Why the adapter does not run this case, or None: a config outside its declared support
    (adapters/support.py), its supports() answer, or, for a decode, grad or encoder case, the lack
    of run_decode, run_vjp or run_encoder (optional methods: not supported, not failed). An adapter
    without run_encoder is never asked about an encoder config."""
    from ..adapters.support import outside, support_of

    if encoder:
        if getattr(adapter, "run_encoder", None) is None:
            return "not supported: the encoder stack (the backend has no run_encoder)"
        return check_supports(adapter.supports(config, dtype))
    # a config outside what the backend declares (support.py) is refused without asking it
    reason = outside(support_of(adapter), config) or check_supports(adapter.supports(config, dtype))
    if reason is None and decoded and getattr(adapter, "run_decode", None) is None:
        reason = "not supported: cached decoding (the backend has no run_decode)"
    if reason is None and vjp and getattr(adapter, "run_vjp", None) is None:
        reason = "not supported: gradients (the backend has no run_vjp)"
    return reason


def numbers(method: str, value) -> np.ndarray:
    """A backend's output as an array; TypeError naming the method if it holds no numbers (a str, a
    dict, a generator: NumPy makes them text or object arrays, which no reply can carry)."""
    a = np.asarray(value)
    if a.dtype.kind in "OSU":
        raise TypeError(f"{method}: expected an array of numbers; got {type(value).__name__}"
                        + (f" ({a.dtype})" if isinstance(value, np.ndarray) else ""))
    return a


def collect_outputs(adapter, config, params, x, padding_mask, dtype, decoded: int = 0, z1_bar=None,
                    encoder: bool = False) -> dict:
    """quantity -> array from one adapter: for an encoder case, run_encoder's z; for a decode case,
    its run_decode output; for a grad case (z1_bar given), run_vjp's x_bar and grad.<parameter>; else f0 and the trajectory if it
    provides them (an attribute set to None counts as absent), else z1. Each call gets its own
    copies of the inputs."""
    def fresh():
        return ({k: v.copy() for k, v in params.items()}, x.copy(), None if padding_mask is None else padding_mask.copy())

    out = {}
    if encoder:
        p, xx, m = fresh()
        return {"z": numbers("run_encoder", adapter.run_encoder(config, p, xx, m, dtype))}
    if z1_bar is not None:
        p, xx, m = fresh()
        x_bar, params_bar = adapter.run_vjp(config, p, xx, m, z1_bar.copy(), dtype)
        if not isinstance(params_bar, dict) or set(params_bar) != set(params):
            got = sorted(params_bar) if isinstance(params_bar, dict) else type(params_bar).__name__
            raise ValueError(f"run_vjp: expected (x_bar, a dict with every parameter name {sorted(params)}); got {got}")
        out["x_bar"] = numbers("run_vjp: x_bar", x_bar)
        out.update({f"grad.{k}": numbers(f"run_vjp: grad.{k}", params_bar[k]) for k in params})
        return out
    if decoded:
        p, xx, m = fresh()
        out["decode"] = numbers("run_decode", adapter.run_decode(config, p, xx, m, x.shape[1] - decoded, dtype))
        return out
    if getattr(adapter, "run_func", None) is not None:
        p, xx, m = fresh()
        out["f0"] = numbers("run_func", adapter.run_func(config, p, 0.0, xx, m, dtype))
    if getattr(adapter, "run_trajectory", None) is not None:
        p, xx, m = fresh()
        out["trajectory"] = numbers("run_trajectory", adapter.run_trajectory(config, p, xx, m, dtype))
    else:
        p, xx, m = fresh()
        out["z1"] = numbers("run_block", adapter.run_block(config, p, xx, m, dtype))
    return out


def attempt(adapter, config, params, x, padding_mask, dtype, decoded: int = 0, z1_bar=None,
            encoder: bool = False) -> tuple[dict, dict]:
    """(reply, outputs) of one case: skipped for unsupported()'s reason or a NotSupported raised
    by the backend (protocol.py), else ran with collect_outputs'. Anything else raised is the
    caller's to report as the backend's error."""
    from ..adapters.protocol import NotSupported

    reason = unsupported(adapter, config, dtype, decoded, z1_bar is not None, encoder)
    if reason is not None:
        return {"status": "skipped", "message": reason}, {}
    try:
        return {"status": "ran"}, collect_outputs(adapter, config, params, x, padding_mask, dtype, decoded, z1_bar, encoder)
    except NotSupported as err:
        return {"status": "skipped", "message": str(err)}, {}


def stage_values(adapter, config, params, x, padding_mask, dtype) -> tuple[dict, dict]:
    """(reply, stage -> array) of the optional run_stages (fuzzing/stages.py), for a failure's triage;
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
    from . import profile
    from .client import OPTIONAL
    from ..adapters import check_adapter, make_adapter
    from ..adapters.support import support_of

    sys.path[:] = message["sys_path"]
    timings = {}
    try:
        adapter = make_adapter(message["reference"], timings, message.get("imports", ()))
        profile.watch_jax()
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


def supports_answer(adapter, message: dict) -> dict:
    """The reply to {"op": "supports", "config", "dtype"}: {"status": "answered", "reason": the
    backend's supports() answer}, or its error (it raised, or answered neither None nor a string)."""
    import ode_ref as R

    try:
        return {"status": "answered",
                "reason": check_supports(adapter.supports(R.ODEConfig.from_any(message["config"]), message["dtype"]))}
    except BaseException as err:  # SystemExit too: the backend's answer
        return {"status": "error", **_failure(err)}


def serve(fd_in: int, fd_out: int) -> None:
    import ode_ref as R

    from . import profile

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
        # op == "run"
        out = {}
        profile.watch_jax()  # a backend that imported JAX in its last call
        before, start = profile.snapshot(), time.perf_counter()
        try:
            encoder = message.get("encoder", False)
            config = (R.ODEEncoderConfig if encoder else R.ODEConfig).from_any(message["config"])
            params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
            if message.get("stages"):
                reply, out = stage_values(adapter, config, params, arrays["x"], arrays.get("padding_mask"), message["dtype"])
            else:
                reply, out = attempt(adapter, config, params, arrays["x"], arrays.get("padding_mask"), message["dtype"],
                                     message.get("decoded", 0), arrays.get("z1_bar"), encoder)
        except BaseException as err:  # a backend's crash is its result
            out, reply = {}, {"status": "error", **_failure(err)}
        reply["profile"] = {"seconds": time.perf_counter() - start, **profile.since(before)}
        try:
            frame = encode(reply, out)
        except Exception as err:  # an output safetensors cannot hold (object dtype, ...)
            frame = encode({"status": "error", **_failure(err), "profile": reply["profile"]})
        _write_all(fd_out, frame)


def main() -> None:
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    if PARENT_VARIABLE in os.environ:
        arm(int(os.environ.pop(PARENT_VARIABLE)))  # die with the run, even a kill -9 of it (lifetime.py)
    serve(fd_in, fd_out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: a backend's threads cannot hold the worker open


if __name__ == "__main__":
    main()

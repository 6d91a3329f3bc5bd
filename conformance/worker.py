"""The worker process that runs one backend, so nothing it does reaches another backend's verdict.

The run (conformance.pool) starts `python -m conformance.worker IN OUT` with two pipe file
descriptors. Messages are frames: an 8-byte header (JSON length, payload length, little-endian
uint32), a UTF-8 JSON object, and an optional safetensors payload of arrays. Nothing is pickled.

    init  {"op": "init", "reference", "sys_path", "imports"} -> {"name", "dtypes", "profile"} or {"error", "traceback"}
    run   {"op": "run", "case", "dtype", "config"} + x, padding_mask, param/<name>
          -> {"status": "skipped", "message"} | {"status": "ran"} + f0, trajectory or z1
             | {"status": "error", "message", "traceback"}; each with "profile"
    exit  {"op": "exit"}

A profile (conformance.profile) is what the worker measured: at init, the seconds importing and
constructing the backend; per case, the seconds the backend's calls took, the compilation among
them, and the programs, cache hits, exports and sessions counted.

The worker only runs the backend: it never sees a golden output, and the comparison happens in
the run's process. Every call gets fresh arrays, so a backend writing into its inputs changes
nothing but its own result. The backend's prints go to stderr; any exception, SystemExit
included, is its result for that call.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import traceback

import numpy as np

HEADER = struct.Struct("<II")


def encode(message: dict, arrays: dict | None = None) -> bytes:
    from safetensors.numpy import save

    payload = save({k: np.asarray(v, order="C") for k, v in arrays.items()}) if arrays else b""
    body = json.dumps(message).encode()
    return HEADER.pack(len(body), len(payload)) + body + payload


def decode(body: bytes, payload: bytes) -> tuple[dict, dict]:
    from safetensors.numpy import load

    return json.loads(body), (load(payload) if payload else {})


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict, dict]:
    n_body, n_payload = HEADER.unpack(_read_exact(fd, HEADER.size))
    return decode(_read_exact(fd, n_body), _read_exact(fd, n_payload))


def _write_all(fd: int, frame: bytes) -> None:
    data = memoryview(frame)
    while data:
        data = data[os.write(fd, data):]


def write_frame(fd: int, message: dict, arrays: dict | None = None) -> None:
    _write_all(fd, encode(message, arrays))


def _failure(err: BaseException) -> dict:
    try:
        text = str(err)
    except BaseException:  # noqa: B036 -- an exception whose __str__ raises
        text = "<the exception's str() raised>"
    return {"message": f"{type(err).__name__}: {text}", "traceback": traceback.format_exc()}


def unsupported(adapter, config, dtype, decoded: int = 0, vjp: bool = False, encoder: bool = False) -> str | None:
    """Why the adapter does not run this case, or None: its supports() answer, or, for a decode,
    grad or encoder case, the lack of run_decode, run_vjp or run_encoder (optional methods: not
    supported, not failed). An adapter without run_encoder is never asked about an encoder config."""
    if encoder:
        if getattr(adapter, "run_encoder", None) is None:
            return "not supported: the encoder stack (the backend has no run_encoder)"
        return check_supports(adapter.supports(config, dtype))
    reason = check_supports(adapter.supports(config, dtype))
    if reason is None and decoded and getattr(adapter, "run_decode", None) is None:
        reason = "not supported: cached decoding (the backend has no run_decode)"
    if reason is None and vjp and getattr(adapter, "run_vjp", None) is None:
        reason = "not supported: gradients (the backend has no run_vjp)"
    return reason


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
        return {"z": np.asarray(adapter.run_encoder(config, p, xx, m, dtype))}
    if z1_bar is not None:
        p, xx, m = fresh()
        x_bar, params_bar = adapter.run_vjp(config, p, xx, m, z1_bar.copy(), dtype)
        if not isinstance(params_bar, dict) or set(params_bar) != set(params):
            got = sorted(params_bar) if isinstance(params_bar, dict) else type(params_bar).__name__
            raise ValueError(f"run_vjp: expected (x_bar, a dict with every parameter name {sorted(params)}); got {got}")
        out["x_bar"] = np.asarray(x_bar)
        out.update({f"grad.{k}": np.asarray(params_bar[k]) for k in params})
        return out
    if decoded:
        p, xx, m = fresh()
        out["decode"] = np.asarray(adapter.run_decode(config, p, xx, m, x.shape[1] - decoded, dtype))
        return out
    if getattr(adapter, "run_func", None) is not None:
        p, xx, m = fresh()
        out["f0"] = np.asarray(adapter.run_func(config, p, 0.0, xx, m, dtype))
    if getattr(adapter, "run_trajectory", None) is not None:
        p, xx, m = fresh()
        out["trajectory"] = np.asarray(adapter.run_trajectory(config, p, xx, m, dtype))
    else:
        p, xx, m = fresh()
        out["z1"] = np.asarray(adapter.run_block(config, p, xx, m, dtype))
    return out


def check_supports(reason) -> str | None:
    """supports() must return None or a string; anything else is the backend's error."""
    if reason is None or isinstance(reason, str):
        return reason
    raise TypeError(f"supports() must return None or a reason string; got {reason!r}")


def serve(fd_in: int, fd_out: int) -> None:
    import ode_ref as R

    from . import profile
    from .adapters import check_adapter, make_adapter

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
            sys.path[:] = message["sys_path"]
            timings = {}
            try:
                adapter = make_adapter(message["reference"], timings, message.get("imports", ()))
                profile.watch_jax()
                reply = {"name": adapter.name, "dtypes": list(check_adapter(adapter)), "profile": timings}
            except BaseException as err:  # noqa: B036 -- SystemExit from a plug-in is its error
                failure = _failure(err)
                reply = {"error": failure["message"], "traceback": failure["traceback"]}
            write_frame(fd_out, reply)
            continue
        # op == "run"
        out = {}
        profile.watch_jax()  # a backend that imported JAX in its last call
        before, start = profile.snapshot(), time.perf_counter()
        try:
            encoder = message.get("encoder", False)
            config = (R.ODEEncoderConfig if encoder else R.ODEConfig).from_any(message["config"])
            dtype, decoded, vjp = message["dtype"], message.get("decoded", 0), message.get("vjp", False)
            reason = unsupported(adapter, config, dtype, decoded, vjp, encoder)
            if reason is not None:
                reply = {"status": "skipped", "message": reason}
            else:
                params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
                out = collect_outputs(adapter, config, params, arrays["x"], arrays.get("padding_mask"), dtype, decoded,
                                      arrays.get("z1_bar"), encoder)
                reply = {"status": "ran"}
        except BaseException as err:  # noqa: B036 -- a backend's crash is its result
            out, reply = {}, {"status": "error", **_failure(err)}
        reply["profile"] = {"seconds": time.perf_counter() - start, **profile.since(before)}
        try:
            frame = encode(reply, out)
        except Exception as err:  # an output safetensors cannot hold (object dtype, ...)
            frame = encode({"status": "error", **_failure(err), "profile": reply["profile"]})
        _write_all(fd_out, frame)


def main() -> None:
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    serve(fd_in, fd_out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: a backend's threads cannot hold the worker open


if __name__ == "__main__":
    main()

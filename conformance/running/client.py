"""One backend in a worker process of its own, asked one request at a time: how the fuzzer, its
replay and the pytest plugin run a port, so that a port that hangs, crashes its process or exits
gives a result with a deadline, never the command's hang, exit or traceback.

RemoteAdapter starts `python -m odeattn.conformance.running.worker` (pool.Worker, worker.py),
sends it init, and then a frame per request (wire/frames.py), each answered within the timeout. A
worker that outlives it, dies (a signal, os._exit) or announces a reply larger than its case can
produce is killed: the request's answer is an error reply saying so (RemoteAdapter.lost holds
why), and the next request starts a fresh worker. It has an adapter's attributes (name, dtypes,
its declared support, which optional methods it has), read from the init reply; supports() and
run_stages() ask the worker, and run_request() sends a case's run request (requests.request_frame's).
"""

from __future__ import annotations

import selectors
import time
from typing import Optional

from ..wire.frames import encode
from ..wire.lifetime import describe_exit
from .pool import INIT_REPLY_LIMIT, Worker
from .requests import stages_frame

OPTIONAL = ("run_func", "run_trajectory", "run_decode", "run_vjp", "run_stages", "run_encoder")  # an init reply's "methods"
REPLY_LIMIT = 1 << 20  # bytes: a supports() answer, or an error's traceback


class ConstructionFailed(Exception):
    """The worker could not construct the backend (its error, or the worker lost): the message."""


class BackendFault(Exception):
    """The backend failed a request (raised, answered garbage, hung or killed its worker); reply
    is the error reply, {"status": "error", "message", "traceback"}."""

    def __init__(self, reply: dict):
        super().__init__(reply.get("message", "error"))
        self.reply = reply


class Lost(Exception):
    """The worker timed out, died or oversent: why (wire.lifetime.describe_exit's words)."""


class RemoteAdapter:
    """A backend reference ('module:object', 'entry-point:NAME', exec:CMD) run in a worker process.
    timeout: the seconds one request may take; init_timeout: to start the worker and construct
    the backend (None: timeout). ConstructionFailed if it cannot be constructed; ValueError
    (beginning 'its declared support') for a malformed declared support."""

    remote = True

    def __init__(self, reference: str, *, imports=(), timeout: float = 120.0, init_timeout: Optional[float] = None):
        self.reference, self.imports, self.timeout = reference, tuple(imports), timeout
        self.init_timeout = timeout if init_timeout is None else init_timeout
        self.worker: Optional[Worker] = None
        self.lost = ""  # why the last request's worker was lost, or ""
        hello = self._start()
        if "support_error" in hello:
            self.close()
            raise ValueError(hello["support_error"])
        self.name, self.dtypes, self.support = hello["name"], tuple(hello["dtypes"]), hello.get("support")
        for method in OPTIONAL:  # present or None, as an in-process adapter's optional methods are
            setattr(self, method, None)
        for method in hello.get("methods", ()):
            setattr(self, method, self.run_stages_in_worker if method == "run_stages" else self.runs_in_worker)

    def runs_in_worker(self, *args, **kwargs):
        """The optional methods the worker has: run_request runs them there."""
        raise TypeError(f"{self.name}: the backend runs in a worker process; run a case with run_request")

    def _start(self) -> dict:
        """A fresh worker with the backend constructed: its init reply. ConstructionFailed otherwise."""
        import sys

        self.worker = Worker(0, threads=1)  # a fuzz example's arrays are small: more threads only contend
        init = {"op": "init", "reference": self.reference, "sys_path": sys.path, "imports": list(self.imports),
                "describe": True}
        try:
            hello, _ = self._exchange(encode(init), self.init_timeout, INIT_REPLY_LIMIT)
        except Lost as why:
            raise ConstructionFailed(f"the worker {why} while constructing the backend") from None
        if "error" in hello:
            self.close()
            raise ConstructionFailed(hello["error"])
        return hello

    def _exchange(self, frame: bytes, timeout: float, limit: int) -> tuple[dict, dict]:
        """Send a request and wait for its reply, both within timeout; Lost (the worker killed) if
        it times out, dies or announces more than limit bytes."""
        w = self.worker
        w.send(frame, timeout, limit)
        sel = selectors.DefaultSelector()
        try:
            sel.register(w.from_child, selectors.EVENT_READ, "r")
            while True:
                if w.outbox and sel.get_map().get(w.to_child) is None:
                    sel.register(w.to_child, selectors.EVENT_WRITE, "w")
                elif not w.outbox and sel.get_map().get(w.to_child) is not None:
                    sel.unregister(w.to_child)
                left = w.deadline - time.perf_counter()
                if left <= 0:
                    raise Lost(f"timed out after {timeout:g} s")
                for key, _ in sel.select(timeout=left):
                    if key.data == "w":
                        w.write()
                        continue
                    try:
                        got = w.read()
                    except EOFError:
                        raise Lost(describe_exit(w.proc.wait())) from None
                    except ValueError as err:
                        raise Lost(str(err)) from None
                    if got is not None:
                        return got
        except Lost:
            self.kill()
            raise
        finally:
            sel.close()

    def request(self, message: dict, arrays: Optional[dict] = None, *, limit: int = REPLY_LIMIT,
                frame: Optional[bytes] = None) -> tuple[dict, dict]:
        """(reply, arrays) of one request; a lost worker's reply is an error saying why (self.lost),
        and a backend that cannot be constructed again, an error saying so."""
        self.lost = ""
        if self.worker is None:
            try:
                self._start()
            except ConstructionFailed as err:
                return {"status": "error", "message": f"not run: the backend could not be constructed again ({err})"}, {}
        try:
            return self._exchange(frame if frame is not None else encode(message, arrays), self.timeout, limit)
        except Lost as why:
            self.lost = str(why)
            return {"status": "error", "message": f"the worker {why} while running this case", "traceback": ""}, {}

    def supports(self, config, dtype: str) -> Optional[str]:
        """The backend's supports() answer (None or a reason); BackendFault if it raised, answered
        something else, or hung."""
        reply, _ = self.request({"op": "supports", "config": config.to_dict(), "config_type": type(config).__name__,
                                 "dtype": dtype})
        if reply.get("status") != "answered":
            raise BackendFault(reply)
        return reply.get("reason")

    def run_request(self, frame: bytes, limit: int) -> tuple[dict, dict]:
        """(reply, outputs) of a case's run request (an encoded frame) whose reply may take limit
        bytes, as worker.attempt gives them (compare.attempt_case's)."""
        reply, arrays = self.request({}, frame=frame, limit=limit)
        reply.pop("profile", None)
        return reply, arrays

    def run_stages_in_worker(self, config, params, x, padding_mask, dtype) -> dict:
        """The backend's run_stages (stage -> array), run in the worker; BackendFault if it failed."""
        reply, out = self.request({}, frame=stages_frame(config, params, x, padding_mask, dtype),
                                  limit=8 * 8 * x.size + REPLY_LIMIT)
        if reply.get("status") != "ran":
            raise BackendFault(reply)
        return out

    def kill(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def close(self) -> None:
        """Ask the worker to exit, and kill it if it has not within a second."""
        import os
        import subprocess

        w, self.worker = self.worker, None
        if w is None:
            return
        try:
            os.write(w.to_child, encode({"op": "exit"}))
        except OSError:
            pass
        try:
            w.proc.wait(timeout=1.0)
            w.close_fds()
        except subprocess.TimeoutExpired:
            w.kill()

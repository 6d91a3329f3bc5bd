"""Worker processes for the run: every backend in processes of its own, up to `jobs` at once.

Scheduling: backends start in order, one worker each, while slots are free; a slot freed when a
backend's queue runs dry goes to the next backend, then to a second (third, ...) worker for the
backend with the most cases left, so a slow backend (JAX compiling) ends up with every core.
A worker that dies (os._exit, a signal) or outlives the per-case timeout is killed; its case
is an error, and a fresh worker takes the rest of that backend's queue.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from .worker import HEADER, decode, encode

MIN_SHARE = 4  # cases left before another worker for the same backend pays for its start-up


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _stderr_fd() -> int:
    """Where a worker's prints go: this process's stderr (fd 2 when stderr is not a real file)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
        return 2


def thread_env(threads: int) -> dict:
    """Environment that keeps a worker's math libraries to its share of the cores."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "ODEATTN_WORKER_THREADS": n}


class Worker:
    """One `python -m conformance.worker` process and its two pipes."""

    def __init__(self, backend_index: int, threads: int):
        self.backend_index = backend_index
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "odeattn.conformance.worker", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=_stderr_fd(),
            start_new_session=True, env={**os.environ, **thread_env(threads)},
        )
        os.close(to_child_r)
        os.close(from_child_w)
        os.set_blocking(self.from_child, False)
        self.buffer = bytearray()
        self.job = None  # what it is doing: ("init",) or a job tuple
        self.deadline = float("inf")
        self.started = 0.0

    def send(self, message: dict, arrays: dict | None, timeout: float) -> None:
        data = memoryview(encode(message, arrays))
        try:
            while data:
                data = data[os.write(self.to_child, data):]
        except (BrokenPipeError, OSError):
            pass  # it died; the read side reports it
        self.started = time.perf_counter()
        self.deadline = self.started + timeout

    def read(self):
        """A complete reply (message, arrays), None if not yet, or EOFError if it died."""
        try:
            chunk = os.read(self.from_child, 1 << 20)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            raise EOFError
        if chunk:
            self.buffer += chunk
        if len(self.buffer) < HEADER.size:
            return None
        n_body, n_payload = HEADER.unpack_from(self.buffer)
        end = HEADER.size + n_body + n_payload
        if len(self.buffer) < end:
            return None
        body = bytes(self.buffer[HEADER.size:HEADER.size + n_body])
        payload = bytes(self.buffer[HEADER.size + n_body:end])
        del self.buffer[:end]
        return decode(body, payload)

    def kill(self) -> str:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self.close_fds()
        return describe_exit(code)

    def stop(self) -> None:
        try:
            os.write(self.to_child, encode({"op": "exit"}))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self.close_fds()

    def close_fds(self) -> None:
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass
class BackendState:
    ref: object  # adapters.BackendRef
    queue: deque = field(default_factory=deque)
    workers: int = 0
    name: str = ""
    dtypes: tuple = ()
    initialised: bool = False
    failed: bool = False  # could not be constructed: no more workers


def run_workers(refs, make_jobs, on_init, on_result, on_backend_error, *, jobs: int, timeout: float,
                should_stop=lambda: False) -> None:
    """Drive every backend's jobs through worker processes.

    make_jobs(backend_index, name, dtypes) -> list of (job, request message, request arrays)
    on_init(backend_index, name, dtypes); on_result(backend_index, job, reply, arrays, seconds);
    on_backend_error(backend_index, message, traceback) for a backend that cannot be constructed.
    A job whose worker dies or times out gets on_result with a synthetic error reply."""
    states = [BackendState(ref) for ref in refs]
    pending = deque(range(len(states)))
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()

    def start(index: int) -> None:
        w = Worker(index, max(1, (os.cpu_count() or 1) // jobs))
        states[index].workers += 1
        w.job = ("init",)
        w.send({"op": "init", "reference": states[index].ref.reference, "sys_path": sys.path}, None, timeout)
        sel.register(w.from_child, selectors.EVENT_READ, w)
        workers.append(w)

    def retire(w: Worker, *, kill: bool = False) -> str:
        sel.unregister(w.from_child)
        workers.remove(w)
        states[w.backend_index].workers -= 1
        return w.kill() if kill else (w.stop() or "")

    def next_job(w: Worker) -> None:
        st = states[w.backend_index]
        if st.queue and not should_stop():
            job, message, arrays = st.queue.popleft()
            w.job = job
            w.send(message, arrays, timeout)
        else:
            retire(w)

    def fill() -> None:
        while len(workers) < jobs and not should_stop():
            if pending:
                start(pending.popleft())
                continue
            open_ = [(len(s.queue) / (s.workers + 1), i) for i, s in enumerate(states)
                     if s.initialised and not s.failed and s.workers and len(s.queue) >= MIN_SHARE * (s.workers + 1)]
            if not open_:
                return
            start(max(open_)[1])

    def lost(w: Worker, why: str) -> None:
        """w died or hung: report its job, and let another worker carry on with the queue."""
        st = states[w.backend_index]
        if w.job == ("init",):
            st.failed = True
            if not st.initialised:
                on_backend_error(w.backend_index, f"the worker died while constructing the backend ({why})", "")
            else:
                while st.queue:  # it was built before: this restart failed; the rest cannot run
                    job, _, _ = st.queue.popleft()
                    on_result(w.backend_index, job, {"status": "error", "message": f"not run: the backend's worker could not be restarted ({why})"}, {}, 0.0)
        else:
            on_result(w.backend_index, w.job, {"status": "error", "message": f"the worker {why} while running this case"}, {},
                      time.perf_counter() - w.started)
            if st.queue and not st.workers and not should_stop():
                pending.appendleft(w.backend_index)

    fill()
    while workers:
        now = time.perf_counter()
        wait = max(0.0, min(w.deadline for w in workers) - now)
        for key, _ in sel.select(timeout=min(wait, 1.0)):
            w = key.data
            try:
                reply = w.read()
            except EOFError:
                why = describe_exit(w.proc.wait())
                retire(w, kill=True)
                lost(w, why)
                continue
            if reply is None:
                continue
            message, arrays = reply
            st = states[w.backend_index]
            if w.job == ("init",):
                if "error" in message:
                    st.failed = True
                    retire(w)
                    if not st.initialised:
                        on_backend_error(w.backend_index, message["error"], message.get("traceback", ""))
                    else:
                        lost(w, f"failed to restart ({message['error']})")
                    continue
                if not st.initialised:
                    st.initialised, st.name, st.dtypes = True, message["name"], tuple(message["dtypes"])
                    if on_init(w.backend_index, st.name, st.dtypes):
                        st.queue.extend(make_jobs(w.backend_index, st.name, st.dtypes))
                    else:
                        st.failed = True
                next_job(w)
            else:
                on_result(w.backend_index, w.job, message, arrays, time.perf_counter() - w.started)
                next_job(w)
        now = time.perf_counter()
        for w in [w for w in workers if w.deadline < now]:
            retire(w, kill=True)
            lost(w, f"timed out after {timeout:g} s")
        fill()

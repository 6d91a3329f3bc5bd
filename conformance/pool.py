"""Worker processes for the run: every backend in processes of its own, up to `jobs` at once.

Scheduling: backends start in order, one worker each, while slots are free; a slot freed when a
backend's queue runs dry goes to the next backend, then to a second (third, ...) worker for the
backend with the most cases left, so a slow backend (JAX compiling) ends up with every core.
A worker that dies (os._exit, a signal), outlives the per-case timeout, or announces a reply
larger than its case can produce is killed; its case is an error, and a fresh worker takes the
rest of that backend's queue. Reads and writes never block the run: both pipes go through one
selector, so every deadline is checked whatever a worker does. When the run ends, however it
ends (an exception, Ctrl-C, SIGTERM turned into SystemExit by the command), no worker outlives it.
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

from .frames import HEADER, decode, encode
from .lifetime import PARENT_VARIABLE

MIN_SHARE = 4  # cases left before another worker for the same backend pays for its start-up
INIT_REPLY_LIMIT = 1 << 20  # bytes: an init reply is a name, dtypes and maybe a traceback


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


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


def core_count() -> int:
    """The cores this process may run on (a CI's CPU limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Worker:
    """One `python -m odeattn.conformance.worker` process and its two non-blocking pipes."""

    def __init__(self, backend_index: int, threads: int):
        self.backend_index = backend_index
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "odeattn.conformance.worker", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=_stderr_fd(),
            start_new_session=True, env={**os.environ, **thread_env(threads), PARENT_VARIABLE: str(os.getpid())},
        )
        os.close(to_child_r)
        os.close(from_child_w)
        os.set_blocking(self.from_child, False)
        os.set_blocking(self.to_child, False)
        self.inbox = bytearray()
        self.outbox = memoryview(b"")
        self.job = None  # what it is doing: ("init",) or a job tuple
        self.limit = INIT_REPLY_LIMIT  # the largest reply it may announce for this job
        self.deadline = float("inf")
        self.started = 0.0
        self.spawned = time.perf_counter()

    def send(self, message: dict, arrays: dict | None, timeout: float, limit: int) -> None:
        """Queue a request; the selector writes it as the pipe takes it."""
        self.outbox = memoryview(encode(message, arrays))
        self.started = time.perf_counter()
        self.deadline = self.started + timeout
        self.limit = limit

    def write(self) -> None:
        try:
            self.outbox = self.outbox[os.write(self.to_child, self.outbox):]
        except BlockingIOError:
            pass
        except OSError:  # it died; the read side reports it
            self.outbox = memoryview(b"")

    def read(self):
        """A complete reply (message, arrays), None if not yet; EOFError if it died, ValueError
        if it announces more than its limit."""
        try:
            chunk = os.read(self.from_child, 1 << 20)
        except BlockingIOError:
            return None
        if chunk == b"":
            raise EOFError
        self.inbox += chunk
        if len(self.inbox) < HEADER.size:
            return None
        n_body, n_payload = HEADER.unpack_from(self.inbox)
        if n_body + n_payload > self.limit:
            raise ValueError(f"announced a reply of {n_body + n_payload} bytes; this case's outputs fit in {self.limit}")
        end = HEADER.size + n_body + n_payload
        if len(self.inbox) < end:
            return None
        view = memoryview(self.inbox)
        message, arrays = decode(bytes(view[HEADER.size:HEADER.size + n_body]), bytes(view[HEADER.size + n_body:end]))
        view.release()
        del self.inbox[:end]
        return message, arrays

    def kill(self) -> str:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self.close_fds()
        return describe_exit(code)

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
    initialised: bool = False
    failed: bool = False  # nothing more runs: not constructible, or refused
    no_more_workers: bool = False  # an extra worker could not be constructed: carry on with those alive


def run_workers(refs, make_jobs, on_init, on_result, on_backend_error, *, jobs: int, timeout: float,
                should_stop=lambda: False, on_started=None, skip=lambda backend_index, job: False) -> None:
    """Drive every backend's jobs through worker processes.

    make_jobs(backend_index, name, dtypes) -> list of (job, request message, request arrays,
    reply limit in bytes); on_init(backend_index, name, dtypes) -> bool (False: refuse it);
    on_result(backend_index, job, reply, arrays, seconds); on_backend_error(backend_index, message,
    traceback) for a backend that cannot be constructed. A job whose worker dies, hangs or
    oversends gets on_result with an error reply. on_started(backend_index, profile, seconds), if
    given, for every worker whose backend was constructed (and not refused): the worker's init
    profile and the seconds from its spawn to its init reply. skip(backend_index, job), asked of
    each job as it comes up: True drops it unrun (the caller accounts for it)."""
    states = [BackendState(ref) for ref in refs]
    pending = deque(range(len(states)))
    workers: list[Worker] = []
    stopping: list[Worker] = []
    sel = selectors.DefaultSelector()
    threads = max(1, core_count() // jobs)

    def send(w: Worker, message, arrays, limit) -> None:
        w.send(message, arrays, timeout, limit)
        w.write()
        if w.outbox:
            sel.register(w.to_child, selectors.EVENT_WRITE, (w, "w"))

    def start(index: int) -> None:
        w = Worker(index, threads)
        states[index].workers += 1
        workers.append(w)
        sel.register(w.from_child, selectors.EVENT_READ, (w, "r"))
        w.job = ("init",)
        ref = states[index].ref
        send(w, {"op": "init", "reference": ref.reference, "sys_path": sys.path, "imports": list(ref.imports)},
             None, INIT_REPLY_LIMIT)

    def retire(w: Worker, *, kill: bool = False) -> str:
        for fd in (w.from_child, w.to_child):
            try:
                sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        workers.remove(w)
        states[w.backend_index].workers -= 1
        if kill:
            return w.kill()
        try:
            os.write(w.to_child, encode({"op": "exit"}))
        except OSError:
            pass
        w.close_fds()
        stopping.append(w)
        return ""

    def next_job(w: Worker) -> None:
        st = states[w.backend_index]
        while st.queue and skip(w.backend_index, st.queue[0][0]):
            st.queue.popleft()
        if st.queue and not st.failed and not should_stop():
            job, message, arrays, limit = st.queue.popleft()
            w.job = job
            send(w, message, arrays, limit)
        else:
            retire(w)

    def fill() -> None:
        while len(workers) < jobs and not should_stop():
            if pending:
                start(pending.popleft())
                continue
            open_ = [(len(s.queue) / (s.workers + 1), i) for i, s in enumerate(states)
                     if s.initialised and not s.failed and not s.no_more_workers and s.workers
                     and len(s.queue) >= MIN_SHARE * (s.workers + 1)]
            if not open_:
                return
            start(max(open_)[1])

    def init_failed(w: Worker, message: str, tb: str) -> None:
        st = states[w.backend_index]
        if not st.initialised:
            st.failed = True
            on_backend_error(w.backend_index, message, tb)
        elif st.workers:  # an extra worker: the ones alive carry on, no more are started
            st.no_more_workers = True
        else:  # a restart after a crash failed: nothing can run the rest
            st.failed = True
            while st.queue:
                job = st.queue.popleft()[0]
                on_result(w.backend_index, job, {"status": "error", "message": f"not run: {message}"}, {}, 0.0)

    def lost(w: Worker, why: str) -> None:
        """w died, hung or oversent: report what it was doing, and let a fresh worker go on."""
        st = states[w.backend_index]
        if w.job == ("init",):
            init_failed(w, f"the worker {why} while constructing the backend", "")
            return
        on_result(w.backend_index, w.job, {"status": "error", "message": f"the worker {why} while running this case"}, {},
                  time.perf_counter() - w.started)
        if st.queue and not st.workers and not st.failed and not should_stop():
            pending.appendleft(w.backend_index)

    try:
        fill()
        while workers:
            wait = max(0.0, min(w.deadline for w in workers) - time.perf_counter())
            for key, _ in sel.select(timeout=min(wait, 1.0)):
                w, direction = key.data
                if w not in workers:
                    continue
                if direction == "w":
                    w.write()
                    if not w.outbox:
                        sel.unregister(w.to_child)
                    continue
                try:
                    reply = w.read()
                except EOFError:
                    why = describe_exit(w.proc.wait())
                    retire(w, kill=True)
                    lost(w, why)
                    continue
                except ValueError as err:
                    retire(w, kill=True)
                    lost(w, str(err))
                    continue
                if reply is None:
                    continue
                message, arrays = reply
                st = states[w.backend_index]
                if w.job == ("init",):
                    if "error" in message:
                        retire(w)
                        init_failed(w, message["error"], message.get("traceback", ""))
                        continue
                    if not st.initialised:
                        st.initialised = True
                        if on_init(w.backend_index, message["name"], tuple(message["dtypes"])):
                            st.queue.extend(make_jobs(w.backend_index, message["name"], tuple(message["dtypes"])))
                        else:
                            st.failed = True
                    if on_started and not st.failed:
                        on_started(w.backend_index, message.get("profile", {}), time.perf_counter() - w.spawned)
                    next_job(w)
                else:
                    on_result(w.backend_index, w.job, message, arrays, time.perf_counter() - w.started)
                    next_job(w)
            now = time.perf_counter()
            for w in [w for w in workers if w.deadline < now]:
                retire(w, kill=True)
                lost(w, f"timed out after {timeout:g} s")
            fill()
    finally:
        for w in list(workers):
            w.kill()
        deadline = time.perf_counter() + 5.0
        for w in stopping:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                w.kill()
        sel.close()

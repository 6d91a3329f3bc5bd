"""Worker processes for the run: every backend in processes of its own (one that shares its process,
below, in processes it may share with others that do), up to `jobs` at once.

Scheduling: backends start in order, one worker each, while slots are free; a slot freed when a
backend's queue runs dry goes to the next backend, then to a second (third, ...) worker for the
backend with the most cases left, so a slow backend (JAX compiling) ends up with every core.
A backend that shares its process (BackendRef.shares_process) hands its worker, once its queue
is dry, to the next such backend waiting, which so skips a worker's start-up (and may start
before a backend waiting ahead of it that does not share).
A worker that dies (os._exit, a signal), outlives the per-case timeout, or announces a reply
larger than its case can produce is killed; its case is an error, and a fresh worker (or, for a
sharing backend, one handed over) takes the rest of that backend's queue. Reads and writes never
block the run: both pipes go through one selector, so every deadline is checked whatever a
worker does. When the run ends, however it ends (an exception, Ctrl-C, SIGTERM turned into
SystemExit by the command), no worker outlives it.
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

from ..wire.frames import HEADER, decode, encode
from ..wire.lifetime import PARENT_VARIABLE, describe_exit

MIN_SHARE = 4  # cases left before another worker for the same backend pays for its start-up
INIT_REPLY_LIMIT = 1 << 20  # bytes: an init reply is a name, dtypes and maybe a traceback


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


def worker_threads(jobs: int) -> int:
    """Math-library threads per worker: the cores divided among the jobs, and no more than an
    OMP_NUM_THREADS this process was given (a caller sharing the cores with other work says so
    there). Threads beyond the cores wait at each other's barriers whenever another process runs."""
    threads = max(1, core_count() // jobs)
    given = os.environ.get("OMP_NUM_THREADS", "")
    return min(threads, int(given)) if given.isdigit() and int(given) > 0 else threads


def core_count() -> int:
    """The cores this process may run on (a CI's CPU limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Worker:
    """One `python -m odeattn.conformance.running.worker` process and its two non-blocking pipes."""

    def __init__(self, backend_index: int, threads: int):
        self.backend_index = backend_index
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "odeattn.conformance.running.worker", str(to_child_r), str(from_child_w)],
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
        self.timeout = 0.0  # the seconds its request may take
        self.spawned = time.perf_counter()

    def send(self, frame: bytes, timeout: float, limit: int) -> None:
        """Queue a request (an encoded frame); the selector writes it as the pipe takes it."""
        self.outbox = memoryview(frame)
        self.started = time.perf_counter()
        self.timeout = timeout
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
        """Kill its process group; how it ended (describe_exit)."""
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


# What the pool reports, one event at a time (Pool.events). A backend is the index of its ref.
@dataclass
class Constructed:
    """A backend's first worker constructed it: its name and dtypes. The caller answers, before
    asking for the next event, with Pool.give (its jobs) or Pool.refuse."""

    backend: int
    name: str
    dtypes: tuple


@dataclass
class WorkerStarted:
    """A worker of a constructed (and not refused) backend is ready: its init profile (the seconds
    importing and constructing) and the seconds from its spawn (a handed-over worker: from the
    hand-over) to its init reply."""

    backend: int
    profile: dict
    seconds: float


@dataclass
class Result:
    """A job's reply and arrays; a worker that died, hung or oversent gives an error reply."""

    backend: int
    job: object
    reply: dict
    arrays: dict
    seconds: float


@dataclass
class BackendFailed:
    """A backend that cannot be constructed: it runs nothing."""

    backend: int
    message: str
    traceback: str = ""


class Pool:
    """Drive every backend's jobs through worker processes, reporting as events (events()).

    A job is (job, request frame (frames.encode's bytes), reply limit in bytes); the first item is
    the caller's, handed back in its Result. timeout: the seconds a worker may take to answer one job
    (more where its ref's case_timeout is larger);
    init_timeout: to start and construct its backend (None: timeout), unless its ref has a
    start_timeout of its own."""

    def __init__(self, refs, *, jobs: int, timeout: float, init_timeout: float | None = None):
        self.states = [BackendState(ref) for ref in refs]
        self.pending = deque(range(len(self.states)))
        self.workers: list[Worker] = []
        self.stopping: list[Worker] = []
        self.sel = selectors.DefaultSelector()
        self.jobs, self.timeout = jobs, timeout
        self.init_timeout = timeout if init_timeout is None else init_timeout
        self.threads = worker_threads(jobs)
        self.stopped = False
        self.ready: deque = deque()  # (event, what the pool does once the caller has seen it) not yet reported

    # the caller's answers
    def give(self, backend: int, jobs) -> None:
        """Queue a constructed backend's jobs."""
        self.states[backend].queue.extend(jobs)

    def refuse(self, backend: int) -> None:
        """A constructed backend runs nothing."""
        self.states[backend].failed = True

    def drop(self, backend: int, which) -> int:
        """Remove the backend's queued jobs for which which(job) is true; how many."""
        queue = self.states[backend].queue
        kept = deque(item for item in queue if not which(item[0]))
        dropped = len(queue) - len(kept)
        self.states[backend].queue = kept
        return dropped

    def stop(self) -> None:
        """Start no more jobs; those running finish."""
        self.stopped = True

    def events(self):
        """Every event of the run, until no worker is left; however the run ends (an exception,
        the caller closing the generator), no worker outlives it."""
        try:
            self._fill()
            while self.workers or self.ready:
                while self.ready:
                    event, after = self.ready.popleft()
                    yield event
                    if after is not None:  # only now: the caller's answer (give, refuse, drop, stop) counts
                        after()
                    self._fill()
                if self.workers:
                    self._poll()
        finally:
            self._close()

    def _report(self, event, after=None) -> None:
        self.ready.append((event, after))

    def _poll(self) -> None:
        """Wait for the pipes (at most until the nearest deadline), handle what they carry, kill the
        workers past their deadline, and start workers in the free slots."""
        wait = max(0.0, min(w.deadline for w in self.workers) - time.perf_counter())
        for key, _ in self.sel.select(timeout=min(wait, 1.0)):
            w, direction = key.data
            if w in self.workers:
                self._write(w) if direction == "w" else self._read(w)
        now = time.perf_counter()
        for w in [w for w in self.workers if w.deadline < now]:
            self._retire(w, kill=True)
            self._lost(w, f"timed out after {w.timeout:g} s")
        self._fill()

    def _write(self, w: Worker) -> None:
        w.write()
        if not w.outbox:
            self.sel.unregister(w.to_child)

    def _read(self, w: Worker) -> None:
        try:
            reply = w.read()
        except EOFError:
            why = describe_exit(w.proc.wait())
            self._retire(w, kill=True)
            self._lost(w, why)
            return
        except ValueError as err:
            self._retire(w, kill=True)
            self._lost(w, str(err))
            return
        if reply is None:
            return
        message, arrays = reply
        w.deadline = float("inf")  # answered: idle until its next job
        if w.job != ("init",):
            self._report(Result(w.backend_index, w.job, message, arrays, time.perf_counter() - w.started), lambda: self._next_job(w))
        elif "error" in message:
            self._retire(w)
            self._init_failed(w, message["error"], message.get("traceback", ""))
        else:
            self._initialised(w, message)

    def _initialised(self, w: Worker, message: dict) -> None:
        st = self.states[w.backend_index]
        started = WorkerStarted(w.backend_index, message.get("profile", {}), time.perf_counter() - w.spawned)

        def go_on():
            if st.failed:
                self._next_job(w)  # refused: retires it
            else:
                self._report(started, lambda: self._next_job(w))

        if st.initialised:  # another worker of a known backend
            go_on()
            return
        st.initialised = True
        self._report(Constructed(w.backend_index, message["name"], tuple(message["dtypes"])), go_on)

    def _send(self, w: Worker, frame: bytes, timeout: float, limit: int) -> None:
        w.send(frame, timeout, limit)
        w.write()
        if w.outbox:
            self.sel.register(w.to_child, selectors.EVENT_WRITE, (w, "w"))

    def _start(self, index: int) -> None:
        w = Worker(index, self.threads)
        self.states[index].workers += 1
        self.workers.append(w)
        self.sel.register(w.from_child, selectors.EVENT_READ, (w, "r"))
        self._init(w)

    def _init(self, w: Worker) -> None:
        """Ask w to construct its backend."""
        w.job = ("init",)
        ref = self.states[w.backend_index].ref
        init = {"op": "init", "reference": ref.reference, "sys_path": sys.path, "imports": list(ref.imports)}
        self._send(w, encode(init), self.init_timeout if ref.start_timeout is None else ref.start_timeout, INIT_REPLY_LIMIT)

    def _retire(self, w: Worker, *, kill: bool = False) -> None:
        for fd in (w.from_child, w.to_child):
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        self.workers.remove(w)
        self.states[w.backend_index].workers -= 1
        if kill:
            w.kill()
            return
        try:
            os.write(w.to_child, encode({"op": "exit"}))
        except OSError:
            pass
        w.close_fds()
        self.stopping.append(w)

    def _next_job(self, w: Worker) -> None:
        if w not in self.workers:
            return
        st = self.states[w.backend_index]
        if st.queue and not st.failed and not self.stopped:
            job, frame, limit = st.queue.popleft()
            w.job = job
            self._send(w, frame, max(self.timeout, st.ref.case_timeout or 0.0), limit)
        elif self.stopped or not self._hand_over(w):
            self._retire(w)

    def _hand_over(self, w: Worker) -> bool:
        """w's backend has no job left for it: if that backend shares its process (BackendRef's
        shares_process), w constructs the next pending backend that does too, which so skips a
        worker's start-up. False if there is none."""
        if not self.states[w.backend_index].ref.shares_process:
            return False
        nxt = next((i for i in self.pending if self.states[i].ref.shares_process), None)
        if nxt is None:
            return False
        self.pending.remove(nxt)
        self.states[w.backend_index].workers -= 1
        self.states[nxt].workers += 1
        w.backend_index, w.spawned = nxt, time.perf_counter()
        self._init(w)
        return True

    def _fill(self) -> None:
        while len(self.workers) < self.jobs and not self.stopped:
            if self.pending:
                self._start(self.pending.popleft())
                continue
            open_ = [(len(s.queue) / (s.workers + 1), i) for i, s in enumerate(self.states)
                     if s.initialised and not s.failed and not s.no_more_workers and s.workers
                     and len(s.queue) >= MIN_SHARE * (s.workers + 1)]
            if not open_:
                return
            self._start(max(open_)[1])

    def _init_failed(self, w: Worker, message: str, tb: str) -> None:
        st = self.states[w.backend_index]
        if not st.initialised:
            st.failed = True
            self._report(BackendFailed(w.backend_index, message, tb))
        elif st.workers:  # an extra worker: the ones alive carry on, no more are started
            st.no_more_workers = True
        else:  # a restart after a crash failed: nothing can run the rest
            st.failed = True
            while st.queue:
                job = st.queue.popleft()[0]
                self._report(Result(w.backend_index, job, {"status": "error", "message": f"not run: {message}"}, {}, 0.0))

    def _lost(self, w: Worker, why: str) -> None:
        """w died, hung or oversent: report what it was doing, and let a fresh worker go on."""
        st = self.states[w.backend_index]
        if w.job == ("init",):
            self._init_failed(w, f"the worker {why} while constructing the backend", "")
            return
        def restart():
            if st.queue and not st.workers and not st.failed and not self.stopped:
                self.pending.appendleft(w.backend_index)

        self._report(Result(w.backend_index, w.job, {"status": "error", "message": f"the worker {why} while running this case"},
                            {}, time.perf_counter() - w.started), restart)

    def _close(self) -> None:
        for w in list(self.workers):
            w.kill()
        deadline = time.perf_counter() + 5.0
        for w in self.stopping:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                w.kill()
        self.sel.close()

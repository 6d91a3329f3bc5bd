"""Child processes that die with the process that started them.

The run starts a worker per backend (running.pool.Worker), and a worker starts an exec: backend's
program (adapters.external.Channel). On Linux each asks the kernel (prctl PR_SET_PDEATHSIG) for
SIGKILL when its parent dies, so a `kill -9` of `odeattn conformance` takes its workers with it,
and a worker's death takes its program: nothing is left running. A worker arms itself as it starts (arm, with
the run's pid from PARENT_VARIABLE), so the run, which may hold threads (a progress bar's, JAX's),
never forks with a preexec_fn; a worker is one thread, and starts its program with
die_with_parent() as the preexec_fn, which is what a program it does not control needs.
Elsewhere there is no such signal; a normal end, Ctrl-C and SIGTERM kill every worker
(running.pool.Pool), and a worker's program sees its stdin close. describe_exit words how a
child ended, for the errors of both.
"""

from __future__ import annotations

import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_VARIABLE = "ODEATTN_CONFORMANCE_PARENT"  # the run's pid, in a worker's environment


def _prctl():
    """libc's prctl, looked up now (before a fork), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _armed(prctl, parent: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the signal is armed after the fork: a parent that died in between
        os._exit(1)


def arm(parent: int) -> None:
    """In a child: SIGKILL when `parent` dies; exit at once if it already has. Nothing off Linux."""
    prctl = _prctl()
    if prctl is not None:
        _armed(prctl, parent)


def die_with_parent():
    """A preexec_fn for subprocess.Popen in a one-thread process (a worker): the child arms the
    signal against this process before it execs; None off Linux."""
    prctl = _prctl()
    return None if prctl is None else functools.partial(_armed, prctl, os.getpid())


def describe_exit(code: int | None) -> str:
    """How a child process ended, from its return code (None: still running; negative: a signal)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"

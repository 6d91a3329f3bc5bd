"""Child processes that die with the process that started them.

The run starts a worker per backend (pool.Worker), and a worker starts an exec: backend's program
(external.Channel). Each is started with die_with_parent(): on Linux the child asks the kernel
(prctl PR_SET_PDEATHSIG) for SIGKILL when its parent dies, so a `kill -9` of `odeattn
conformance` takes its workers with it, and a worker's death takes its program: nothing is left
running. Elsewhere there is no such signal; a normal end, Ctrl-C and SIGTERM kill every worker
(pool.run_workers), and a worker's program sees its stdin close.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent():
    """A preexec_fn for subprocess.Popen: the child gets SIGKILL when this process dies (or, as
    the kernel counts it, the thread that started the child: the run starts them from its main
    thread); None off Linux. prctl is looked up here, before the fork, so the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm

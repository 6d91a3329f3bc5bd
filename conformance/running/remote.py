"""The backends a command or the pytest plugin names, found and each started in a worker of its
own (client.RemoteAdapter): here, not in client.py, which the adapters' own modules import."""

from __future__ import annotations

from .client import ConstructionFailed, RemoteAdapter
from ..adapters import discover


def remote_adapters(references, timeout: float) -> list:
    """[(reference as typed, RemoteAdapter)], each found (adapters.discover: its import probed in a
    throwaway process) and constructed in a worker of its own within timeout seconds (a case, too,
    or its ref's case_timeout where that is longer); on a
    failure the workers started are stopped and ValueError (beginning 'backend', for a command to
    name its option) or discover's ModuleNotFoundError is raised."""

    refs, _, _ = discover(references, timeout=timeout)
    out = []
    try:
        for typed, ref in zip(references, refs):
            try:
                out.append((typed, RemoteAdapter(ref.reference, imports=ref.imports, timeout=max(timeout, ref.case_timeout or 0.0),
                                                 init_timeout=ref.start_timeout)))
            except ConstructionFailed as err:
                raise ValueError(f"backend {typed}: cannot be constructed ({err})") from None
            except ValueError as err:  # a malformed declared support: the draws keep within it
                raise ValueError(f"backend {typed}: {err}") from None
    except BaseException:
        for _, adapter in out:
            adapter.close()
        raise
    return out

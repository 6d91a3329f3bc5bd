"""The torch port's block as a torch.export program, batch and sequence as Dims: what the
ahead-of-time targets compile (AOTInductor: aoti_program.py; ExecuTorch: executorch_program.py).

    block_program(config, params, *, dtype="float32", padding_mask=True, max_batch=None, max_seq=None)
        -> torch.export.ExportedProgram

The program takes x (batch, seq, d_model) and, unless padding_mask=False, the keyword
padding_mask bool (batch, seq), and returns z(1). It is traced at 2 x 8; max_batch and max_seq
bound the Dims for a runtime that plans its memory ahead (ExecuTorch), None leaves them open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import ode_ref as R


@contextlib.contextmanager
def quiet():
    """torch's own use of its deprecated pytree LeafSpec (a FutureWarning at every export), silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        yield


@contextlib.contextmanager
def descriptors_to(file, fds=(2,)):
    """What C++ writes to the file descriptors fds (1, 2) and Python to sys.stdout or sys.stderr (a
    test runner's capture too) sent to file, an open file, for the block."""
    streams = {1: contextlib.redirect_stdout, 2: contextlib.redirect_stderr}
    saved = {fd: os.dup(fd) for fd in fds}
    try:
        for fd in fds:
            os.dup2(file.fileno(), fd)
        with contextlib.ExitStack() as stack:
            for fd in fds:
                stack.enter_context(streams[fd](file))
            yield
    finally:
        file.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def silenced(fds=(2,), loggers=()):
    """A torch-based toolchain's messages that are not the user's business kept off the output:
    torchao's (the CUDA libraries it cannot load on a CPU machine), torch's note on an Enum torchao
    registers and the loggers named, at ERROR; what is written to fds, to /dev/null (descriptors_to)."""
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree", *loggers)]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as null, descriptors_to(null, fds):
            yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def block_program(config, params, *, dtype: str = "float32", padding_mask: bool = True, max_batch=None, max_seq=None):
    """torch.export of config's block with params (see the module docstring)."""
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    cfg = R.ODEConfig.from_any(config)
    R.params.check_params(params, cfg)
    dt = getattr(torch, dtype)
    block = ODEAttentionBlock.from_params(cfg, params, dtype=dt)
    batch, seq = torch.export.Dim("batch", max=max_batch), torch.export.Dim("seq", max=max_seq)
    x = torch.zeros(2, 8, cfg.hidden_size, dtype=dt)
    kwargs = {"padding_mask": torch.ones(2, 8, dtype=torch.bool)} if padding_mask else {}
    shapes = {"x": {0: batch, 1: seq}, **({"padding_mask": {0: batch, 1: seq}} if padding_mask else {})}
    with quiet(), torch.no_grad():
        return torch.export.export(block, (x,), kwargs, dynamic_shapes=shapes)

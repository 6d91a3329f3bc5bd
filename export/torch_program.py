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
import warnings

import ode_ref as R


@contextlib.contextmanager
def quiet():
    """torch's own use of its deprecated pytree LeafSpec (a FutureWarning at every export), silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        yield


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

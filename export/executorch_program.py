"""The block as an ExecuTorch program (.pte): the torch port's program from torch.export, lowered to
ExecuTorch's portable operators, batch and sequence dynamic up to bounds, for phones and edge
devices that run ExecuTorch's runtime (no torch needed there; no odeattn, no ode_ref).

    export_executorch_block(config, params, *, padding_mask=True, max_batch=16, max_seq=512) -> bytes
    executorch_runner(program) -> run(x, padding_mask=None) -> z(1)   (run.config, .takes_mask, .bounds)
    run_executorch_block(program, x, padding_mask=None) -> z(1)

The program computes in float32. ExecuTorch plans its memory ahead for the largest shapes, so
batch and sequence are bounded (max_batch, max_seq) and a call past either is refused by the
runner. Its method "forward" takes x (batch, seq, d_model) and, unless padding_mask=False,
padding_mask bool (batch, seq), and returns z(1); its constant method "config" returns the
block's config (the ODEConfig's JSON, as an exported ONNX file's metadata holds it), which
`odeattn conformance fuzz --model` checks against the config it is given. The XNNPACK delegate is
not offered: ExecuTorch 1.5.1's refuses the block's reshapes with two dynamic dimensions ("XNNPACK
reshape only supports 1 dynamic dimension").
"""

from __future__ import annotations

import json
import numbers
import tempfile

import numpy as np

import ode_ref as R

from . import PastBounds, artifact_inputs

MAX_BATCH, MAX_SEQ = 16, 512  # the default bounds: memory planned for 16 x 512 tokens

def check_bounds(max_batch, max_seq) -> None:
    """ValueError naming max_batch or max_seq where export_executorch_block cannot take them (no
    torch imported: a command checks them before any work)."""
    for name, value, least in (("max_batch", max_batch, 2), ("max_seq", max_seq, 8)):  # torch.export traces at 2 x 8
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name}: expected an integer >= {least} (the program's memory is planned for it; "
                             f"torch.export traces at batch 2 x seq 8); got {value!r}")


def _runtime():
    """ExecuTorch's runtime (executorch.runtime.Runtime), started quietly: its thread pool too,
    made here rather than at a program's first call (where the probe would print)."""
    from .torch_program import silenced

    with silenced():  # the C++ runtime's CPU probe, written to file descriptor 2, among them
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        portable_lib._threadpool_get_thread_count()
        return Runtime.get()


def export_executorch_block(config, params, *, padding_mask: bool = True, max_batch: int = MAX_BATCH,
                            max_seq: int = MAX_SEQ) -> bytes:
    """The .pte program of config's block with params (see the module docstring)."""
    from .torch_program import block_program, quiet, silenced

    check_bounds(max_batch, max_seq)
    with silenced():
        from executorch.exir import to_edge_transform_and_lower
    cfg = R.ODEConfig.from_any(config)
    program = block_program(cfg, params, padding_mask=padding_mask, max_batch=max_batch, max_seq=max_seq)
    with quiet():
        edge = to_edge_transform_and_lower(program, constant_methods={"config": json.dumps(cfg.to_dict())})
        return bytes(edge.to_executorch().buffer)


def _load(program: bytes):
    """The program loaded by ExecuTorch's runtime; ValueError where the bytes are none."""
    from .torch_program import descriptors_to

    runtime = _runtime()
    with tempfile.TemporaryFile("w+") as log:
        try:
            with descriptors_to(log):
                return runtime.load_program(program)
        except (RuntimeError, ValueError) as err:
            log.seek(0)
            said = "; ".join(line.partition("] ")[2] or line for line in log.read().splitlines())
            raise ValueError(f"program: expected an ExecuTorch .pte program; loading it failed ({str(err).splitlines()[0]}"
                             f"{': ' + said if said else ''})") from None


class ExecuTorchRunner:
    """A block program loaded once by ExecuTorch's runtime and called: run(x, padding_mask=None) ->
    z(1) as NumPy. config, takes_mask and bounds (max_batch, max_seq) are read off the program;
    dtype is float32. Its inputs are checked here (export.artifact_inputs), and a batch or
    sequence past the bounds is refused (export.PastBounds) rather than run past the planned memory.
    ValueError for bytes that are no block program of export_executorch_block."""

    dtype, kind = "float32", "package"

    def __init__(self, program: bytes):
        self.program = _load(program)
        if not {"config", "forward"} <= set(self.program.method_names):
            raise ValueError("program: expected a block program written by odeattn (methods forward and config); "
                             f"found {', '.join(sorted(self.program.method_names)) or 'none'}")
        try:
            (stored,) = self.program.load_method("config").execute([])
            self.config = R.ODEConfig.from_any(json.loads(stored))
        except (ValueError, TypeError) as err:
            raise ValueError(f"program: expected its config method to return the block's config as JSON; reading it "
                             f"failed ({type(err).__name__}: {err})") from None
        meta = self.program.metadata("forward")
        self.takes_mask, self.bounds = meta.num_inputs() == 2, tuple(meta.input_tensor_meta(0).sizes()[:2])
        self.forward = self.program.load_method("forward")

    def __call__(self, x, padding_mask=None):
        import torch

        x, mask = artifact_inputs(x, padding_mask, d_model=self.config.hidden_size, dtype=np.float32,
                                  takes_mask=self.takes_mask)
        if x.shape[0] > self.bounds[0] or x.shape[1] > self.bounds[1]:
            raise PastBounds(f"x: {x.shape[0]} x {x.shape[1]} tokens; the program's memory is planned for batch <= "
                             f"{self.bounds[0]} and seq <= {self.bounds[1]}")
        inputs = [torch.from_numpy(x)] + ([] if mask is None else [torch.from_numpy(mask)])
        return self.forward.execute(inputs)[0].numpy()


def executorch_runner(program: bytes) -> ExecuTorchRunner:
    """The program loaded once, to be called as run(x, padding_mask=None) -> z(1) (ExecuTorchRunner)."""
    return ExecuTorchRunner(program)


def run_executorch_block(program: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a block program on x (a one-shot: a device keeps executorch_runner's run)."""
    return ExecuTorchRunner(program)(x, padding_mask)

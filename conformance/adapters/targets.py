"""The deployment targets' rows run every artifact where only its runtime is: in a worker process
of the row's own (running/target_worker.py) that loads export/standalone.py by its path and imports
nothing of odeattn or ode_ref, which it checks after every request. Each artifact is made here (the
export, and IREE's compile of it), sent as bytes over the external protocol's frames and run there
(external.RemoteRun).

The rows of the targets that run the ONNX file (openvino, tract) or a compile of it (iree) are
here; those of the torch port's compiled artifacts (compiled.py) and jax.export's program
(jax_export.py) are BlockTargets.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from odeattn.export import artifact_inputs

from ..wire import frames
from .exported import _EncoderStack, _ExportedAdapter, _ExportedWithEncoder, _threads
from .external import HANDSHAKE_TIMEOUT, Channel, RemoteModels, RemoteRun

WORKER = Path(__file__).parents[1] / "running" / "target_worker.py"


class TargetWorker:
    """A row's runtime-only worker for target (export.standalone.TARGETS), started at the first use
    of its channel; env: its environment, if not this process's."""

    def __init__(self, target: str, env: Optional[dict] = None):
        self.target, self.env = target, env
        self._channel = None

    @property
    def channel(self) -> Channel:
        return self.start()

    def start(self) -> Channel:
        """The worker's channel: the worker started and its handshake answered, anew after a fault
        stopped the last one (a runtime that crashed on one case fails that case alone)."""
        if self._channel is None or self._channel.broken or self._channel.proc.poll() is not None:
            from odeattn.export import standalone

            argv = [sys.executable, str(WORKER), frames.__file__, standalone.__file__]
            channel = Channel(argv, f"{self.target} (the runtime-only worker)", env=self.env)
            try:
                channel.request({"op": "hello", "protocol": 2}, timeout=HANDSHAKE_TIMEOUT)
            except BaseException:
                channel.proc.kill()
                channel.proc.wait()
                raise
            self._channel = channel
        return self._channel

    def run(self, inputs, outputs, *, model=None, artifact: Optional[bytes] = None, threads: Optional[int] = None):
        """A RemoteRun, not yet started, of model's ONNX bytes or artifact, whose inputs and outputs
        (in the artifact's order) are named."""
        fields = {"target": self.target, "inputs": list(inputs), "outputs": list(outputs), "threads": threads}
        return RemoteRun(self.channel, model, artifact=artifact, fields=fields)

    def call_block(self, artifact: bytes, x, padding_mask=None, threads: Optional[int] = None):
        """z(1) of a block artifact on x, and padding_mask where it takes one (not None): the
        artifact loaded, run once and dropped."""
        feed = {"x": x, **({} if padding_mask is None else {"padding_mask": padding_mask})}
        run = self.run(list(feed), ["z"], artifact=artifact, threads=threads)
        try:
            return run(feed)["z"]
        finally:
            run.drop()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class TargetRow:
    """A row with its target's worker: target names it (export.standalone.TARGETS). The worker
    starts with the row, before the row's own imports can start threads here (jax's): a fork in a
    process with threads may deadlock."""

    target = ""

    def __init__(self, env: Optional[dict] = None):
        self.worker = TargetWorker(self.target, env)
        self.worker.start()

    def close(self) -> None:
        self.worker.close()


class BlockTarget(TargetRow):
    """A row of block artifacts: run_block makes a case's artifact, then returns call(artifact, ...)."""

    def call(self, artifact: bytes, config, x, padding_mask, dtype: str):
        """z(1) of the artifact in the worker, fed x in dtype and, where the artifact takes one
        (padding_mask not None), the mask."""
        x, mask = artifact_inputs(x, padding_mask, d_model=config.hidden_size, dtype=dtype,
                                  takes_mask=padding_mask is not None)
        return self.worker.call_block(artifact, x, mask)


class _OnnxTarget(TargetRow, RemoteModels):
    """A row whose every model (the block, and the form's others) runs in its target's worker: the
    ONNX file's bytes, or the target's artifact made from it (_artifact). A block case runs the
    file `odeattn export --target` writes, z(1) its one output: the deployer's file is the one
    judged, and a failure's stages are the triage's (run_stages)."""

    diagnostics, run_func, run_trajectory = False, None, None

    def _artifact(self, model) -> Optional[bytes]:
        return None  # the ONNX file itself

    def _build(self, model):
        from odeattn.export.standalone import onnx_names

        return self.remote(self.worker.run(*onnx_names(model), model=model, artifact=self._artifact(model), threads=_threads()))


class OpenVinoAdapter(_OnnxTarget, _ExportedWithEncoder):
    """Each model read from its ONNX bytes by OpenVINO's ONNX frontend and compiled for its CPU
    plugin with the float32 inference hint (export.standalone): the block, the prefill and
    decode-step models, and the encoder stack's."""

    name = target = "openvino"
    imports = ("onnx",)  # the export's; OpenVINO is imported by the worker alone


class TractAdapter(_OnnxTarget, _EncoderStack, _ExportedAdapter):
    """Each model loaded by tract from its ONNX bytes (export/standalone.py): the block and the
    encoder stack's. No decode cases: tract sizes every array from the inputs' shapes, and the
    prefill model's cache has max_len slots, an input's value."""

    name = target = "tract"
    imports = ("onnx",)


class IreeAdapter(_OnnxTarget, _ExportedWithEncoder):
    """Each model imported from its ONNX file by IREE's ONNX importer and compiled by iree-compile
    for this CPU here (export/iree_program.py), its module run by IREE's runtime in the worker: the
    block, the prefill and decode-step models, and the encoder stack's."""

    name = target = "iree"
    imports = ("onnx", "iree.compiler")

    def _artifact(self, model) -> bytes:
        from odeattn.export.iree_program import compile_iree

        return compile_iree(model)

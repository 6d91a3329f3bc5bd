"""Conformance backends for exported graphs: ONNX Runtime at opset 17 and 23, and onnx's
reference evaluator. Each exports the case's block with diagnostics outputs (f0 and the state
after each step) and runs it in float32.

run_func and run_trajectory of one case run the same exported model: the last model built is
kept, keyed by everything it is built from (config, the parameters' bytes, the mask input), the
way a jit cache keys a compiled function. Its outputs are computed afresh on every call.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .block import export_model
from .runtime import run, run_reference, session


def _threads():
    """Intra-op threads: the conformance worker's share of the cores, if it set one."""
    return int(os.environ.get("ODEATTN_WORKER_THREADS", "0")) or None


class _ExportedBackend:
    dtypes = ("float32",)
    opset = 17
    _built = (None, None)  # (key, runnable): the last exported model

    def supports(self, config, dtype):
        return None

    def _build(self, model):
        raise NotImplementedError

    def _runnable(self, config, params, padding_mask):
        digest = hashlib.sha256()
        for k in sorted(params):
            digest.update(k.encode() + np.ascontiguousarray(params[k], np.float32).tobytes())
        key = (config, padding_mask is not None, digest.hexdigest())
        if self._built[0] != key:
            model = export_model(config, params, opset=self.opset, padding_mask=padding_mask is not None, diagnostics=True)
            self._built = (key, self._build(model))
        return self._built[1]

    def _outputs(self, config, params, x, padding_mask) -> dict:
        return self._runnable(config, params, padding_mask)(x, padding_mask)

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return self._outputs(config, params, x, padding_mask)["f0"]

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        out = self._outputs(config, params, x, padding_mask)
        return np.stack([x] + [out[f"step_{k}"] for k in range(1, config.ode_steps + 1)])

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._outputs(config, params, x, padding_mask)["z"]


class OnnxRuntimeBackend(_ExportedBackend):
    name = "onnxruntime"

    def __init__(self):
        import onnxruntime  # noqa: F401  (ImportError here means: not installed)

    def _build(self, model):
        sess = session(model, threads=_threads())
        return lambda x, padding_mask: run(model, sess, x, padding_mask)


class OnnxRuntimeOpset23Backend(OnnxRuntimeBackend):
    name = "onnxruntime-opset23"
    opset = 23


class OnnxReferenceBackend(_ExportedBackend):
    name = "onnx-reference"

    def _build(self, model):
        return lambda x, padding_mask: run_reference(model, x, padding_mask)

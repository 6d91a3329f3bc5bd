"""Conformance backends for exported graphs: ONNX Runtime at opset 17 and 23, and onnx's
reference evaluator. Each exports the case's block with diagnostics outputs (f0 and the state
after each step) and runs it in float32."""

from __future__ import annotations

import numpy as np

from .block import export_model
from .runtime import run, run_reference, session


class _ExportedBackend:
    dtypes = ("float32",)
    opset = 17

    def supports(self, config, dtype):
        return None

    def _outputs(self, config, params, x, padding_mask) -> dict:
        raise NotImplementedError

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

    def _outputs(self, config, params, x, padding_mask):
        model = export_model(config, params, opset=self.opset, padding_mask=padding_mask is not None, diagnostics=True)
        return run(model, session(model), x, padding_mask)


class OnnxRuntimeOpset23Backend(OnnxRuntimeBackend):
    name = "onnxruntime-opset23"
    opset = 23


class OnnxReferenceBackend(_ExportedBackend):
    name = "onnx-reference"

    def _outputs(self, config, params, x, padding_mask):
        model = export_model(config, params, opset=self.opset, padding_mask=padding_mask is not None, diagnostics=True)
        return run_reference(model, x, padding_mask)

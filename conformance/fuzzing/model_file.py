"""One exported block file judged where it is deployed: `odeattn conformance fuzz --model block.onnx
--config c.json --weights w.safetensors`.

The file holds one config and its weights; fuzz then draws inputs only (batch, length, padding,
values) within what the file accepts (a static batch or length in its input x is kept, a padding
mask only if it takes one), and judges its output z against the spec run on the same config and
weights. A file exported with diagnostics (f0, step_k) is judged at those too, and one exported
with the stage outputs (export_model(..., stages=True): stage_norm ... stage_output_proj) names
the first stage of f that diverges (stages.py).

The runtime is ONNX Runtime in this process, or one of its JavaScript builds on Node.js
(onnxruntime-node, onnxruntime-web): the reference workers of external.py, sent the file once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

RUNTIMES = ("onnxruntime", "onnxruntime-node", "onnxruntime-web")  # built-in backend names (adapters.BUILTIN)


def check_runtime(runtime: str) -> str:
    """runtime, if it is one of RUNTIMES and installed; ValueError naming --runtime otherwise."""
    from ..adapters import missing_requirements

    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime: expected one of {', '.join(RUNTIMES)}; got {runtime!r}")
    missing = missing_requirements(runtime)
    if missing:
        raise ValueError(f"--runtime {runtime}: not installed (missing {', '.join(missing)})")
    return runtime


class ModelFile:
    """An adapter over one .onnx block file, run in float32 by ONNX Runtime here or by a
    JavaScript build in its worker."""

    dtypes = ("float32",)

    def __init__(self, path: Path, config, params: dict, runtime: str = "onnxruntime"):
        import onnx

        from odeattn.export.runtime import declared_inputs

        check_runtime(runtime)
        self.model = onnx.load(str(path))
        declared = declared_inputs(self.model)
        if "x" not in declared:
            raise ValueError(f"--model: expected a block with the input 'x'; {str(path)!r} declares {sorted(declared)}")
        dtype, dims = declared["x"]
        if dtype != np.float32:
            raise ValueError(f"--model: expected x of float32; {str(path)!r} declares {np.dtype(dtype).name}")
        if dims and isinstance(dims[-1], int) and dims[-1] != config.hidden_size:
            raise ValueError(f"--config: hidden_size {config.hidden_size}, but the model's x has width {dims[-1]}")
        self.batch, self.seq = (d if isinstance(d, int) else None for d in (list(dims) + [None, None])[:2])
        self.takes_mask = "padding_mask" in declared
        self.outputs = [o.name for o in self.model.graph.output]
        self.runtime, self.infer = runtime, self._runner(runtime)
        self.name = f"model:{Path(path).name}" + ("" if runtime == "onnxruntime" else f"@{runtime}")
        self.config, self.params = config, params

    def _runner(self, runtime: str):
        """feed -> output name -> array: an ONNX Runtime session here (the project's one session
        helper: its checks and options), or the file loaded once in a JavaScript worker
        (external.RemoteRun, which checks each feed as a local session's is)."""
        if runtime == "onnxruntime":
            from odeattn.export.runtime import session

            sess = session(self.model)
            return lambda feed: dict(zip(self.outputs, sess.run(self.outputs, feed)))
        from .. import external

        self.worker = {"onnxruntime-node": external.onnxruntime_node, "onnxruntime-web": external.onnxruntime_web}[runtime]()
        run = external.RemoteRun(self.worker.channel, self.model)
        run.start()
        return run

    def supports(self, config, dtype) -> Optional[str]:
        return None if config == self.config else "the model file holds one config"

    def _run(self, x, padding_mask) -> dict:
        from odeattn.export.runtime import make_feed

        return self.infer(make_feed(self.model, x, padding_mask if self.takes_mask else None))

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._run(x, padding_mask)["z"]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return self._run(x, padding_mask)["f0"]

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        out = self._run(x, padding_mask)
        return np.stack([x] + [out[f"step_{k}"] for k in range(1, config.ode_steps + 1)])

    def run_stages(self, config, params, x, padding_mask, dtype):
        out = self._run(x, padding_mask)
        return {k.removeprefix("stage_"): v for k, v in out.items() if k.startswith("stage_")}

    def adapt(self):
        """self with run_func, run_trajectory and run_stages removed when the file has no such
        diagnostic outputs."""
        if not any(o.startswith("stage_") for o in self.outputs):
            self.run_stages = None
        if "f0" not in self.outputs:
            self.run_func = None
        if not all(f"step_{k}" in self.outputs for k in range(1, self.config.ode_steps + 1)):
            self.run_trajectory = None
        return self

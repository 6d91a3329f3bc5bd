"""One exported block file judged where it is deployed: `odeattn conformance fuzz --model block.onnx
--config c.json --weights w.safetensors`.

The file holds one config and its weights; fuzz then draws inputs only (batch, length, padding,
values) within what the file accepts (a static batch or length in its input x is kept, a padding
mask only if it takes one), and judges its output z against the spec run on the same config and
weights. A file exported with diagnostics (f0, step_k) is judged at those too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

RUNTIMES = ("onnxruntime",)


class ModelFile:
    """An adapter over one .onnx block file, run by ONNX Runtime in float32."""

    dtypes = ("float32",)

    def __init__(self, path: Path, config, params: dict, runtime: str = "onnxruntime"):
        import onnx

        from odeattn.export.runtime import declared_inputs, session

        if runtime not in RUNTIMES:
            raise ValueError(f"--runtime: expected one of {', '.join(RUNTIMES)}; got {runtime!r}")
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
        self.session = session(self.model)  # the project's one session helper: its checks and options
        self.name = f"model:{Path(path).name}"
        self.config, self.params = config, params

    def supports(self, config, dtype) -> Optional[str]:
        return None if config == self.config else "the model file holds one config"

    def _run(self, x, padding_mask) -> dict:
        from odeattn.export.runtime import make_feed

        feed = make_feed(self.model, x, padding_mask if self.takes_mask else None)
        return dict(zip(self.outputs, self.session.run(self.outputs, feed)))

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._run(x, padding_mask)["z"]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return self._run(x, padding_mask)["f0"]

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        out = self._run(x, padding_mask)
        return np.stack([x] + [out[f"step_{k}"] for k in range(1, config.ode_steps + 1)])

    def adapt(self):
        """self with run_func and run_trajectory removed when the file has no diagnostic outputs."""
        if "f0" not in self.outputs:
            self.run_func = None
        if not all(f"step_{k}" in self.outputs for k in range(1, self.config.ode_steps + 1)):
            self.run_trajectory = None
        return self

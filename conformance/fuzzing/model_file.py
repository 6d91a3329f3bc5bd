"""One exported block file judged where it is deployed: `odeattn conformance fuzz --model block.onnx
--config c.json --weights w.safetensors`.

The file holds one config and its weights; fuzz then draws inputs only (batch, length, padding,
values) within what the file accepts (a static batch or length in its input x is kept, a padding
mask only if it takes one), and judges its output z against the spec run on the same config and
weights. A file exported with diagnostics (f0, step_k) is judged at those too, and one exported
with the stage outputs (export_model(..., stages=True): stage_norm ... stage_output_proj) names
the first stage of f that diverges (stages.py).

The runtime is ONNX Runtime, OpenVINO (its float32 hint, as the openvino backend) or tract (as
the tract backend) in this process, or one of ONNX Runtime's JavaScript builds on Node.js
(onnxruntime-node, onnxruntime-web): the reference workers of adapters/external.py, sent the file
once. With --runtime iree, aoti, executorch, jax or litert the file is no ONNX file but an IREE
module (.vmfb, `odeattn export --target iree`), an AOTInductor package (.pt2, `--target aoti`), an
ExecuTorch program (.pte, `--target executorch`), a serialized jax.export program (.jaxexport,
`--target jax`) or a LiteRT model (.tflite, `--target litert`), loaded once by its runtime here:
PackageFile.

A file that is no float block model is refused in one line before its config is read
(load_block_file): a GenAI model, a prefill or decode-step model, other inputs, or an int8 file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..adapters import external, installed, missing_requirements

# built-in backend names (adapters.BUILTIN)
RUNTIMES = ("onnxruntime", "onnxruntime-node", "onnxruntime-web", "openvino", "iree", "tract", "aoti", "executorch", "jax",
            "litert")
# the runtimes whose file is no ONNX file: its suffix
RUNTIME_SUFFIXES = {"iree": ".vmfb", "aoti": ".pt2", "executorch": ".pte", "jax": ".jaxexport", "litert": ".tflite"}
PACKAGES = {"iree": "iree-base-runtime", "aoti": "torch", "litert": "ai-edge-litert"}  # a runtime whose Python package has another name (its version is the record's)
# a runtime whose file needs less than its conformance backend (which also builds each case's file): what it needs
RUNTIME_REQUIRES = {"litert": ("ai_edge_litert",), "iree": ("iree.runtime",)}
FOLDS_STEPS = {"openvino": "OpenVINO"}  # runtimes that fold a Loop form's stored steps default into a constant
BLOCK_INPUTS = ("x", "padding_mask", "steps")  # a block model's: x always, the others where exported with them
# ONNX Runtime's dynamic int8 quantisation (quantize_dynamic, and the fused forms of its optimiser).
# BitLinear's exact integer export also has MatMulInteger, fed by a QuantizeLinear: none of these.
INT8_DYNAMIC_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def artifact_record(path, runtime: str) -> dict:
    """What a deployer ships beside the file with this run's --json report: the file's name and
    sha256, and the runtime that ran it with its version (a Python package's installed one, or
    the JavaScript build's pinned in conformance/js/package-lock.json)."""
    import hashlib
    import importlib.metadata
    import json

    if runtime in ("onnxruntime-node", "onnxruntime-web"):
        lock = json.loads((Path(__file__).parents[1] / "js" / "package-lock.json").read_text())
        version = lock["packages"][f"node_modules/{runtime}"]["version"]
    else:
        version = importlib.metadata.version(PACKAGES.get(runtime, runtime))
    return {"file": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            "runtime": runtime, "runtime_version": version}


def check_runtime(runtime: str) -> str:
    """runtime, if it is one of RUNTIMES and installed; ValueError naming --runtime otherwise."""
    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime: expected one of {', '.join(RUNTIMES)}; got {runtime!r}")
    missing = ([m for m in RUNTIME_REQUIRES[runtime] if not installed(m)] if runtime in RUNTIME_REQUIRES
               else missing_requirements(runtime))
    if missing:
        raise ValueError(f"--runtime {runtime}: not installed (missing {', '.join(missing)})")
    return runtime


def _op_types(graph) -> set:
    """The op types of a graph's nodes and of the subgraphs they hold (a Loop's body)."""
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                ops |= _op_types(sub)
    return ops


def check_block(model, shown: str) -> None:
    """ValueError (one line, "--model: ...") for a model that is no float block model, saying what it
    is: a GenAI model, the prefill or decode-step model of cached decoding, other inputs, or an
    int8-quantised block.
    An int8 file is refused rather than held to deploy.int8_error_bound: that bound is on
    max|dz| / max|z|, for reduce_range files and attention scores of order one (6.8 times over on
    sharper ones, docs/export.md), where fuzz holds every value to its own tolerance on drawn inputs."""
    from odeattn.export.runtime import declared_inputs

    declared, props = declared_inputs(model), {p.key: p.value for p in model.metadata_props}
    names = sorted(declared)
    found = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
    if "lm_config" in props or "input_ids" in declared:
        raise ValueError(f"--model: {shown!r} is an ONNX Runtime GenAI model (inputs {found}), not a block model; "
                         "GenAI's folder is checked against the spec by odeattn.conformance.genai.check_genai "
                         "(docs/generation.md)")
    if "x" not in declared or set(declared) - set(BLOCK_INPUTS):
        graph = props.get("kind", "")  # the metadata key "kind" names the graph (ExportOptions.graph)
        what = (f" (the {graph.replace('_', '-')} model of cached decoding, which the suite's --backend onnxruntime "
                "judges on its decode cases)" if graph in ("prefill", "decode_step") else "")
        raise ValueError(f"--model: {shown!r} is not a block model{what}: expected the inputs x and, where exported "
                         f"with them, padding_mask and steps; found {found}")
    int8 = sorted(_op_types(model.graph) & INT8_DYNAMIC_OPS)
    if int8 or "quantization" in props:
        raise ValueError(f"--model: {shown!r} is int8-quantised ({', '.join(int8) or props['quantization']}): lossy, so "
                         "not judged at float32's tolerance; its error against the spec is bounded by "
                         "odeattn.export.deploy.int8_error_bound only for reduce_range files and attention scores of "
                         "order one (docs/export.md): measure it on your own inputs, and fuzz the float file it came from")


def check_file_config(model, config, runtime: str) -> None:
    """ValueError (one line) where the file cannot be judged against config in runtime: its own
    stored config (export's metadata) differs from config, which would read as a divergence of
    the runtime; or it is a Loop form with a stored steps default run by OpenVINO, which folds
    the default into a constant and drops the steps input, so the file runs ode_steps whatever is
    fed; or, run by tract, a form it does not take (tract_program.unsupported_form)."""
    import json

    props = {p.key: p.value for p in model.metadata_props}
    if "config" in props:
        _check_stored_config(type(config).from_any(json.loads(props["config"])), config)
    if runtime == "tract":
        from odeattn.export import tract_program

        why = tract_program.unsupported_form(model)
        if why:
            raise ValueError(f"--model: {why}")
    if runtime in FOLDS_STEPS and "steps" in {t.name for t in model.graph.initializer}:
        raise ValueError(f"--model: a Loop form with a stored steps default, which {FOLDS_STEPS[runtime]} folds into a constant (its "
                         "steps input dropped: the file runs ode_steps whatever is fed); expected a file exported with "
                         "--steps-input --steps-required, or the unrolled form")


def _check_stored_config(stored, config) -> None:
    """ValueError naming --config where the config a file stores differs from the one given."""
    if stored != config:
        differ = [f"{k}={getattr(config, k)!r} (the file's {getattr(stored, k)!r})" for k in config.to_dict()
                  if getattr(config, k) != getattr(stored, k)]
        raise ValueError(f"--config: expected the config the file was exported with; differs at {', '.join(differ[:4])}")


def load_block_file(path):
    """The ONNX model at path, checked to be one fuzz --model judges (check_block); ValueError naming
    --model otherwise (runtime.ModelError for a file that is no ONNX model)."""
    from odeattn.export.runtime import load_model

    model = load_model(path)
    check_block(model, str(path))
    return model


class ModelFile:
    """An adapter over one .onnx block file, run in float32 by ONNX Runtime, OpenVINO or tract here
    or by a JavaScript build in its worker."""

    dtypes = ("float32",)

    def __init__(self, path: Path, config, params: dict, runtime: str = "onnxruntime", model=None):
        """model: the file as load_block_file read it (checked again here), or None to read it."""
        from odeattn.export.runtime import declared_inputs, default_inputs

        check_runtime(runtime)
        if model is None:
            self.model = load_block_file(path)
        else:
            check_block(model, str(path))
            self.model = model
        declared = declared_inputs(self.model)
        dtype, dims = declared["x"]
        if dtype != np.float32:
            raise ValueError(f"--model: expected x of float32; {str(path)!r} declares {np.dtype(dtype).name}")
        if dims and isinstance(dims[-1], int) and dims[-1] != config.hidden_size:
            raise ValueError(f"--config: hidden_size {config.hidden_size}, but the model's x has width {dims[-1]}")
        self.batch, self.seq = (d if isinstance(d, int) else None for d in (list(dims) + [None, None])[:2])
        self.takes_mask = "padding_mask" in declared
        self.steps_required = "steps" in declared  # a Loop form without a stored default (--steps-required)
        # the step count a Loop form is judged at (fed where required, else its stored default): the config's
        self.loop_steps = config.ode_steps if self.steps_required or "steps" in default_inputs(self.model) else None
        self.outputs = [o.name for o in self.model.graph.output]
        self.runtime, self.infer = runtime, self._runner(runtime)
        self.name = f"model:{Path(path).name}" + ("" if runtime == "onnxruntime" else f"@{runtime}")
        self.config, self.params = config, params

    def _runner(self, runtime: str):
        """feed -> output name -> array: an ONNX Runtime session here (the project's one session
        helper: its checks and options), OpenVINO's compiled model or tract's here (make_feed checks
        the feed against the file's inputs first), or the file loaded once in a JavaScript worker
        (external.RemoteRun, which checks each feed as a local session's is)."""
        if runtime == "onnxruntime":
            from odeattn.export.runtime import session

            sess = session(self.model)
            return lambda feed: dict(zip(self.outputs, sess.run(self.outputs, feed)))
        if runtime == "openvino":
            from odeattn.export.standalone import load_onnx

            return load_onnx("openvino", self.model)
        if runtime == "tract":
            from odeattn.export.standalone import TractError, load_onnx

            try:
                return load_onnx("tract", self.model)
            except TractError as err:  # a file tract does not load: the caller's to refuse (fuzz: in one line)
                raise ValueError(f"--model: tract does not load the file: {err}") from None
        self.worker = {"onnxruntime-node": external.onnxruntime_node, "onnxruntime-web": external.onnxruntime_web}[runtime]()
        run = external.RemoteRun(self.worker.channel, self.model)
        run.start()
        return run

    def supports(self, config, dtype) -> Optional[str]:
        return None if config == self.config else "the model file holds one config"

    def _run(self, x, padding_mask) -> dict:
        from odeattn.export.runtime import make_feed

        steps = self.config.ode_steps if self.steps_required else None  # judged at the config's count, as by default
        return self.infer(make_feed(self.model, x, padding_mask if self.takes_mask else None, steps))

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


class PackageFile:
    """An adapter over one compiled block package, run here: an IREE .vmfb by IREE's runtime
    (--runtime iree), an AOTInductor .pt2 by torch's runtime (--runtime aoti), an ExecuTorch .pte
    by ExecuTorch's (--runtime executorch), a jax.export program by jax (--runtime jax) or a
    LiteRT .tflite by LiteRT's interpreter (--runtime litert),
    in float32. It returns z(1) alone and takes a padding mask where it was exported with one. A
    LiteRT model holds one batch and sequence, which every draw takes; a draw past what another file
    holds is not supported, not a failure: an ExecuTorch program's batch and sequence bounds, and a
    jax program's positions (RoPE, sinusoidal_rotary and HoPE: seq <= the --max-positions it was
    exported with, which jax checks at each call). The config a .pt2 or .pte stores must be the one
    given; a jax program, a LiteRT model and an IREE module store none, so their width is checked
    and the config taken as given (a wrong one diverges)."""

    dtypes = ("float32",)
    loop_steps = None
    run_func = run_trajectory = run_stages = None  # no diagnostic outputs

    def __init__(self, path: Path, config, params: dict, runtime: str):
        check_runtime(runtime)
        if runtime == "aoti":
            from odeattn.export.aoti_program import aoti_runner as runner
        elif runtime == "executorch":
            from odeattn.export.executorch_program import executorch_runner as runner
        elif runtime == "jax":
            from odeattn.export.jax_program import jax_runner as runner
        elif runtime == "iree":  # a module records no width: the config's, checked by a call
            from odeattn.export.iree_program import IreeRunner

            runner = lambda vmfb: IreeRunner(vmfb, config.hidden_size)  # noqa: E731
        else:
            from odeattn.export.litert_program import litert_runner as runner
        try:
            self.run = runner(Path(path).read_bytes())
        except ValueError as err:
            raise ValueError(f"--model: {str(path)!r}: {str(err).partition(': ')[2]}") from None
        kind = self.run.kind
        if self.run.dtype != "float32":
            raise ValueError(f"--model: expected a float32 {kind} (fuzz judges float32); {str(path)!r} computes in "
                             f"{self.run.dtype}")
        stored = getattr(self.run, "config", None)
        if stored is not None:
            _check_stored_config(stored, config)
        elif self.run.d_model != config.hidden_size:
            raise ValueError(f"--config: expected the config the file was exported with; its hidden_size is "
                             f"{config.hidden_size}, the {kind}'s d_model {self.run.d_model}")
        self.batch, self.seq = getattr(self.run, "shape", (None, None))  # a fixed shape every draw takes
        self.takes_mask, self.runtime = self.run.takes_mask, runtime
        self.name, self.config, self.params = f"model:{Path(path).name}@{runtime}", config, params

    def supports(self, config, dtype) -> Optional[str]:
        return None if config == self.config else "the model file holds one config"

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export import PastBounds

        from ..adapters.protocol import NotSupported

        try:
            return self.run(x, padding_mask)
        except PastBounds as err:  # a shape the file was not built to hold: no verdict on the port
            raise NotSupported(f"not supported: {str(err).removeprefix('x: ')}") from None

    def adapt(self):
        return self

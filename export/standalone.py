"""Each deployment target's artifact loaded from its bytes and run, as a deployer's process runs it.

    load(target, artifact, inputs, outputs, threads=None) -> run(feed) -> {output name: array}
    load_onnx(target, model, threads=None): the same of an onnx.ModelProto, for openvino and tract
    onnx_names(model) -> (input names, output names) of an onnx.ModelProto

This file imports NumPy and, where each is used, one target's runtime: nothing of odeattn or
ode_ref and no sibling module, so it runs loaded by its path where odeattn is not installed. The
conformance rows of the targets run every case so, in a worker that imports nothing else
(conformance/running/target_worker.py), and the export's runners of ONNX files are these.

artifact: the target's bytes (TARGETS). inputs, outputs: the names of the artifact's inputs in the
order it takes them and of its outputs in the order it returns them: an ONNX file's graph inputs
and outputs; a block artifact's x, then padding_mask where it takes one, and its one output z.
feed: input name -> array, already of the artifact's dtypes and shapes (export.artifact_inputs
checks them where the caller is odeattn). threads: intra-op threads where the runtime takes a count.
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np


def _named(outputs: list, got: list, runtime: str) -> dict:
    """got (one result per output, in order) named by outputs; RuntimeError on another count, so
    that no result is judged under another's name."""
    if len(got) != len(outputs):
        raise RuntimeError(f"{runtime} returned {len(got)} outputs of the artifact's {len(outputs)} ({', '.join(outputs)})")
    return dict(zip(outputs, got))


def _as_tuple(out) -> tuple:
    """A runtime's results as a tuple (IREE and jax return one result bare)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _openvino(model: bytes, inputs, outputs, threads):
    """An ONNX file read by OpenVINO's ONNX frontend and compiled for its CPU plugin with the float32
    inference hint: without it OpenVINO runs a float32 model in bfloat16 on a CPU that has bfloat16
    instructions (relative error 4e-4 on a block, far past float32's tolerance)."""
    import openvino as ov

    core = ov.Core()
    settings = {"INFERENCE_PRECISION_HINT": "f32", **({"INFERENCE_NUM_THREADS": threads} if threads else {})}
    compiled = core.compile_model(core.read_model(model=bytes(model), weights=b""), "CPU", settings)
    ports = _named(outputs, list(compiled.outputs), "OpenVINO")  # by order: OpenVINO names a shared tensor once

    def run(feed):  # as fed: OpenVINO refuses a name it has not (an input it folded to a constant)
        out = compiled(feed)
        return {name: np.asarray(out[port]) for name, port in ports.items()}

    return run


class TractError(RuntimeError):
    """tract's error in one line: its message and causes, without the Rust backtrace that
    RUST_BACKTRACE=1 appends."""

    def __init__(self, error):
        text = str(error).split("\n\nStack backtrace:")[0]
        super().__init__("; ".join(line.strip() for line in text.splitlines() if line.strip() not in ("", "Caused by:")))


def tract_runnable(path):
    """The ONNX file at path loaded by tract, typed and optimised; TractError where tract refuses it."""
    import tract

    try:
        return tract.onnx().load(str(path)).into_model().into_runnable()
    except tract.TractError as err:
        raise TractError(err) from None


def _tract(model: bytes, inputs, outputs, threads):
    """An ONNX file loaded by tract (from a temporary file: tract loads a path); tract runs a model
    on the calling thread."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            f.write(model)
        runnable = tract_runnable(path)

    def run(feed):
        import tract

        try:
            out = runnable.run([np.asarray(feed[name], order="C") for name in inputs])
        except tract.TractError as err:
            raise TractError(err) from None
        return {name: a.to_numpy() for name, a in _named(outputs, out, "tract").items()}

    return run


def iree_function(vmfb: bytes, threads: int | None = None):
    """An IREE module's one exported function: run with threads=1 by IREE's local-sync driver (on
    the calling thread), else by local-task (a pool of a thread per core: IREE makes its devices
    once per process, so no other count is taken)."""
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-sync" if threads == 1 else "local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, bytes(vmfb)))
    module = context.modules[list(context.modules)[-1]]  # after "hal": the compiled model's
    names = [n for n in module.vm_module.function_names if not n.startswith("__") and not n.endswith("$async")]
    if len(names) != 1:
        raise ValueError(f"vmfb: expected a module with one function (a model compiled by compile_iree); got {names}")
    return module[names[0]]


def iree_results(out) -> tuple:
    """A function's results as host arrays (IREE returns one result bare)."""
    return tuple(np.asarray(a.to_host()) for a in _as_tuple(out))


def _iree(vmfb: bytes, inputs, outputs, threads):
    """An IREE module (.vmfb): its function called with the inputs in order."""
    function = iree_function(vmfb, threads)

    def run(feed):  # np.asarray: ascontiguousarray would make a scalar (the Loop form's steps) 1-d
        return _named(outputs, iree_results(function(*(np.asarray(feed[name], order="C") for name in inputs))), "IREE")

    return run


def _aoti(package: bytes, inputs, outputs, threads):
    """An AOTInductor .pt2 package, loaded by torch (its C++ runtime's loader) and called with x and
    the padding mask by keyword, as torch.export traced the block."""
    import torch

    model = torch._inductor.aoti_load_package(io.BytesIO(package))

    def run(feed):
        with torch.no_grad():
            z = model(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in inputs[:1]),
                      **{n: torch.from_numpy(np.ascontiguousarray(feed[n])) for n in inputs[1:]})
        return _named(outputs, [z.numpy()], "AOTInductor")

    return run


def _executorch(program: bytes, inputs, outputs, threads):
    """An ExecuTorch .pte program, loaded by ExecuTorch's runtime; its method forward called."""
    import torch
    from executorch.runtime import Runtime

    loaded = Runtime.get().load_program(program)
    forward = loaded.load_method("forward")  # it reads the program's memory: the program is kept with it

    def run(feed, loaded=loaded):
        got = forward.execute([torch.from_numpy(np.ascontiguousarray(feed[n])) for n in inputs])
        return _named(outputs, [t.numpy().copy() for t in got], "ExecuTorch")

    return run


def litert_signature(model: bytes, threads: int | None = None):
    """A LiteRT .tflite model's signature serving_default, run by LiteRT's built-in kernels without
    its default XNNPACK delegate (with it a decoder row padded on the left came out NaN, litert
    2.3.0)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=bytes(model), num_threads=threads,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    return interpreter.get_signature_runner("serving_default")


def _litert(model: bytes, inputs, outputs, threads):
    """A LiteRT .tflite model (litert_signature): its signature takes args_0, args_1, ... (the
    inputs in order) and returns output_0, ..."""
    signature = litert_signature(model, threads)

    def run(feed):
        got = signature(**{f"args_{i}": np.ascontiguousarray(feed[n]) for i, n in enumerate(inputs)})
        return _named(outputs, [np.array(got[f"output_{i}"]) for i in range(len(got))], "LiteRT")

    return run


def _jax(blob: bytes, inputs, outputs, threads):
    """A serialized jax.export program, deserialized and called by jax; a float64 program under
    jax's x64 mode, which it needs."""
    import jax
    from jax import export

    program = export.deserialize(bytearray(blob))
    x64 = any(np.dtype(a.dtype) == np.float64 for a in program.in_avals)

    def run(feed):
        with jax.enable_x64(x64):
            out = program.call(*(feed[n] for n in inputs))
        return _named(outputs, [np.asarray(a) for a in _as_tuple(out)], "jax")

    return run


# target -> its loader, what `odeattn export --target` writes for it: the ONNX file for openvino
# and tract, the compiled artifact for the others
TARGETS = {"openvino": _openvino, "tract": _tract, "iree": _iree, "aoti": _aoti, "executorch": _executorch,
           "litert": _litert, "jax": _jax}


def load(target: str, artifact: bytes, inputs, outputs, threads: int | None = None):
    """run(feed) -> {output name: array} of artifact, loaded once by target's runtime (the module
    docstring). ValueError naming target if it is none of TARGETS."""
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {', '.join(TARGETS)}; got {target!r}")
    return TARGETS[target](artifact, list(inputs), list(outputs), threads)


def onnx_names(model) -> tuple[list, list]:
    """(input names, output names) of an ONNX model (an onnx.ModelProto), in its graph's order."""
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def load_onnx(target: str, model, threads: int | None = None):
    """load() of an ONNX model (an onnx.ModelProto) for a target that runs the file (openvino,
    tract): its bytes, its graph's inputs and outputs."""
    return load(target, model.SerializeToString(), *onnx_names(model), threads)

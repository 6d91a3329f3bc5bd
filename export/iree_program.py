"""The block as an IREE module (.vmfb): odeattn's ONNX file imported by IREE's ONNX importer and
compiled for the CPU by IREE's llvm-cpu backend, batch and sequence kept dynamic.

    compile_iree(model, *, target_cpu="host") -> bytes     an ONNX ModelProto to a .vmfb
    iree_runner(vmfb, inputs, outputs) -> run(feed) -> {output name: array}
    iree_block_runner(vmfb) -> run(x, padding_mask=None) -> z(1)   (the module loaded once)
    run_iree_block(vmfb, x, padding_mask=None) -> z(1)
    IreeRunner(vmfb, d_model)(x, padding_mask=None) -> z(1)   (fuzz --model's: its inputs checked)

What IREE 3.13 compiles (docs/deployment.md): the default form (opset 17), the prefill and
decode-step models, the diagnostic outputs and the Loop form (a stored steps default folded into
a constant); not opset 23's Attention, nor ONNX local functions (`--functions`). The .vmfb is compiled for one
CPU: "host" (this machine's features, what a deployer builds on the serving machine) or an LLVM
CPU name. A module's one function takes the model's inputs in their order and returns its outputs
in theirs. The runtime side is export/standalone.py's, which needs neither odeattn nor onnx where it
runs.
"""

from __future__ import annotations

import numpy as np

from . import standalone


def compile_iree(model, *, target_cpu: str = "host") -> bytes:
    """A .vmfb of model (an onnx.ModelProto; shapes inferred, then imported by IREE's ONNX
    importer), compiled by iree-compile for the CPU target_cpu."""
    import onnx
    from iree.compiler import compile_str, ir
    from iree.compiler.extras import onnx_importer

    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=ir.Context()).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    return bytes(compile_str(module.get_asm(), input_type="onnx", target_backends=["llvm-cpu"],
                             extra_args=[f"--iree-llvmcpu-target-cpu={target_cpu}"]))


def iree_runner(vmfb: bytes, inputs: list[str], outputs: list[str], *, threads: int | None = None):
    """feed -> {output name: array}: the module's function called with feed's arrays in the order
    of inputs (the model's input names), its results named by outputs (the model's output names)."""
    return standalone.load("iree", vmfb, inputs, outputs, threads)


def iree_block_runner(vmfb: bytes, threads: int | None = None):
    """run(x, padding_mask=None) -> z(1) of a block module (compile_iree of export_model's block),
    the module loaded once, through IREE's runtime alone: called with x, and padding_mask where
    given (a model exported with the mask input takes it, every token real or not; one exported
    without it takes x alone)."""
    function = standalone.iree_function(vmfb, threads)

    def run(x, padding_mask=None) -> np.ndarray:
        args = [np.asarray(x, order="C")] + ([] if padding_mask is None else [np.asarray(padding_mask, bool, order="C")])
        return standalone.iree_results(function(*args))[0]  # z: the model's first output

    return run


def run_iree_block(vmfb: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a block module on x (a one-shot: a server keeps iree_block_runner's run)."""
    return iree_block_runner(vmfb)(x, padding_mask)


class IreeRunner:
    """A block module (compile_iree of export_model's block, as `odeattn export --target iree`
    writes it) loaded once by IREE's runtime: run(x, padding_mask=None) -> z(1) as NumPy, its inputs
    checked first (export.artifact_inputs). A module records neither a config nor its width:
    d_model is the caller's, checked once by a call on zeros (IREE refuses another width), and
    takes_mask is its function's arity. float32: compile_iree's modules are. ValueError for bytes
    that are no such module, or another width."""

    kind = "module"
    dtype = "float32"

    def __init__(self, vmfb: bytes, d_model: int, threads: int | None = None):
        import re

        try:
            self.function = standalone.iree_function(vmfb, threads)
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"module: expected an IREE .vmfb block module; loading it failed "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        arity = re.search(r"\(0(r{1,2})_", repr(self.function.vm_function))  # its calling convention: 0, then r an argument
        if arity is None:
            raise ValueError(f"module: expected a block module's function of x and, where exported with it, the padding "
                             f"mask; found {self.function.vm_function!r}")
        self.d_model, self.takes_mask = d_model, len(arity.group(1)) == 2
        try:
            self(np.zeros((1, 1, d_model), np.float32))
        except ValueError as err:  # IREE's: "tensor shape dimension 2 mismatch; expected 8 but have 6"
            raise ValueError(f"module: it takes no x of width {d_model}, the config's hidden_size "
                             f"({str(err).splitlines()[0]})") from None

    def __call__(self, x, padding_mask=None):
        from odeattn.export import artifact_inputs

        x, mask = artifact_inputs(x, padding_mask, d_model=self.d_model, dtype=np.float32, takes_mask=self.takes_mask,
                                  what="module")
        return standalone.iree_results(self.function(*([x] if mask is None else [x, mask])))[0]

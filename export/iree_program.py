"""The block as an IREE module (.vmfb): odeattn's ONNX file imported by IREE's ONNX importer and
compiled for the CPU by IREE's llvm-cpu backend, batch and sequence kept dynamic.

    compile_iree(model, *, target_cpu="host") -> bytes     an ONNX ModelProto to a .vmfb
    IreeRunner(vmfb, d_model)(x, padding_mask=None) -> z(1)   (the module loaded once, its inputs checked)
    run_iree_block(vmfb, x, padding_mask=None) -> z(1)
    (any module's function by its inputs and outputs: export.standalone.load("iree", ...))

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


def run_iree_block(vmfb: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a block module on x, its width x's (a one-shot: a server keeps an IreeRunner)."""
    return IreeRunner(vmfb, np.shape(x)[-1])(x, padding_mask)


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

"""The block as an AOTInductor package (.pt2): the torch port's program from torch.export, batch
and sequence dynamic, compiled by Inductor ahead of time into a shared library with the weights
inside, for a server that runs torch's C++ runtime or torch itself (no odeattn, no ode_ref).

    export_aoti_block(config, params, *, dtype="float32", padding_mask=True) -> bytes
    aoti_runner(package) -> run(x, padding_mask=None) -> z(1)   (run.config, .dtype, .takes_mask)
    run_aoti_block(package, x, padding_mask=None) -> z(1)

The package takes x (batch, seq, d_model) of dtype and, unless padding_mask=False, padding_mask
bool (batch, seq), and returns z(1). Its metadata holds the block's config (key "config", the
ODEConfig's JSON, as an exported ONNX file's) and its dtype (key "dtype"); `odeattn conformance
fuzz --model` checks the config against the one it is given. It is compiled for this CPU by the machine's C++ compiler
(tens of seconds a block: docs/deployment.md), and loading it loads that native library: a
package is trusted as a binary is, never taken from an unknown source.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil

import numpy as np

import ode_ref as R

from . import artifact_inputs

DTYPES = ("float32", "float64")  # the torch port's full-precision dtypes; a half block is the ONNX file's


def missing_compiler() -> list[str]:
    """The C++ compiler Inductor builds a package with ($CXX, else g++), if it is not on the PATH."""
    name = os.environ.get("CXX", "g++")
    return [] if shutil.which(name) else [f"a C++ compiler ({name}, or another named by $CXX)"]


def check_dtype(dtype: str) -> None:
    """ValueError naming dtype unless the package can be compiled in it (no torch imported)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)} (the package computes in it); got {dtype!r}")


def export_aoti_block(config, params, *, dtype: str = "float32", padding_mask: bool = True) -> bytes:
    """The .pt2 package of config's block with params (see the module docstring): torch_program's
    program, then aoti_compile_and_package with the config in the metadata."""
    import torch

    from .torch_program import block_program, quiet

    check_dtype(dtype)
    program = block_program(config, params, dtype=dtype, padding_mask=padding_mask)
    buffer = io.BytesIO()
    with quiet():
        torch._inductor.aoti_compile_and_package(program, package_path=buffer, inductor_configs={
            "aot_inductor.metadata": {"config": json.dumps(R.ODEConfig.from_any(config).to_dict()), "dtype": dtype}})
    return buffer.getvalue()


class AotiRunner:
    """A block package loaded once (torch._inductor.aoti_load_package) and called:
    run(x, padding_mask=None) -> z(1) as NumPy. config, dtype and takes_mask are read off the
    package; any batch and sequence runs. Its inputs are checked here
    (export.artifact_inputs: AOTInductor checks none unless told to by an environment variable),
    x cast to the package's dtype. ValueError for bytes that are no block package of
    export_aoti_block."""

    kind = "package"

    def __init__(self, package: bytes):
        import torch

        log = logging.getLogger("torch._inductor.package.package")  # its "outdated" advice, logged for any bytes
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            self.model = torch._inductor.aoti_load_package(io.BytesIO(package))
        except (RuntimeError, OSError) as err:
            raise ValueError(f"package: expected an AOTInductor .pt2 package; loading it failed "
                             f"({str(err).splitlines()[0]})") from None
        finally:
            log.setLevel(level)
        meta = self.model.get_metadata()
        try:
            self.config, self.dtype = R.ODEConfig.from_any(json.loads(meta["config"])), meta["dtype"]
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"package: expected a block package written by odeattn (its metadata holds the config "
                             f"and the dtype); reading them failed ({type(err).__name__}: {err})") from None
        self.takes_mask = "padding_mask" in self.model.loader.get_call_spec()[0]  # a keyword of its call spec

    def __call__(self, x, padding_mask=None):
        import torch

        x, mask = artifact_inputs(x, padding_mask, d_model=self.config.hidden_size, dtype=self.dtype,
                                  takes_mask=self.takes_mask, what="package")
        with torch.no_grad():
            kwargs = {} if mask is None else {"padding_mask": torch.from_numpy(mask)}
            return self.model(torch.from_numpy(x), **kwargs).numpy()


def aoti_runner(package: bytes) -> AotiRunner:
    """The package loaded once, to be called as run(x, padding_mask=None) -> z(1) (AotiRunner)."""
    return AotiRunner(package)


def run_aoti_block(package: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a block package on x (a one-shot: a server keeps aoti_runner's run)."""
    return AotiRunner(package)(x, padding_mask)

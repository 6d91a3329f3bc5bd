"""The block as a LiteRT model (.tflite): the torch port's module converted by litert-torch, at one
fixed batch and sequence, for phones and edge devices that run LiteRT (formerly TensorFlow Lite;
no torch, no odeattn, no ode_ref needed there).

    export_litert_block(config, params, *, batch=1, seq=128, padding_mask=True) -> bytes
    litert_runner(model, threads=None) -> run(x, padding_mask=None) -> z(1)   (run.shape, .d_model, .takes_mask)
    run_litert_block(model, x, padding_mask=None) -> z(1)

The model computes in float32. LiteRT's converter takes static shapes here (litert-torch 0.10 stops
at the padding mask's unsqueeze with a dynamic batch and sequence), so a model holds one (batch,
seq) and the runner refuses any other. Its signature "serving_default" takes args_0, x (batch,
seq, d_model), and, unless padding_mask=False, args_1, the bool padding mask (batch, seq), and
returns z(1). The model stores no config: `odeattn conformance fuzz --model` checks its width
against the config it is given and draws every example at its shape.

Two settings are fixed for exactness. The runner's interpreter runs LiteRT's built-in kernels
without its default XNNPACK delegate: with XNNPACK, a decoder row padded on the left came out NaN
(litert 2.3.0, measured), and without it the block is the spec within float32's tolerance. And
the configs whose graph computes in float64 or int64 are refused before anything is built
(check_config): the torch port makes the rotary, HoPE, ALiBi and BAM tables and SSMax's lengths
from the positions in float64 or int64, as the spec does, and LiteRT has no float64 or int64
kernels for their cos, sin, abs, maximum and log.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import tempfile

import numpy as np

import ode_ref as R
from ode_ref.config import BIAS_ENCODINGS, ROTARY_ENCODINGS

from . import PastBounds, artifact_inputs

BATCH, SEQ = 1, 128  # the default shape a model holds
WIDE_ENCODINGS = (*ROTARY_ENCODINGS, "hope", *BIAS_ENCODINGS)  # tables made in float64 or int64


def check_config(config) -> None:
    """ValueError naming the field where the block's graph would hold float64 or int64 arithmetic
    LiteRT has no kernels for (see the module docstring); no torch imported."""
    cfg = R.ODEConfig.from_any(config)
    if cfg.ode_use_pe and cfg.positional_encoding in WIDE_ENCODINGS:
        raise ValueError(f"positional_encoding: {cfg.positional_encoding}'s tables are computed in float64 or int64, "
                         "which LiteRT has no kernels for; the litert target takes the null encodings and the pape "
                         "family, or ode_use_pe=False")
    if cfg.use_ssmax and cfg.ode_use_pe and cfg.positional_encoding not in R.config.NULL_ENCODINGS:
        raise ValueError("use_ssmax: its lengths' log is computed in float64 beside a positional encoding, which LiteRT "
                         "has no kernel for; the litert target takes SSMax with a null encoding or ode_use_pe=False")


def check_shape(batch, seq) -> None:
    """ValueError naming batch or seq unless each is an integer >= 1 (no torch imported)."""
    for name, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1 (the model holds one shape); got {value!r}")


@contextlib.contextmanager
def _quiet():
    """litert-torch's conversion without its messages that are not the user's business: the
    converter's progress lines and TensorFlow's C++ logs (file descriptors 1 and 2, absl's logger),
    and what torch and torchao say of themselves (torch_program.silenced, torch_program.quiet)."""
    from .torch_program import quiet, silenced

    with silenced(fds=(1, 2), loggers=("absl",)), quiet():
        yield


@contextlib.contextmanager
def _x64_for_litert():
    """JAX's x64 mode on inside, the caller's mode back after. litert-torch turns it on for the
    whole process when it is imported (its JAX-bridged lowerings need 64-bit types while they
    convert), which would silently change every later JAX computation of the process: float64
    inputs no longer refused, times in float64."""
    import jax

    before = jax.config.jax_enable_x64
    try:
        with jax.enable_x64(True):
            yield
    finally:
        jax.config.update("jax_enable_x64", before)


def import_quietly() -> None:
    """litert-torch and LiteRT's interpreter imported without their logs (_quiet) and with JAX's
    x64 mode left as it was (_x64_for_litert): a caller that imports them first keeps a
    deployer's output clean."""
    with _quiet(), _x64_for_litert():
        import ai_edge_litert.interpreter  # noqa: F401
        import litert_torch  # noqa: F401


def export_litert_block(config, params, *, batch: int = BATCH, seq: int = SEQ, padding_mask: bool = True) -> bytes:
    """The .tflite model of config's block with params at (batch, seq) (see the module docstring)."""
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    cfg = R.ODEConfig.from_any(config)
    R.params.check_params(params, cfg)
    check_config(cfg)
    check_shape(batch, seq)
    block = ODEAttentionBlock.from_params(cfg, params, dtype=torch.float32).eval()
    x = torch.zeros(batch, seq, cfg.hidden_size)
    args = (x, torch.ones(batch, seq, dtype=torch.bool)) if padding_mask else (x,)
    module = _masked(block).eval() if padding_mask else block
    import_quietly()
    with _quiet(), _x64_for_litert():
        import litert_torch

        with torch.no_grad():
            model = litert_torch.convert(module, args)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "block.tflite")
            model.export(path)
            with open(path, "rb") as f:
                return f.read()


def _masked(block):
    """block as a module whose second positional input is the padding mask (litert-torch's args)."""
    import torch

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x, padding_mask):
            return self.block(x, padding_mask=padding_mask)

    return Masked()


class LiteRtRunner:
    """A block model loaded once by LiteRT's interpreter (its built-in kernels, no XNNPACK: see the
    module docstring) and called: run(x, padding_mask=None) -> z(1) as NumPy. shape (batch, seq),
    d_model, takes_mask and dtype (x's) are read off the model. Its inputs are checked here
    (export.artifact_inputs), and another batch or sequence than the model's is refused
    (export.PastBounds). threads: the interpreter's (None: LiteRT's choice). ValueError for bytes that
    are no block model of export_litert_block."""

    kind = "model"

    def __init__(self, model: bytes, threads: int | None = None):
        from .standalone import litert_signature

        try:
            self.signature = litert_signature(model, threads)
            inputs = self.signature.get_input_details()
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"model: expected a LiteRT .tflite block model; loading it failed "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        if "args_0" not in inputs or set(inputs) - {"args_0", "args_1"}:
            raise ValueError(f"model: expected a block model written by odeattn (inputs args_0 and args_1); found "
                             f"{', '.join(sorted(inputs)) or 'none'}")
        x = inputs["args_0"]
        if len(x["shape"]) != 3:
            raise ValueError(f"model: expected its input args_0 of rank 3 (batch, seq, d_model); got shape "
                             f"{tuple(int(n) for n in x['shape'])}")
        batch, seq, self.d_model = (int(n) for n in x["shape"])
        self.dtype = np.dtype(x["dtype"]).name
        self.shape, self.takes_mask = (batch, seq), "args_1" in inputs

    def __call__(self, x, padding_mask=None):
        x, mask = artifact_inputs(x, padding_mask, d_model=self.d_model, dtype=np.dtype(self.dtype),
                                  takes_mask=self.takes_mask, what="model")
        if x.shape[:2] != self.shape:
            raise PastBounds(f"x: the model holds batch {self.shape[0]} x seq {self.shape[1]}; got {x.shape[0]} x "
                             f"{x.shape[1]}")
        feeds = {"args_0": x} if mask is None else {"args_0": x, "args_1": mask}
        return np.array(self.signature(**feeds)["output_0"])


def litert_runner(model: bytes, threads: int | None = None) -> LiteRtRunner:
    """The model loaded once, to be called as run(x, padding_mask=None) -> z(1) (LiteRtRunner)."""
    return LiteRtRunner(model, threads)


def run_litert_block(model: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a block model on x (a one-shot: a server keeps litert_runner's run)."""
    return LiteRtRunner(model)(x, padding_mask)

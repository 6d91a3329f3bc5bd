"""The execution paths the bench times, one PathSpec each, and the shapes and FLOPs they run at.

A path is set up from (config, params, x) into a zero-argument forward; every path at a shape
gets the same input and, per config, the same weights, so their times and errors compare.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

import ode_ref as R
from ode_ref.cache import evaluations

from .baseline import plain_torch_block

SHAPES = {  # name -> (batch, seq, d_model, heads)
    "small": (1, 128, 256, 8),
    "large": (8, 512, 512, 8),
}
LONG_SHAPE = (1, 8192, 512, 8)  # --long-context
TORCH_PLAIN = "torch-plain"  # the baseline of `vs plain`


class Skip(Exception):
    """A path that cannot run here, with the reason printed in its place."""


def flops(batch: int, seq: int, d_model: int, config: R.ODEConfig) -> float:
    """The matrix products of one forward: evaluations of f (stages * steps for a tableau) *
    (8 B T D^2 + 4 B T^2 D)."""
    per_eval = 8 * batch * seq * d_model**2 + 4 * batch * seq**2 * d_model
    return float(per_eval * evaluations(config))


def _prime_torch(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _prime_jax(threads: int) -> None:
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # starts the CPU client


def _prime_ort(threads: int) -> None:
    pass


def _setup_spec(name, config, params, x, threads):
    dtype = np.float64 if name == "spec-f64" else np.float32
    xs, ps = x.astype(dtype), {k: v.astype(dtype) for k, v in params.items()}
    return (lambda: R.ode_block(ps, xs, config)), None


def setup_torch(name, config, params, x, threads):
    """torch-plain, torch-eager (the GEMM by the port's rule), torch-onednn (its projections forced
    through oneDNN) or torch-compile: (forward under no_grad, None)."""
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    torch.set_num_threads(threads)
    if name == TORCH_PLAIN:
        fn = plain_torch_block(config, params)
    else:
        block = ODEAttentionBlock.from_params(config, params)
        if name == "torch-onednn":
            from odeattn.backends.torch.gemm import onednn_usable, use_gemm

            if not onednn_usable():
                raise Skip("oneDNN is absent or disabled in this torch")
            use_gemm(block, "onednn")
        fn = torch.compile(block, fullgraph=True) if name == "torch-compile" else block
    xt = torch.from_numpy(x.astype(np.float32))

    def run():
        with torch.no_grad():
            return fn(xt)

    return run, None


def _setup_jax(name, config, params, x, threads):
    import jax.numpy as jnp

    from odeattn.backends.jax import ode_block_jit

    ps = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    xj = jnp.asarray(x, jnp.float32)
    return (lambda: ode_block_jit(ps, xj, config).block_until_ready()), None


def onnx_model(name: str, config, params):
    """The model an ort path runs: the block exported at opset 17 or 23; ort-int8: the opset 17
    export with its projections dynamically quantised to int8 (odeattn export --quantize int8);
    ort-bitnet: the opset 17 export of the BitLinear block; ort-bitnet-int: the same with integer
    BitLinear (export_model(..., bitlinear="integer"))."""
    from odeattn.export.block import export_model

    if name == "ort-int8":
        from odeattn.export.deploy import quantize_int8

        return quantize_int8(export_model(config, params, padding_mask=False))
    if name == "ort-bitnet-int":
        return export_model(config, params, opset=17, padding_mask=False, bitlinear="integer")
    return export_model(config, params, opset=23 if name == "ort-opset23" else 17, padding_mask=False)


def _setup_ort(name, config, params, x, threads):
    from odeattn.export.runtime import session

    model = onnx_model(name, config, params)
    sess = session(model, threads=threads)
    feed = {"x": x.astype(np.float32)}
    return (lambda: sess.run(None, feed)[0]), model


@dataclasses.dataclass(frozen=True)
class PathSpec:
    setup: Callable  # (name, config, params, x, threads) -> (zero-argument forward, ONNX model or None)
    imports: tuple = ()  # modules a memory process imports before its baseline
    prime: Callable | None = None  # (threads) -> None: starts the runtime before the baseline
    bitnet: bool = False  # runs the block with use_bitnet (BitLinear projections)
    live_bytes: bool = False  # torch eager: LiveTensorBytes' peak too
    long_context: str | None = None  # the reason it is left out of --long-context, if it is


_SPEC_LONG = "the NumPy spec materialises heads x T x T scores ({} GB each at B1 T8192 H8, several alive) and takes minutes per forward"
_TORCH = ("torch", "odeattn.backends.torch")
_ORT = ("onnx", "onnxruntime", "odeattn.export.block", "odeattn.export.runtime", "odeattn.export.deploy")
# The order the paths run in, whatever the order of --paths: the pairs a target compares
# (torch-plain and torch-eager, ort-opset17 and ort-opset23, ort-bitnet and ort-bitnet-int) are
# side by side, so they run seconds apart in every round.
PATH_SPECS = {
    "spec-f64": PathSpec(_setup_spec, long_context=_SPEC_LONG.format(4.3)),
    "spec-f32": PathSpec(_setup_spec, long_context=_SPEC_LONG.format(2.1)),
    TORCH_PLAIN: PathSpec(setup_torch, _TORCH, _prime_torch, live_bytes=True),
    "torch-eager": PathSpec(setup_torch, _TORCH, _prime_torch, live_bytes=True),
    "torch-onednn": PathSpec(setup_torch, _TORCH, _prime_torch, live_bytes=True),
    "torch-compile": PathSpec(setup_torch, _TORCH, _prime_torch),
    "jax-jit": PathSpec(_setup_jax, ("jax", "odeattn.backends.jax"), _prime_jax),
    "ort-opset17": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-opset23": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-int8": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-bitnet": PathSpec(_setup_ort, _ORT, _prime_ort, bitnet=True),
    "ort-bitnet-int": PathSpec(_setup_ort, _ORT, _prime_ort, bitnet=True),
}
PATHS = tuple(PATH_SPECS)


def path_inputs(shape, name: str, solver: str, steps: int):
    """(config, params, x) of a path at a shape: the same x and, per config, the same weights for
    every path (seed 0); the bitnet paths' config has use_bitnet."""
    batch, seq, d_model, heads = shape
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps,
                         use_bitnet=PATH_SPECS[name].bitnet)
    return config, R.init_params(config, seed=0), np.random.default_rng(0).normal(size=(batch, seq, d_model))


def to_numpy(out) -> np.ndarray:
    """A path's output (a torch tensor, a JAX or NumPy array) as a NumPy array."""
    return out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) else np.asarray(out)

"""The backend protocol, the built-in backends, and how third-party backends are found.

A backend is any object with these attributes (no base class needed):

    name: str                          shown in reports, e.g. "mylib"
    dtypes: tuple[str, ...]            the precisions it runs: "float32" and/or "float64"
    supports(config, dtype) -> str | None
                                       None if it runs this config in this dtype, else the reason
    run_block(config, params, x, padding_mask, dtype) -> z1
                                       the block forward; params: dict name -> array (dtype),
                                       x: (batch, seq, d_model) array of dtype, padding_mask:
                                       bool (batch, seq) or None; returns z(1), same shape, dtype
optional, for finer reports:
    run_trajectory(config, params, x, padding_mask, dtype) -> (steps + 1, batch, seq, d_model)
                                       z at every step (then run_block is not called)
    run_func(config, params, t, x, padding_mask, dtype) -> f(t, x)

config is an ode_ref.ODEConfig; all arrays are NumPy. Register a backend with the entry point
group "odeattn.backends" (the entry point names an object, a class, or a zero-argument factory),
or pass `--backend package.module:object` to `odeattn conformance`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Optional

import numpy as np

import ode_ref as R

ENTRY_POINT_GROUP = "odeattn.backends"


class SpecBackend:
    """ode_ref itself; against the frozen files it catches drift in the spec."""

    name = "spec"
    dtypes = ("float64",)

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return R.ode_block(params, x, config, padding_mask, return_trajectory=True)[1]

    def run_block(self, config, params, x, padding_mask, dtype):
        return R.ode_block(params, x, config, padding_mask)

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return R.ode_func(params, t, x, config, padding_mask)


class TorchBackend:
    name = "torch"
    dtypes = ("float32", "float64")

    def __init__(self):
        import torch

        from backends import torch as port

        self.torch, self.port = torch, port

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _block(self, config, params, dtype):
        block = self.port.ODEAttentionBlock(config).to(getattr(self.torch, dtype)).eval()
        self.port.load_params(block, params)
        return block

    def _tensors(self, x, padding_mask):
        t = self.torch
        return t.from_numpy(np.ascontiguousarray(x)), None if padding_mask is None else t.from_numpy(padding_mask)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        with self.torch.no_grad():
            return self._block(config, params, dtype)(*self._tensors(x, padding_mask), return_trajectory=True)[1].numpy()

    def run_block(self, config, params, x, padding_mask, dtype):
        with self.torch.no_grad():
            return self._block(config, params, dtype)(*self._tensors(x, padding_mask)).numpy()

    def run_func(self, config, params, t, x, padding_mask, dtype):
        with self.torch.no_grad():
            return self._block(config, params, dtype).ode_func(t, *self._tensors(x, padding_mask)).numpy()


class JaxBackend:
    name = "jax"
    dtypes = ("float32", "float64")

    def __init__(self):
        import jax

        from backends import jax as port

        self.jax, self.port = jax, port
        self._block = jax.jit(port.ode_block, static_argnames=("config", "attention", "return_trajectory"))

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _x64(self, dtype):
        return self.jax.enable_x64(dtype == "float64")

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        with self._x64(dtype):
            return np.asarray(self._block(params, x, config, padding_mask, return_trajectory=True)[1])

    def run_block(self, config, params, x, padding_mask, dtype):
        with self._x64(dtype):
            return np.asarray(self._block(params, x, config, padding_mask))

    def run_func(self, config, params, t, x, padding_mask, dtype):
        with self._x64(dtype):
            return np.asarray(self.port.ode_func(params, t, x, config, padding_mask))


BUILTIN = {"spec": SpecBackend, "torch": TorchBackend, "jax": JaxBackend}
# ours that need optional packages (onnx, onnxruntime): loaded by reference, skipped if missing
OPTIONAL_BUILTIN = {
    "onnxruntime": "export.backends:OnnxRuntimeBackend",
    "onnxruntime-opset23": "export.backends:OnnxRuntimeOpset23Backend",
    "onnx-reference": "export.backends:OnnxReferenceBackend",
}


def _instantiate(obj):
    return obj() if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "run_block")) else obj


def check_backend(backend) -> None:
    """Raise TypeError naming what a backend object lacks."""
    missing = [a for a in ("name", "dtypes", "supports", "run_block") if not hasattr(backend, a)]
    if missing:
        raise TypeError(f"backend {backend!r}: expected attributes name, dtypes, supports, run_block; missing {missing}")
    bad = [d for d in backend.dtypes if d not in ("float32", "float64")]
    if bad:
        raise TypeError(f"backend {backend.name!r}: dtypes must be 'float32' or 'float64'; got {bad}")


def load_reference(ref: str):
    """A backend from 'package.module:object'."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--backend: expected 'package.module:object' or a backend name; got {ref!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    backend = _instantiate(obj)
    check_backend(backend)
    return backend


def discover() -> dict:
    """name -> (factory or None, why unavailable): built-ins, ours that ship optional, entry points."""
    found = {}
    for name, cls in BUILTIN.items():
        found[name] = cls
    for name, ref in OPTIONAL_BUILTIN.items():
        found[name] = ref
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def make_backend(name_or_factory):
    """Instantiate one discovered backend; ImportError (a missing package) propagates."""
    obj = name_or_factory
    if isinstance(obj, str):
        return load_reference(obj)
    if isinstance(obj, importlib.metadata.EntryPoint):
        obj = obj.load()
    backend = _instantiate(obj)
    check_backend(backend)
    return backend

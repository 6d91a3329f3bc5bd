"""Adapters: the built-in backends (the spec, our ports, ONNX Runtime) the suite runs, and how
third-party adapters are found.

An adapter is any object that follows the protocol of protocol.py (no base class needed). Register
a backend with the entry point group "odeattn.backends" (the entry point names an object, a class,
or a zero-argument factory), or pass `--backend package.module:object` to `odeattn conformance`.
Every backend runs in a worker process of its own (conformance.running.worker; BackendRef.shares_process:
one it may share): the run never imports a plug-in itself.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

import ode_ref as R
from ode_ref.config import dtype_name
from ode_ref.precision import HALF_DTYPES, half_attention, half_block, half_func, round_to

from ..cases import decode_loop, run_decode
from ..cases.half import DTYPES, check_dtypes, numpy_dtype
from .exported import (OnnxReferenceAdapter, OnnxRuntimeAdapter, OnnxRuntimeIntegerAdapter, OnnxRuntimeLoopAdapter,  # noqa: F401
                       OnnxRuntimeLoopOtherStepsAdapter, OnnxRuntimeOpset23Adapter, other_steps)
from .. import external
from .encoder_adapters import FlaxEncoder, JaxEncoder, SpecEncoder, TorchEncoder
from .protocol import REQUIRED

ENTRY_POINT_GROUP = "odeattn.backends"


class SpecAdapter(SpecEncoder):
    """ode_ref itself; against the frozen files it catches drift in the spec.

    In float16 and bfloat16 it runs the spec under the mixed-precision policy
    (ode_ref.precision: half_block, half_func, and prefill / decode_step with half_attention),
    taking and returning arrays of that dtype. Those rows are not in its default dtypes: the half
    goldens are this very run, so the spec against them is exact by construction. The mutation
    battery (mutants.py) runs them, where a mutant's stage runs under the policy."""

    name = "spec"
    dtypes = ("float64",)

    def supports(self, config, dtype) -> Optional[str]:
        if dtype in HALF_DTYPES and isinstance(config, R.ODEEncoderConfig):
            return "the half-precision policy (ode_ref.precision) covers the ODE attention block, not the ODE Transformer encoder"
        return None

    variant: Optional[type] = None  # a variant of the spec's SelfAttention (ode_ref.variants) whose stages run; None: the spec's own

    def _attention(self, config):
        return None if self.variant is None else self.variant(config)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_block(params, x, config, padding_mask, dtype=dtype, attention=self._attention(config),
                                      return_trajectory=True)[1], dtype)
        return R.ode_block(params, x, config, padding_mask, attention=self._attention(config), return_trajectory=True)[1]

    def run_block(self, config, params, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_block(params, x, config, padding_mask, dtype=dtype, attention=self._attention(config)), dtype)
        return R.ode_block(params, x, config, padding_mask, attention=self._attention(config))

    def run_func(self, config, params, t, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            params, x = _float32_of(params, x)
            return _stored(half_func(params, t, x, config, padding_mask, dtype=dtype, attention=self._attention(config)), dtype)
        return R.ode_func(params, t, x, config, padding_mask, attention=self._attention(config))

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        if dtype in HALF_DTYPES:  # the prefill's and each token's z(1) rounded to dtype: no z is fed back
            params, x = _float32_of(params, x)
            attention = half_attention(config, dtype, self._attention(config))
            return _stored(round_to(run_decode(config, params, x, padding_mask, prompt, attention=attention), dtype), dtype)
        return run_decode(config, params, x, padding_mask, prompt, attention=self._attention(config))

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        if dtype in HALF_DTYPES:
            raise ValueError(f"dtype: the backward pass runs in float32 or float64; got {dtype!r} (the half-precision "
                             "policy is the forward pass's)")
        return R.ode_block_vjp(params, x, config, z1_bar, padding_mask)

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (stages.py), through this adapter's attention."""
        from ..fuzzing.stages import spec_stages

        return spec_stages(config, params, x, padding_mask, self.variant or R.SelfAttention)


# The half-precision rows each port runs (ode_ref.precision's policy): its run_* methods take and
# return arrays of these dtypes (NumPy float16, ml_dtypes.bfloat16).
HALF_ROWS = ("bfloat16", "float16")


def _float32_of(params: dict, x):
    """(params, x) of a half dtype as float32 arrays holding the same values (exact)."""
    return {k: np.asarray(v, np.float32) for k, v in params.items()}, np.asarray(x, np.float32)


def _stored(a, dtype: str):
    """a (float32 holding dtype values) as an array of dtype: NumPy float16 or ml_dtypes.bfloat16."""
    return np.asarray(a, np.float32).astype(numpy_dtype(dtype))


class TorchAdapter(TorchEncoder):
    name = "torch"
    dtypes = ("float32", "float64", *HALF_ROWS)

    def __init__(self):
        import torch

        from odeattn.backends import torch as port

        self.torch, self.port = torch, port

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _block(self, config, params, dtype):
        return self.port.ODEAttentionBlock.from_params(config, params, dtype=getattr(self.torch, dtype))

    def _tensors(self, x, padding_mask):
        """x (NumPy, in the row's dtype) as a tensor of that dtype: a bfloat16 array through float32,
        which holds it exactly (torch reads no NumPy bfloat16); the mask as a bool tensor."""
        t = self.torch
        xt = t.from_numpy(np.ascontiguousarray(self.port.params.readable(x)))
        half = dtype_name(x.dtype) in HALF_ROWS
        return xt.to(getattr(t, dtype_name(x.dtype))) if half else xt, None if padding_mask is None else t.from_numpy(padding_mask)

    def _array(self, a, dtype):
        """A tensor back as NumPy in the row's dtype (a half one through float32, exactly)."""
        return a.float().numpy().astype(numpy_dtype(dtype)) if dtype in HALF_ROWS else a.numpy()

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype)(x, padding_mask=mask, return_trajectory=True)[1], dtype)

    def run_block(self, config, params, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype)(x, padding_mask=mask), dtype)

    def run_func(self, config, params, t, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype).ode_func(t, x, padding_mask=mask), dtype)

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        block = self._block(config, params, dtype)
        x, mask = self._tensors(x, padding_mask)

        def numpy_z(step):  # decode_loop collects z as NumPy
            return lambda *args, **kw: (lambda z, cache: (self._array(z, dtype), cache))(*step(*args, **kw))

        with self.torch.no_grad():
            return decode_loop(numpy_z(lambda x, m, n: block.prefill(x, m, max_len=n)), numpy_z(block.decode_step),
                               x, mask, prompt)

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        """Autograd through the block (BitLinear: the port's straight-through estimator)."""
        block = self._block(config, params, dtype)
        x, mask = self._tensors(x, padding_mask)
        x.requires_grad_(True)
        z = block(x, padding_mask=mask)
        z.backward(self._tensors(z1_bar, None)[0])
        inner = "ode_func." + R.params.POS_PREFIX  # the shared encoder's first name: the spec's is pos_encoder.X
        return self._array(x.grad, dtype), {name.removeprefix("ode_func.") if name.startswith(inner) else name:
                                            self._array(p.grad, dtype) for name, p in block.named_parameters()}

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (stages.py): the port's SelfAttention, recording."""
        from odeattn.backends.torch.attention import SelfAttention

        from ode_ref.recording import recording

        attention = recording(SelfAttention)(config)
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            block = self.port.ODEAttentionBlock.from_params(config, params, dtype=getattr(self.torch, dtype), ode_func=attention)
            block.ode_func(0.0, x, padding_mask=mask)
        return {k: self._array(v, dtype) for k, v in type(attention).store.items()}


def jax_cache_dir() -> str:
    """Where the JAX backend keeps XLA's persistent compilation cache: the user's cache folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "odeattn", "jax")


def jax_with_cache():
    """jax, its persistent compilation cache in jax_cache_dir() and every program kept in it. A
    folder this process's JAX has already (an earlier call's, or the user's own) is kept: JAX opens
    the folder at its first compilation and keeps writing there, while a folder named later only
    enters every later program's cache key (never found again once that folder is gone)."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", jax_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jax


class JaxAdapter(JaxEncoder):
    """Through jax.jit: f(0, x) and the trajectory come from one compiled function per case config,
    the port's ode_block with return_f0 (f0 read off the first stage, so the program holds one
    evaluation of f); run_func and run_trajectory call it alike, the second call hitting JAX's own
    jit cache. f(t, x) at another t is ode_func, jitted. XLA's persistent compilation cache in the
    user's cache folder makes later runs skip compilation."""

    name = "jax"
    # bfloat16 arrays pass to the port as they are. Its float16 (tests/backends/test_precision.py) is
    # no default row: a JAX half row compiles every case config once more (the main job's slowest part).
    dtypes = ("float32", "float64", "bfloat16")

    def __init__(self):
        from odeattn.backends import jax as port

        jax = self.jax = jax_with_cache()
        self.port = port

        def forward(params, x, padding_mask, config):
            _, trajectory, f0 = port.ode_block(params, x, config, padding_mask, return_trajectory=True, return_f0=True)
            return f0, trajectory

        self._forward = jax.jit(forward, static_argnames=("config",))
        self._func = jax.jit(port.ode_func, static_argnames=("config",))

        def vjp(params, x, padding_mask, z1_bar, config):
            _, back = jax.vjp(lambda p, xx: port.ode_block(p, xx, config, padding_mask), params, x)
            params_bar, x_bar = back(z1_bar)
            return x_bar, params_bar

        self._vjp = jax.jit(vjp, static_argnames=("config",))

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _run(self, config, params, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return [np.asarray(a) for a in self._forward(params, x, padding_mask, config=config)]

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return self._run(config, params, x, padding_mask, dtype)[1]

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._run(config, params, x, padding_mask, dtype)[1][-1]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        if t == 0.0:  # the case's f0: the block's own program
            return self._run(config, params, x, padding_mask, dtype)[0]
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._func(params, t, x, config, padding_mask))

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        """jax.vjp of the block, jitted once per case config (the cotangent is an argument)."""
        with self.jax.enable_x64(dtype == "float64"):
            x_bar, params_bar = self._vjp(params, x, padding_mask, z1_bar, config=config)
            return np.asarray(x_bar), {k: np.asarray(v) for k, v in params_bar.items()}

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        port = self.port
        with self.jax.enable_x64(dtype == "float64"):
            return decode_loop(lambda x, m, n: port.prefill(params, x, config, m, max_len=n),
                               lambda x_t, cache: port.decode_step(params, x_t, cache, config), x, padding_mask, prompt)

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (stages.py): the port's SelfAttention, recording, run eagerly."""
        from odeattn.backends.jax.attention import SelfAttention

        from ode_ref.recording import recording

        attention = recording(SelfAttention)(config)
        with self.jax.enable_x64(dtype == "float64"):
            self.port.ode_func(params, 0.0, x, config, padding_mask, attention=attention)
            return {k: np.asarray(v) for k, v in type(attention).store.items()}



class FlaxAdapter(FlaxEncoder):
    """odeattn.backends.flax through module.apply under jax.jit, one compilation per case config
    and function: the block (trajectory), f once (the block's f), the prefill and the
    decode step (mutable=['cache'], the slot index traced), and jax.vjp of the block. The
    parameters are the case's, converted by from_state_dict; the gradients come back under the
    seed's names (to_state_dict)."""

    name = "flax"
    dtypes = ("float32", "float64")

    def __init__(self):
        from odeattn.backends import flax as port

        jax = self.jax = jax_with_cache()
        self.port = port
        block = lambda config, **kw: port.ODEAttentionBlock(config=config, **kw)  # noqa: E731
        static = dict(static_argnames=("config", "max_len"))
        self._trajectory = jax.jit(lambda v, x, m, config: block(config).apply(v, x, padding_mask=m, return_trajectory=True)[1],
                                   static_argnames="config")
        self._func = jax.jit(lambda v, t, x, m, config: block(config).apply(v, t, x, m, method="f"), static_argnames="config")
        self._prefill = jax.jit(lambda v, x, m, config, max_len: block(config, max_len=max_len).apply(
            v, x, padding_mask=m, mutable=["cache"]), **static)
        self._step = jax.jit(lambda v, x_t, config, max_len: block(config, max_len=max_len).apply(v, x_t, mutable=["cache"]),
                             **static)

        def vjp(v, x, m, z1_bar, config):
            _, back = jax.vjp(lambda vv, xx: block(config).apply(vv, xx, padding_mask=m), v, x)
            v_bar, x_bar = back(z1_bar)
            return x_bar, port.to_state_dict(v_bar)

        self._vjp = jax.jit(vjp, static_argnames="config")

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._trajectory(self.port.from_state_dict(config, params), x, padding_mask, config=config))

    def run_block(self, config, params, x, padding_mask, dtype):
        return self.run_trajectory(config, params, x, padding_mask, dtype)[-1]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._func(self.port.from_state_dict(config, params), t, x, padding_mask, config=config))

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            v = self.port.from_state_dict(config, params)
            n = x.shape[1]
            return decode_loop(lambda x, m, n: self._prefill(v, x, m, config=config, max_len=n),
                               lambda x_t, state: self._step({**v, **state}, x_t, config=config, max_len=n),
                               x, padding_mask, prompt)

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            x_bar, params_bar = self._vjp(self.port.from_state_dict(config, params), x, padding_mask, z1_bar, config=config)
            return np.asarray(x_bar), {k: np.asarray(v) for k, v in params_bar.items()}

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (stages.py): the Flax SelfAttention, recording, applied eagerly."""
        from ..fuzzing.stages import recording_flax

        attention = recording_flax(self.port.SelfAttention)
        block = self.port.ODEAttentionBlock(config=config, attention=attention)
        with self.jax.enable_x64(dtype == "float64"):
            block.apply(self.port.from_state_dict(config, params), 0.0, x, padding_mask, method="f")
            return {k: np.asarray(v) for k, v in attention.store.items()}


@dataclass(frozen=True)
class Builtin:
    """An adapter that ships with odeattn, and the packages it needs."""

    reference: str  # how a worker process finds it: 'module:object'
    requires: tuple[str, ...] = ()  # top-level modules; absent = "not installed", not an error
    dtypes: tuple[str, ...] = ()  # the adapter's, known before a worker constructs it
    on_request: str = ""  # why it runs only when named (not in the default run), if it does
    npm: tuple[str, ...] = ()  # a JavaScript worker's npm packages (external.py), likewise

    @classmethod
    def of(cls, adapter: type, requires: tuple[str, ...] = (), on_request: str = "") -> "Builtin":
        return cls(f"{adapter.__module__}:{adapter.__qualname__}", requires, tuple(adapter.dtypes), on_request)


_JS_SLOW = "each case's model exported, sent to Node.js and run there (20 to 90 s on 2 cores)"
BUILTIN = {
    "spec": Builtin.of(SpecAdapter),
    "torch": Builtin.of(TorchAdapter, ("torch",)),
    "jax": Builtin.of(JaxAdapter, ("jax", "jaxlib")),
    "flax": Builtin.of(FlaxAdapter, ("jax", "jaxlib", "flax"),
                       "the Flax modules over the jax port, every case compiled once more (minutes cold)"),
    "onnxruntime": Builtin.of(OnnxRuntimeAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-opset23": Builtin.of(OnnxRuntimeOpset23Adapter, ("onnx", "onnxruntime")),
    "onnxruntime-integer": Builtin.of(OnnxRuntimeIntegerAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-loop": Builtin.of(OnnxRuntimeLoopAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-loop-other-steps": Builtin.of(OnnxRuntimeLoopOtherStepsAdapter, ("onnx", "onnxruntime")),
    "onnx-reference": Builtin.of(OnnxReferenceAdapter, ("onnx",)),
    # ONNX Runtime's JavaScript builds, external workers on Node.js (external.py, js/)
    "onnxruntime-node": Builtin("odeattn.conformance.external:onnxruntime_node", ("onnx",), ("float32",), _JS_SLOW,
                                npm=("onnxruntime-node",)),
    "onnxruntime-web": Builtin("odeattn.conformance.external:onnxruntime_web", ("onnx",), ("float32",), _JS_SLOW,
                               npm=("onnxruntime-web",)),
}


# Names a user may try that are deliberately not backends, with the reason.
NOT_BACKENDS = {
    "onnxruntime-int8": "int8 dynamic quantisation (odeattn export --quantize int8) is lossy, about 1e-3 relative "
                        "error against the spec, far outside float32's tolerance; the export reports that error and "
                        "odeattn bench times it",
}


@dataclass(frozen=True)
class BackendRef:
    """How a worker process finds a backend, without the run importing it.

    label: the name shown before the backend itself reports one (a built-in's or entry point's
    name, or the reference); reference: 'module:object' or 'entry-point:NAME'; dtypes: its
    dtypes where known without constructing it (a built-in's), else None; imports: the packages
    its worker imports first (a built-in's requirements), so that the profile's import phase
    holds them rather than its construction or first case; start_timeout: the seconds its worker
    may take to start and construct it (a backends file's "start_timeout"; None: the run's);
    shares_process: its worker may go on to run another that shares (one leaving nothing behind, as a mutant)."""

    label: str
    reference: str
    builtin: bool = False
    dtypes: Optional[tuple[str, ...]] = None
    imports: tuple[str, ...] = ()
    start_timeout: Optional[float] = None
    shares_process: bool = False


def missing_requirements(name: str) -> list[str]:
    """The packages a built-in backend needs that are absent (not importable at all), and what a
    JavaScript worker lacks (Node.js, its npm packages)."""
    built = BUILTIN[name]
    missing = [m for m in built.requires if importlib.util.find_spec(m) is None]
    return missing + (external.missing_js(built.npm) if built.npm else [])


def reference_steps(ref: BackendRef):
    """A built-in backend's reference_steps: steps -> the step count its outputs for a block case
    of `steps` are judged at (the spec at that count, cases.at_steps), or None: the case's own.
    Read off the adapter's class, which the run may import (a built-in's module is the suite's)."""
    if not ref.builtin:
        return None
    return getattr(load_reference(ref.reference), "reference_steps", None)


def _instantiate(obj):
    return obj() if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "run_block")) else obj


def check_adapter(adapter) -> tuple[str, ...]:
    """Its dtypes as a tuple (read once), or TypeError naming what an adapter lacks of the
    protocol (protocol.Adapter)."""
    missing = [a for a in REQUIRED if not hasattr(adapter, a)]
    if missing:
        raise TypeError(f"adapter {adapter!r}: expected attributes {', '.join(REQUIRED)}; missing {missing}")
    if not isinstance(adapter.name, str) or not adapter.name:
        raise TypeError(f"adapter {adapter!r}: name must be a non-empty string; got {adapter.name!r}")
    try:
        return check_dtypes(adapter.dtypes)
    except ValueError:
        raise TypeError(f"adapter {adapter.name!r}: dtypes must be a non-empty tuple of {', '.join(map(repr, DTYPES))}; "
                        f"got {adapter.dtypes!r}") from None


def parse_reference(ref: str) -> tuple[str, str]:
    """('package.module', 'object.attr') from 'package.module:object.attr', or ValueError."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"backend: expected a backend name or 'package.module:object'; got {ref!r}")
    return module_name, attr


def load_reference(ref: str):
    """The object a 'package.module:object', 'entry-point:NAME' or 'exec:CMD' reference names
    (imports it; for exec:, an external.Exec)."""
    if ref.startswith("exec:"):
        return external.from_reference(ref)
    if ref.startswith("entry-point:"):
        name = ref[len("entry-point:"):]
        eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not eps:
            raise LookupError(f"entry point {name!r}: not found in group {ENTRY_POINT_GROUP!r}")
        return eps[0].load()
    module_name, attr = parse_reference(ref)
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make_adapter(ref: str, timings: Optional[dict] = None, imports=()):
    """Import, instantiate and check one adapter: what a worker does first. timings, if given,
    gets the seconds of each part: "import" (the modules named in imports, then the reference's)
    and "construction" (the rest)."""
    import time

    start = time.perf_counter()
    for module in imports:
        importlib.import_module(module)
    obj = load_reference(ref)
    imported = time.perf_counter()
    adapter = _instantiate(obj)
    check_adapter(adapter)
    if timings is not None:
        timings.update({"import": imported - start, "construction": time.perf_counter() - imported})
    return adapter


def probe_reference(ref: str, timeout: float = 120.0) -> Optional[str]:
    """Why ref cannot name an object (a usage error, beginning "backend REF: "), or None. Imports
    the plug-in in a throwaway process, so that nothing it does at import time reaches this one."""
    import subprocess

    module_name, _ = parse_reference(ref)  # ValueError for a malformed one
    if module_name.startswith("."):
        return f"backend {ref}: expected an absolute module name; got the relative {module_name!r}"
    code = ("import sys; sys.path[:] = sys.argv[2:]\n"
            "from odeattn.conformance.adapters import load_reference\n"
            "try:\n    load_reference(sys.argv[1])\n"
            "except (ImportError, AttributeError) as err:\n    print(f'{type(err).__name__}: {err}'); raise SystemExit(3)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, ref, *sys.path], capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"backend {ref}: importing it took longer than the timeout ({timeout:g} s)"
    if done.returncode == 3:
        why = done.stdout.strip()
        top = module_name.partition(".")[0]
        if why == f"ModuleNotFoundError: No module named {top!r}":  # a plug-in beside the user, run from elsewhere
            why += f"; run from the folder that holds {top}.py, or add that folder to PYTHONPATH"
        return f"backend {ref}: cannot be loaded ({why})"
    return None


def _unknown_backend(name: str, known: list) -> str:
    """The refusal of a --backend that is neither a name nor a reference, with the form it likely
    meant: the nearest name (any case), or a module's file or name written as 'module:object'."""
    expected = f"expected one of {', '.join(known)}, 'package.module:object' or exec:\"CMD ARGS\"; got {name!r}"
    near = difflib.get_close_matches(name.lower(), known, n=1)
    module = name[:-3] if name.endswith(".py") else name
    if near:
        hint = f"did you mean {near[0]!r}?"
    elif module.replace(".", "_").isidentifier():
        hint = f"a module's backend is named with its object, e.g. '{module.replace('/', '.')}:MyBackend'"
    else:
        return f"backend: {expected}"
    return f"backend: {expected}; {hint}"


def discover(requested=(), timeout: float = 120.0, declared=None) -> tuple[list[BackendRef], list[str], list[tuple[str, str]]]:
    """(backends to run, notes, errors as (label, message)).

    Without `requested`: every built-in whose packages are installed (a missing package is a
    note) but those that run on request (a note says how), then every entry point of the group (one taking a built-in's name is an error).
    With it: those names (built-in or entry point) and 'module:object' references only; an
    unknown name or a reference that cannot be loaded raises ValueError (a usage error), its
    message beginning with "backend" (the parameter's item: a command names its option).
    declared: name -> reference of a backends file's entries (external.load_backends_file), found
    as entry points are; a name taken by a built-in is a ValueError naming the file's entry."""
    entry_points = {}
    errors = []
    for name, reference in (declared or {}).items():
        if name in BUILTIN:
            raise ValueError(f"external: backends.{name}: the name is taken by a built-in backend")
        entry_points[name] = BackendRef(name, reference, start_timeout=external.start_timeout(reference))
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            errors.append((ep.name, f"entry point {ep.name!r} ({ep.value}): the name is taken by a built-in backend"))
        else:
            entry_points.setdefault(ep.name, BackendRef(ep.name, f"entry-point:{ep.name}"))
    refs, notes = [], []
    repeated = sorted({n for n in requested if list(requested).count(n) > 1})
    if repeated:
        raise ValueError(f"backend: each backend once; got {', '.join(repeated)} more than once")
    for name in requested or [*BUILTIN, *entry_points]:
        if name in BUILTIN:
            missing = missing_requirements(name)
            if missing:
                if requested and missing[0] in BUILTIN[name].requires:  # a Python package: its extra is named
                    raise ModuleNotFoundError(f"backend {name}: no module named {missing[0]!r}", name=missing[0])
                if requested:
                    raise ValueError(f"backend {name}: not installed (missing {', '.join(missing)})")
                notes.append(f"{name}: not installed (missing {', '.join(missing)})")
                continue
            built = BUILTIN[name]
            if built.on_request and not requested:
                notes.append(f"{name}: runs on request (--backend {name}): {built.on_request}")
                continue
            refs.append(BackendRef(name, built.reference, builtin=True, dtypes=built.dtypes, imports=built.requires))
        elif name in entry_points:
            refs.append(entry_points[name])
        elif name.startswith("exec:"):
            external.from_reference(name)  # ValueError for an empty or unsplittable command, or a bad start_timeout
            refs.append(BackendRef(name, name, start_timeout=external.start_timeout(name)))
        elif ":" in name:
            why = probe_reference(name, timeout)
            if why:
                raise ValueError(why)
            refs.append(BackendRef(name, name))
        elif name in NOT_BACKENDS:
            raise ValueError(f"backend {name}: not a conformance backend: {NOT_BACKENDS[name]}")
        else:
            raise ValueError(_unknown_backend(name, [*BUILTIN, *entry_points]))
    return refs, notes, errors if not requested else []

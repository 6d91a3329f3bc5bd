"""Adapters: the built-in backends the suite runs, one module each (the spec, the torch, JAX and
Flax ports, the exported ONNX models in ONNX Runtime and ONNX's reference evaluator, the deployment
targets' artifacts in their runtimes alone (targets.py), and external programs over the protocol),
and this registry: the built-ins by name, and how third-party
adapters are found.

An adapter is any object that follows the protocol of protocol.py (no base class needed). Register
a backend with the entry point group "odeattn.backends" (the entry point names an object, a class,
or a zero-argument factory), or pass `--backend package.module:object` to `odeattn conformance`.
Every backend runs in a worker process of its own (conformance.running.worker; BackendRef.shares_process:
one it may share): the run never imports a plug-in itself.

What a backend is, beyond the protocol, is an attribute of its adapter's class, False where it
lacks one: flushes_subnormals (it computes on its input with subnormal entries read as 0, as XLA
on CPU does: cases/tolerance.py) and shares_process (it leaves nothing behind in its worker, so
another that shares may run there next: running/pool.py) and case_timeout (the seconds a case may
take at least: a backend that compiles each case ahead of time).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from typing import Optional

from ode_ref.precision import DTYPES

from ..cases.half import check_dtypes
from . import external
# each backend's module, its adapter (and helpers callers import from here: `X as X`)
from .exported import (OnnxReferenceAdapter, OnnxRuntimeAdapter, OnnxRuntimeIntegerAdapter, OnnxRuntimeLoopAdapter,
                       OnnxRuntimeLoopOtherStepsAdapter, OnnxRuntimeOpset23Adapter, other_steps as other_steps)
from .compiled import AotiAdapter, ExecuTorchAdapter, LiteRtAdapter
from .flax import FlaxAdapter
from .jax_export import JaxExportAdapter
from .jax import JaxAdapter, jax_cache_dir as jax_cache_dir, jax_with_cache as jax_with_cache
from .protocol import REQUIRED
from .spec import SpecAdapter
from .targets import IreeAdapter, OpenVinoAdapter, TractAdapter
from .torch import TorchAdapter, TorchOneDnnAdapter

ENTRY_POINT_GROUP = "odeattn.backends"


@dataclass(frozen=True)
class Builtin:
    """An adapter that ships with odeattn, and the packages it needs."""

    reference: str  # how a worker process finds it: 'module:object'
    requires: tuple[str, ...] = ()  # top-level modules; absent = "not installed", not an error
    dtypes: tuple[str, ...] = ()  # the adapter's, known before a worker constructs it
    on_request: str = ""  # why it runs only when named (not in the default run), if it does
    npm: tuple[str, ...] = ()  # a JavaScript worker's npm packages (external.py), likewise
    shares_process: bool = False  # the adapter's own (BackendRef.shares_process)
    case_timeout: Optional[float] = None  # the adapter's own (BackendRef.case_timeout)
    compiler: bool = False  # it builds each case with the machine's C++ compiler (AOTInductor), which must be on the PATH
    imports: Optional[tuple[str, ...]] = None  # what its worker imports first, if not all of requires (the adapter imports the rest itself)

    @classmethod
    def of(cls, adapter: type, requires: tuple[str, ...] = (), on_request: str = "") -> "Builtin":
        """The built-in of an adapter class: its reference, dtypes, shares_process, case_timeout,
        compiler and imports read off the class."""
        return cls(f"{adapter.__module__}:{adapter.__qualname__}", requires, tuple(adapter.dtypes), on_request,
                   shares_process=getattr(adapter, "shares_process", False), case_timeout=getattr(adapter, "case_timeout", None),
                   compiler=getattr(adapter, "compiler", False), imports=getattr(adapter, "imports", None))


_JS_SLOW = "each case's model exported, sent to Node.js and run there (20 to 90 s on 2 cores)"
BUILTIN = {
    "spec": Builtin.of(SpecAdapter),
    "torch": Builtin.of(TorchAdapter, ("torch",)),
    "torch-onednn": Builtin.of(TorchOneDnnAdapter, ("torch",)),
    "jax": Builtin.of(JaxAdapter, ("jax", "jaxlib")),
    "flax": Builtin.of(FlaxAdapter, ("jax", "jaxlib", "flax"),
                       "the Flax modules over the jax port, every case compiled once more (minutes cold)"),
    "jax-export": Builtin.of(JaxExportAdapter, ("jax", "jaxlib", "flatbuffers"),
                             "each case's block exported by jax.export, serialized and run through jax alone (minutes cold)"),
    "aoti": Builtin.of(AotiAdapter, ("torch",),
                       "each case's block compiled by AOTInductor into a .pt2 package (about 30 min a dtype on 2 cores)"),
    "executorch": Builtin.of(ExecuTorchAdapter, ("torch", "executorch"),
                             "each case's block lowered to an ExecuTorch program (about 35 min on 2 cores)"),
    "litert": Builtin.of(LiteRtAdapter, ("torch", "litert_torch", "ai_edge_litert"),
                         "each case's block converted to a LiteRT model at its shape (minutes on 2 cores)"),
    "onnxruntime": Builtin.of(OnnxRuntimeAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-opset23": Builtin.of(OnnxRuntimeOpset23Adapter, ("onnx", "onnxruntime")),
    "onnxruntime-integer": Builtin.of(OnnxRuntimeIntegerAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-loop": Builtin.of(OnnxRuntimeLoopAdapter, ("onnx", "onnxruntime")),
    "onnxruntime-loop-other-steps": Builtin.of(OnnxRuntimeLoopOtherStepsAdapter, ("onnx", "onnxruntime")),
    "onnx-reference": Builtin.of(OnnxReferenceAdapter, ("onnx",)),
    "openvino": Builtin.of(OpenVinoAdapter, ("onnx", "openvino"),
                           "each case's ONNX file compiled by OpenVINO's CPU plugin (about 40 s on 2 cores)"),
    "iree": Builtin.of(IreeAdapter, ("onnx", "iree.compiler", "iree.runtime"),
                       "each case's ONNX file compiled by IREE for this CPU (about 8 min on 2 cores)"),
    "tract": Builtin.of(TractAdapter, ("onnx", "tract"), "each case's ONNX file run by tract (about 13 s on 2 cores)"),
    # ONNX Runtime's JavaScript builds, external workers on Node.js (external.py, conformance/js/)
    "onnxruntime-node": Builtin("odeattn.conformance.adapters.external:onnxruntime_node", ("onnx",), ("float32",), _JS_SLOW,
                                npm=("onnxruntime-node",)),
    "onnxruntime-web": Builtin("odeattn.conformance.adapters.external:onnxruntime_web", ("onnx",), ("float32",), _JS_SLOW,
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
    shares_process: its worker may go on to run another that shares (one leaving nothing behind, as a mutant);
    case_timeout: the seconds a case may take at least, where the run's timeout is smaller (a
    backend that compiles each case's program ahead of time)."""

    label: str
    reference: str
    builtin: bool = False
    dtypes: Optional[tuple[str, ...]] = None
    imports: tuple[str, ...] = ()
    start_timeout: Optional[float] = None
    shares_process: bool = False
    case_timeout: Optional[float] = None


def installed(module: str) -> bool:
    """Whether module (a dotted name too: its parent absent is the module absent) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # find_spec imports a dotted name's parent first
        return False


def missing_requirements(name: str) -> list[str]:
    """The packages a built-in backend needs that are absent (not importable at all), and what a
    JavaScript worker lacks (Node.js, its npm packages) or AOTInductor (a C++ compiler)."""
    built = BUILTIN[name]
    missing = [m for m in built.requires if not installed(m)]
    if built.compiler:
        from odeattn.export.aoti_program import missing_compiler

        missing += missing_compiler()
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
            refs.append(BackendRef(name, built.reference, builtin=True, dtypes=built.dtypes,
                                   imports=built.requires if built.imports is None else built.imports,
                                   shares_process=built.shares_process, case_timeout=built.case_timeout))
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

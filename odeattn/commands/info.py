"""`odeattn info`: the solvers, norms and modes of the spec, the optional packages installed, and
the backends `odeattn conformance` can run."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import ode_ref
from ode_ref.multistep import MULTISTEP

OPTIONAL = ("numpy", "torch", "jax", "onnx", "onnxruntime", "safetensors")


def register(sub) -> None:
    sub.add_parser("info", help="solvers, norms, modes and installed backends", description=__doc__)


def _version(module: str):
    """The installed version of the package that provides `module`, "installed" if its
    distribution names no version, or None if absent; read from the packages' metadata, never by
    importing them (importing torch or jax takes seconds)."""
    if importlib.util.find_spec(module) is None:
        return None
    try:  # the distribution is most often named as its module
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in importlib.metadata.packages_distributions().get(module, []):  # else its owner's: onnxruntime-gpu
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed"


def run(args) -> int:
    print(f"odeattn {ode_ref.__version__}")
    print("solvers:    " + ", ".join([f"{n} (order {t.order}, {t.num_stages} stage{'s' if t.num_stages > 1 else ''})"
                                      for n, t in ode_ref.TABLEAUS.items()]
                                     + [f"{n} (order {m.order}, multistep)" for n, m in MULTISTEP.items()]))
    print("norm types: " + ", ".join(ode_ref.NORM_TYPES))
    print("modes:      " + ", ".join(ode_ref.MODES))
    print("packages:")
    for name in OPTIONAL:
        v = _version(name)
        print(f"  {name:<12} {v if v else 'not installed'}")
    from odeattn.conformance.adapters import BUILTIN, discover, missing_requirements

    print("backends (odeattn conformance --backend NAME):")
    plugins = [ref.label for ref in discover()[0] if not ref.builtin]
    width = max(len(name) for name in [*BUILTIN, *plugins])
    for name, built in BUILTIN.items():
        missing = missing_requirements(name)
        state = f"not installed (missing {', '.join(missing)})" if missing else "installed"
        print(f"  {name:<{width}}  {state}" + (", runs on request" if built.on_request and not missing else ""))
    for label in plugins:
        print(f"  {label:<{width}}  entry point")
    return 0

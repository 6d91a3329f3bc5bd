"""`odeattn info`: the solvers, norms and modes of the spec, the optional packages installed, and
the backends `odeattn conformance` can run."""

from __future__ import annotations

import importlib

import ode_ref

OPTIONAL = ("numpy", "torch", "jax", "onnx", "onnxruntime", "safetensors")


def register(sub) -> None:
    sub.add_parser("info", help="solvers, norms, modes and installed backends")


def _version(module: str):
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or broken: report it as absent
        return None


def run(args) -> int:
    print(f"odeattn {ode_ref.__version__}")
    print("solvers:    " + ", ".join(f"{n} (order {t.order}, {t.num_stages} stage{'s' if t.num_stages > 1 else ''})"
                                     for n, t in ode_ref.TABLEAUS.items()))
    print("norm types: " + ", ".join(ode_ref.NORM_TYPES))
    print("modes:      " + ", ".join(ode_ref.MODES))
    print("packages:")
    for name in OPTIONAL:
        v = _version(name)
        print(f"  {name:<12} {v if v else 'not installed'}")
    from odeattn.conformance.adapters import BUILTIN, discover, missing_requirements

    print("backends (odeattn conformance --backend NAME):")
    for name in BUILTIN:
        missing = missing_requirements(name)
        print(f"  {name:<20} {'not installed (missing ' + ', '.join(missing) + ')' if missing else 'installed'}")
    for ref in discover()[0]:
        if not ref.builtin:
            print(f"  {ref.label:<20} entry point")
    return 0

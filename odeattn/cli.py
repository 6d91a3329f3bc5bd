"""The `odeattn` command: info, conformance, export, run, bench."""

from __future__ import annotations

import argparse
import importlib
import sys

import ode_ref

OPTIONAL = ("numpy", "torch", "jax", "onnx", "onnxruntime", "safetensors")


def _version(module: str):
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or broken: report it as absent
        return None


def cmd_info(args) -> int:
    print(f"odeattn {ode_ref.__version__}")
    print("solvers:    " + ", ".join(f"{n} (order {t.order}, {t.num_stages} stages)" for n, t in ode_ref.TABLEAUS.items()))
    print("norm types: " + ", ".join(ode_ref.NORM_TYPES))
    print("modes:      " + ", ".join(ode_ref.MODES))
    print("packages:")
    for name in OPTIONAL:
        v = _version(name)
        print(f"  {name:<12} {v if v else 'not installed'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odeattn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="solvers, norms, modes and installed backends").set_defaults(func=cmd_info)
    for register in _registrars():
        register(sub)
    return parser


def _registrars():
    """Subcommands that live beside the code they drive, imported lazily by name."""
    from odeattn.conformance.cli import register as conformance
    from odeattn.export.cli import register as export
    from odeattn.bench import register as bench

    return (conformance, export, bench)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

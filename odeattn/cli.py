"""The `odeattn` command: info, conformance, export, run, bench, diagnose, demo."""

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
    print("solvers:    " + ", ".join(f"{n} (order {t.order}, {t.num_stages} stage{'s' if t.num_stages > 1 else ''})" for n, t in ode_ref.TABLEAUS.items()))
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


def require(module: str) -> None:
    """ModuleNotFoundError naming `module` unless it is installed (main() then names the extra that
    installs it): an optional dependency checked, not imported, before any work starts."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend: every command's plots, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_output_path(option: str, path, suffix: str | None = None) -> None:
    """ValueError unless `path` can be written: the expected suffix, not a folder, in a folder that
    exists and takes a file (tried by opening it, so a read-only file system counts too; nothing
    is left behind). Every command checks its outputs with this before any work starts."""
    import os
    from pathlib import Path

    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option}: expected a file path; got the folder {os.fspath(path)!r}")
    if suffix and path.suffix.lower() != suffix:
        raise ValueError(f"{option}: expected a file ending in {suffix}; got {os.fspath(path)!r}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"{option}: the folder {os.fspath(folder)!r} does not exist")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"{option}: {os.fspath(path)!r} is not writable ({err.strerror})") from None
    if not existed:
        path.unlink()


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0; got {text!r}")
    return value


# a missing module -> the extra that installs it
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx",
          "matplotlib": "bench", "safetensors": "conformance", "tqdm": "conformance", "jsonschema": "conformance"}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block; --help has the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="odeattn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"odeattn {ode_ref.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="solvers, norms, modes and installed backends").set_defaults(func=cmd_info)
    for register in _registrars():
        register(sub)
    return parser


def _registrars():
    """Subcommands that live beside the code they drive, imported lazily by name."""
    from odeattn.conformance.cli import register as conformance
    from odeattn.export.cli import register as export
    from odeattn.commands.bench import register as bench
    from odeattn.diagnose import register as diagnose
    from odeattn.demo import register as demo

    return (conformance, export, bench, diagnose, demo)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top not in EXTRAS:
            raise
        print(f"odeattn {args.command}: needs the package {top!r}, which is not installed; "
              f"install it with: pip install 'odeattn[{EXTRAS[top]}]'", file=sys.stderr)
        return 2
    except ValueError as err:  # a UsageError, or a library's own check of the command's input
        print(f"odeattn {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

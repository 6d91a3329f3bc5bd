"""Argument helpers shared by every command. A leaf: it imports nothing of the project.

A command reports a usage error by raising UsageError (or ValueError/TypeError from a library's
own checks); odeattn.cli.main prints it as one line, `odeattn COMMAND: message`, and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path


class UsageError(ValueError):
    """Bad input to a command: printed as one line, exit 2, before any long work starts."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block; --help has the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# a missing module -> the extra that installs it
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx",
          "matplotlib": "bench", "safetensors": "conformance", "tqdm": "conformance", "jsonschema": "conformance"}


def require(module: str) -> None:
    """ModuleNotFoundError naming `module` unless it is installed (main() then names the extra that
    installs it): an optional dependency checked, not imported, before any work starts."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def check_output_path(option: str, path, suffix: str | None = None) -> None:
    """ValueError unless `path` can be written: the expected suffix, not a folder, in a folder that
    exists and takes a file (tried by opening it, so a read-only file system counts too; nothing
    is left behind). Every command checks its outputs with this before any work starts."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option}: expected a file path; got the folder {os.fspath(path)!r}")
    if suffix and path.suffix.lower() != suffix:
        raise UsageError(f"{option}: expected a file ending in {suffix}; got {os.fspath(path)!r}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option}: the folder {os.fspath(folder)!r} does not exist")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise UsageError(f"{option}: {os.fspath(path)!r} is not writable ({err.strerror})") from None
    if not existed:
        path.unlink()


def read_json(option: str, path: Path):
    """The parsed file; UsageError naming the option and the file if it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{option} {os.fspath(path)!r}: not valid JSON ({err})") from None


def comma_list(option: str, text: str, allowed=None, *, positive_ints: bool = False) -> list:
    """The comma-separated values of an option; UsageError naming it unless each is allowed (or,
    with positive_ints, an integer >= 1)."""
    items = [v.strip() for v in text.split(",")]
    if positive_ints:
        if not all(v.isdigit() and int(v) >= 1 for v in items):
            raise UsageError(f"{option}: expected comma-separated integers >= 1; got {text!r}")
        return [int(v) for v in items]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise UsageError(f"{option}: unknown {bad}; expected some of {', '.join(allowed)}")
    return items


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}")
    return value

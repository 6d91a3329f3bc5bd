"""Argument helpers shared by every command. A leaf: it imports nothing of the project.

A command reads and checks its input inside `with user_input():`, which turns a library's
ValueError or TypeError (and an unreadable file's OSError) into a UsageError; odeattn.cli.main
prints a UsageError as one line, `odeattn COMMAND: message`, and exits 2, and a CommandFailed the
same way with its own exit code. Any other error, raised by the work after the checks, is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
from pathlib import Path


class UsageError(ValueError):
    """Bad input to a command: printed as one line, exit 2, before any long work starts."""

    code = 2


class CommandFailed(Exception):
    """A command that ran and failed in a way its user can act on (not a bug): printed as a
    UsageError is, `odeattn COMMAND: message`, with exit code `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _named(option: str | None, message: str) -> str:
    return message if option is None or message.startswith(option) else f"{option}: {message}"


@contextlib.contextmanager
def user_input(option: str | None = None):
    """The phase of a command that reads and checks its input: a ValueError or TypeError raised
    inside (a library's check of the input) becomes a UsageError, and so does an OSError (a file
    that is missing, a folder, unreadable: named). With option, the message names it, "--x: ..."
    (a message that already starts with it is kept). Wrap exactly that phase, before any long
    work: what the work raises after it is a bug, and keeps its traceback."""
    try:
        yield
    except OSError as err:
        detail = f"{err.strerror}: {str(err.filename)!r}" if err.strerror and err.filename else str(err)
        raise UsageError(_named(option, detail or type(err).__name__)) from None
    except (ValueError, TypeError) as err:
        if isinstance(err, UsageError) and option is None:
            raise
        raise UsageError(_named(option, str(err) or type(err).__name__)) from None


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block; --help has the usage.

    Whatever argparse stumbled on first, an option that the command does not take is what the
    line names, with the nearest one it does take ("unknown option --backends; did you mean
    --backend?"), and a missing subcommand is named with the ones there are. (argparse would
    otherwise let a positional such as `conformance`'s action take the unknown option's value
    and report that instead.)"""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)  # what error() explains
        return super().parse_known_args(args, namespace)

    def error(self, message):
        prog, message = _explain(self, getattr(self, "_given", []), message)
        self.exit(2, f"{prog}: {message} (see {prog} --help)\n")


def _looks_negative(token: str) -> bool:
    """A negative number (a value, not an option), as argparse reads one."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def _taken(parser, token: str):
    """The action the option `token` (maybe `--opt=value`, `-jN`, or an abbreviation) names in
    parser; True for an ambiguous abbreviation (argparse reports that itself); None if none."""
    actions = parser._option_string_actions
    name = token.partition("=")[0] if token.startswith("--") else token[:2]
    if token in actions or name in actions:
        return actions[token if token in actions else name]
    if token.startswith("--") and parser.allow_abbrev:
        matches = {actions[o] for o in actions if o.startswith(name)}
        if matches:
            return matches.pop() if len(matches) == 1 else True
    return None


def _scan(parser, tokens, depth: int = 0):
    """(the parser the tokens end in, its depth below the one given, the first option there that
    it does not take or None, whether a positional was given to it), following subcommands."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    positional, i = False, 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            return parser, depth, None, True
        if token.startswith("-") and len(token) > 1 and not _looks_negative(token):
            action = _taken(parser, token)
            if action is None and " " not in token:
                return parser, depth, token.partition("=")[0], positional
            attached = "=" in token if token.startswith("--") else len(token) > 2  # --opt=value, -jN
            if isinstance(action, argparse.Action) and not attached:
                i += 1 if action.nargs is None else action.nargs if isinstance(action.nargs, int) else 0  # its values
            continue
        positional = True
        if sub is not None and token in sub.choices:
            return _scan(sub.choices[token], tokens[i:], depth + 1)
    return parser, depth, None, positional


def _explain(parser, given, message: str):
    """(the prog to name, the message): an unknown option, or a missing subcommand, if the
    arguments hold one; argparse's own message otherwise."""
    import difflib

    where, depth, unknown, positional = _scan(parser, given)
    sub = next((a for a in where._actions if isinstance(a, argparse._SubParsersAction)), None)
    command = next((sub.choices[t] for t in given if sub is not None and t in sub.choices), None)
    if unknown is not None and command is not None and _taken(command, unknown) is not None:
        return command.prog, f"{unknown} belongs after the command: {command.prog} {unknown} ..."
    if unknown is not None:
        near = difflib.get_close_matches(unknown, [o for o in where._option_string_actions if o.startswith("--")], n=1)
        return where.prog, f"unknown option {unknown}" + (f"; did you mean {near[0]}?" if near else "")
    if sub is not None and sub.required and not positional:
        what = "subcommand" if depth or " " in where.prog else "command"
        return where.prog, f"expected a {what}: {', '.join(sub.choices)}"
    return parser.prog, message


# a missing module -> the extra that installs it
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "flatbuffers": "jax", "flax": "flax", "optax": "flax",
          "onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx", "openvino": "openvino",
          "iree": "iree", "iree.compiler": "iree", "iree.runtime": "iree", "tract": "tract", "executorch": "executorch",
          "litert_torch": "litert", "ai_edge_litert": "litert",
          "matplotlib": "bench", "safetensors": "conformance", "tqdm": "conformance", "jsonschema": "conformance"}


def require(module: str) -> None:
    """ModuleNotFoundError naming `module` unless it is installed (main() then names the extra that
    installs it): an optional dependency checked, not imported, before any work starts. The same
    check as conformance.adapters.installed, written again: these helpers import nothing of the
    project (tests/test_house.py)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is absent
        found = False
    if not found:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def check_output_path(option: str, path, suffix: str | None = None, *, force: bool = False, others=None) -> None:
    """UsageError unless `path` can be written: the expected suffix (in any case), not a folder, in
    a folder that exists and takes a new file (tried by making a temporary one, so a read-only file
    system counts too; nothing is left behind), not an existing file unless force (--force), and
    not the file of any of `others` (option -> path: the command's inputs and its other outputs),
    force or not. Every command checks its outputs with this before any work starts, and writes
    them through ode_ref.files (whole or not at all)."""
    import tempfile

    if path is None:
        return
    path = Path(path)
    shown = os.fspath(path)
    if path.is_dir():
        raise UsageError(f"{option}: expected a file path; got the folder {shown!r}")
    if suffix and path.suffix.lower() != suffix:
        raise UsageError(f"{option}: expected a file ending in {suffix}; got {shown!r}")
    for other, given in (others or {}).items():
        if given is not None and same_file(path, given):
            raise UsageError(f"{option}: {shown!r} is the file given to {other}; expected a different file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option}: the folder {os.fspath(folder)!r} does not exist")
    if path.exists() and not force:
        raise UsageError(f"{option}: {shown!r} exists already; pass --force to overwrite it")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UsageError(f"{option}: {shown!r} is not writable ({err.strerror})") from None


def same_file(a, b) -> bool:
    """Whether the paths name one file: the same resolved path, or (both existing) the same inode
    (a hard link, a symlink)."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def add_force(parser) -> None:
    """--force: every command that writes files refuses to replace an existing one without it."""
    parser.add_argument("--force", action="store_true", help="overwrite output files that exist")


def read_json(option: str, path: Path):
    """The parsed file; UsageError naming the option and the file if it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{option} {os.fspath(path)!r}: not valid JSON ({err})") from None
    except RecursionError:  # arrays or objects nested deeper than the parser's recursion limit
        raise UsageError(f"{option} {os.fspath(path)!r}: not valid JSON (nested too deep to parse)") from None


NPY_MAGIC = b"\x93NUMPY"


def load_npy(option: str, path):
    """The array in the .npy file at path, read without ever unpickling; UsageError naming the
    option and the file if it is missing, a folder, not a .npy file (a .npz archive, JSON, a
    pickle...), an array of Python objects or damaged. NumPy's own advice on unpickling never
    reaches the user: a file that would need it is refused here."""
    import numpy as np

    shown = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
            if head != NPY_MAGIC:
                what = "a .npz archive (save one array with numpy.save)" if head.startswith(b"PK") else "not one (no .npy header)"
                raise UsageError(f"{option}: expected a .npy array; {shown!r} is {what}")
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"{option}: no such file {shown!r}") from None
    except OSError as err:  # a folder given as a file, an unreadable file
        raise UsageError(f"{option}: {err.strerror or err}: {shown!r}") from None
    except UsageError:
        raise
    except ValueError as err:
        if "pickle" in str(err) or "Object arrays" in str(err):
            raise UsageError(f"{option}: expected a .npy array of numbers; {shown!r} holds Python objects, "
                             "which are never unpickled") from None
        raise UsageError(f"{option}: expected a .npy array; {shown!r} is a damaged .npy file ({err})") from None
    except EOFError as err:
        raise UsageError(f"{option}: expected a .npy array; {shown!r} is a damaged .npy file ({err or 'truncated'})") from None


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

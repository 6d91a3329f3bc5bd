"""The folder `odeattn conformance generate` writes a golden set into (golden.write_golden).

Generate writes only into a folder that is missing, empty, or already holds a golden set (a
manifest.json listing its case files), and never removes or replaces a file it did not write:
the files the old manifest lists are its own, anything else in the folder is the user's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST = "manifest.json"  # the set's index, golden.MANIFEST


def _is_case_file(name) -> bool:
    """A plain file name in the folder (no path, so a manifest cannot point elsewhere)."""
    return isinstance(name, str) and name.endswith(".safetensors") and os.path.basename(name) == name


def owned_files(directory) -> set:
    """The case files the golden set in directory lists (generate's own, which it may replace or
    remove); ValueError naming the folder unless it is missing, empty or holds a golden set."""
    directory = Path(directory)
    if not directory.exists():
        return set()
    if not directory.is_dir():
        raise ValueError(f"golden directory {os.fspath(directory)!r}: expected a folder; got a file")
    present = sorted(p.name for p in directory.iterdir())
    if not present:
        return set()
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = {e["file"] for e in manifest["cases"]}
        listed = "format" in manifest and all(map(_is_case_file, files))
    except (OSError, ValueError, KeyError, TypeError):
        listed = False
    if not listed:
        shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
        raise ValueError(f"golden directory {os.fspath(directory)!r}: expected an empty folder or one holding a golden "
                         f"set (its {MANIFEST}); it holds {shown}; generate writes nothing there")
    return files


def check_writable(directory: Path) -> None:
    """PermissionError unless files can be created in directory (made if missing); tried, not
    guessed from permission bits, so a read-only file system counts too."""
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise PermissionError(f"golden directory {os.fspath(directory)!r}: not writable ({err.strerror or err})") from None


def check_names(directory, owned: set, names) -> None:
    """ValueError naming the first of `names` (files generate is about to write) that is in
    directory but not one of `owned`: a user's file it would replace."""
    theirs = [n for n in names if n not in owned and (Path(directory) / n).exists()]
    if theirs:
        raise ValueError(f"golden directory {os.fspath(directory)!r}: {theirs[0]} is not a file of its golden set's "
                         f"{MANIFEST}; generate replaces only its own files")

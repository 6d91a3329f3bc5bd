"""A backend module beside the user: `odeattn conformance` and the pytest plugin both put the
working folder on the import path before loading a 'module:object' backend, as `python -m` does,
so that `--backend mymod:MyPort` finds mymod.py in the folder the command runs in (the `pytest`
script, unlike `python -m pytest`, puts its own folder there instead)."""

from __future__ import annotations

import os
import sys


def import_from_working_folder() -> None:
    """Put the working folder first on sys.path, unless it (or '', which stands for it) is there."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())

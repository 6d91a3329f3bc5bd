"""Failing fuzz examples kept between runs: `odeattn conformance fuzz --database DIR` (the pytest
plugin's --odeattn-database DIR).

A run given a folder keeps each divergent example hypothesis finds (the shrunk one, and the larger
ones on its way) in hypothesis's own example database, one folder per backend name and dtype
(DIR/<backend>-<dtype>/), and a later run judges those first: a fix is checked against the
example that broke it before anything new is drawn. An example that no longer fails is dropped
from the folder. Without a folder nothing is kept, and nothing is written in the working folder:
hypothesis's own folder (.hypothesis/, where it caches what it reads of local modules) is a
temporary one during a run (scratch_home).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir, storage_directory
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from .repro import folder_name


SUB_KEYS = (b".secondary", b".pareto")  # hypothesis's keys beside a test's own: examples on the way to a failure


class CountingDatabase(DirectoryBasedExampleDatabase):
    """hypothesis's folder of examples for one backend and dtype, counting the failures it hands
    back (a test's own key, not the examples kept on the way to them): hypothesis runs those
    before anything else (its reuse phase), so the first `fetched` draws are replays."""

    def __init__(self, root, backend: str, dtype: str, suffix: str = ""):
        super().__init__(str(Path(root) / folder_name(backend, dtype, suffix)))
        self.fetched = 0

    def fetch(self, key: bytes):
        for value in super().fetch(key):
            if not key.endswith(SUB_KEYS):
                self.fetched += 1
            yield value


class RowDatabase(ExampleDatabase):
    """database's examples under a covering array's row of its own (cover.py): a cell's failures
    are choices of the row's strategy, so they are kept and replayed apart from the random
    search's, wherever the row appears in a later run's array."""

    def __init__(self, database: ExampleDatabase, row: dict):
        super().__init__()
        self.database, self.prefix = database, repr(sorted(row.items())).encode() + b":"

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(self.prefix + key, value)

    def fetch(self, key: bytes):
        yield from self.database.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(self.prefix + src, self.prefix + dest, value)


@contextmanager
def scratch_home():
    """hypothesis's home folder in a temporary one while the block runs, the caller's (a port's own
    test suite may use hypothesis too) restored after: a run leaves no .hypothesis/ behind."""
    previous = storage_directory(intent_to_write=False).path
    with tempfile.TemporaryDirectory(prefix="odeattn-hypothesis-") as scratch:
        set_hypothesis_home_dir(scratch)
        try:
            yield
        finally:
            set_hypothesis_home_dir(previous)

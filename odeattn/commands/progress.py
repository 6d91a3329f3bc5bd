"""The progress of a long command on stderr: a bar on a terminal, a line per finished part elsewhere.

On a terminal, a tqdm bar advances per case with its total known from the start, the backend
and dtype of the last case, and an ETA; each finished backend also leaves a line above the bar.
To a file or a pipe (a CI log), there is no bar, only those lines, one per backend as it finishes.
"""

from __future__ import annotations

import os
import sys


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or no isatty
        return False


def finished_line(backend: str, counts: dict, seconds: float, note: str = "") -> str:
    """'torch: 174 passed, 2 failed, 12 skipped in 31.2 s', or why the backend ran nothing."""
    if note:
        return f"{backend}: not run ({note}) after {seconds:.1f} s"
    failed = sum(counts.get(s, 0) for s in ("failed", "error", "xpassed"))
    parts = [f"{counts.get('passed', 0)} passed", f"{failed} failed"]
    parts += [f"{counts[s]} {s}" for s in ("skipped", "xfailed", "untestable") if counts.get(s)]
    return f"{backend}: {', '.join(parts)} in {seconds:.1f} s"


# what a note of the runner's means, said once per backend
NOTES = {"JAX compiling": "each case's programs are compiled for XLA, minutes with a cold cache; later runs read "
                          "them from JAX's persistent cache"}


class Progress:
    """What conformance.running.runner.run_suite reports as it goes (begin, grow, advance, finished,
    close), shown on `stream` (default stderr). unit: what the bar counts; mininterval: the
    fewest seconds between two redraws of the bar."""

    def __init__(self, stream=None, unit: str = "case", mininterval: float = 0.1):
        self.stream = stream if stream is not None else sys.stderr
        self.unit, self.mininterval = unit, mininterval
        self.bar = None
        self.said = set()  # (backend, note) already said in a line

    def begin(self, total: int) -> None:
        if not is_terminal(self.stream):
            return
        try:
            from tqdm import tqdm
        except ImportError:  # no bar; the finished lines still come
            return
        try:
            width = {"dynamic_ncols": True} if os.get_terminal_size(self.stream.fileno()).columns else {"ncols": 80}
        except (AttributeError, ValueError, OSError):
            width = {"ncols": 80}  # a terminal that reports no size: tqdm would draw nothing
        self.bar = tqdm(total=total, unit=self.unit, file=self.stream, leave=False, desc="starting", **width,
                        mininterval=self.mininterval, miniters=1,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}s "
                                   "[{elapsed}<{remaining}, {rate_fmt}]")

    def grow(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def advance(self, label: str = "", note: str = "") -> None:
        """One more done; label (the backend and dtype of the case) shown before the bar, with
        note (what the backend is busy with: 'JAX compiling'). A backend's first note is also
        said once in a line, on a terminal and in a log alike, so a slow stretch is explained."""
        backend = label.partition("/")[0]
        if note and (backend, note) not in self.said:
            self.said.add((backend, note))
            self._line(f"{backend}: {note}: {NOTES.get(note, '')}".rstrip(": "))
        if self.bar is not None:
            if label:
                self.bar.set_description_str(f"{label}, {note}" if note else label, refresh=False)
            self.bar.update(1)

    def _line(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def finished(self, backend: str, counts: dict, seconds: float, note: str = "") -> None:
        self._line(finished_line(backend, counts, seconds, note))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

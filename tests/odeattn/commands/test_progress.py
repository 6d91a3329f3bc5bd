"""The main job's progress (odeattn/commands/progress.py), driven with fake streams: a bar that
advances per case with its total known from the start on a terminal, a line per finished backend
elsewhere."""

import io

from odeattn.commands.progress import Progress
from odeattn.conformance.adapters import BUILTIN, BackendRef
from odeattn.conformance.golden import load_cases
from odeattn.conformance.running.runner import run_suite
from odeattn.conformance.running.selection import select

SOME = select(load_cases(), include=["derf_euler"])


class Terminal(io.StringIO):
    def isatty(self):
        return True


def frames(stream) -> list[str]:
    """What a terminal showed, one redraw of the line a frame."""
    return [f.strip() for f in stream.getvalue().replace("\n", "\r").split("\r") if f.strip()]


def spec_run(stream):
    report = run_suite([BackendRef("spec", BUILTIN["spec"].reference, builtin=True, dtypes=("float64",))], SOME,
                       progress=Progress(stream, mininterval=0), jobs=1)  # every redraw, however fast the cases
    assert report.exit_code == 0
    return report


def test_without_a_terminal_a_line_per_finished_backend_and_no_bar():
    stream = io.StringIO()
    spec_run(stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in stream.getvalue(), lines
    assert lines[0].startswith(f"spec: {len(SOME)} passed, 0 failed in ") and lines[0].endswith(" s"), lines


def test_on_a_terminal_the_bar_knows_its_total_from_the_start_and_advances_per_case():
    stream = Terminal()
    spec_run(stream)
    shown = frames(stream)
    n = len(SOME)
    assert f"0/{n} cases" in shown[0]  # the total before any case finished
    counts = [int(f.split("|")[2].split("/")[0]) for f in shown if f.count("|") == 2]
    assert counts == sorted(counts) and counts[-1] == n and len(set(counts)) == n + 1, counts  # each case, in order
    assert any(f.startswith("spec/float64") and "<" in f for f in shown)  # the backend and an ETA
    assert any(f.startswith(f"spec: {n} passed, 0 failed in ") for f in shown)  # written above the bar


def test_a_total_grows_when_a_plugin_states_its_dtypes_and_a_refused_one_is_said():
    stream = io.StringIO()
    p = Progress(stream)
    p.begin(4)
    p.grow(4)
    p.finished("mine", {}, 0.5, "RuntimeError: no device")
    p.finished("torch", {"passed": 5, "failed": 1, "error": 2, "skipped": 3}, 12.34, "")
    p.close()
    assert stream.getvalue().splitlines() == ["mine: not run (RuntimeError: no device) after 0.5 s",
                                              "torch: 5 passed, 3 failed, 3 skipped in 12.3 s"]


def test_a_backend_s_line_counts_its_untestable_half_rows():
    from odeattn.commands.progress import finished_line

    assert finished_line("torch", {"passed": 99, "failed": 0, "untestable": 47}, 3.04) == \
        "torch: 99 passed, 0 failed, 47 untestable in 3.0 s"


def test_a_backend_compiling_says_so_once_in_a_line_and_on_the_bar():
    """The runner's note 'JAX compiling' (a case that compiled XLA programs) shows beside the bar's
    label and, the first time per backend, in a line of its own; a log gets the line too."""
    stream = Terminal()
    p = Progress(stream, mininterval=0)
    p.begin(3)
    p.advance("jax/float32", "JAX compiling")
    p.advance("jax/float32", "JAX compiling")
    p.advance("jax/float64", "")
    p.close()
    shown = frames(stream)
    assert any(f.startswith("jax/float32, JAX compiling ") for f in shown)
    assert sum(f.startswith("jax: JAX compiling: each case's programs are compiled for XLA") for f in shown) == 1
    log = io.StringIO()
    p = Progress(log)
    p.begin(2)
    p.advance("jax/float32", "JAX compiling")
    p.advance("jax/float64", "JAX compiling")
    assert len(log.getvalue().splitlines()) == 1 and log.getvalue().startswith("jax: JAX compiling: ")


def test_the_runner_notes_a_case_that_compiled():
    """run_suite passes 'JAX compiling' with a result whose case compiled XLA programs (not all
    read from the persistent cache), and nothing otherwise."""
    from odeattn.conformance.running.runner import busy_note

    assert busy_note({"programs": 3, "cache_hits": 1}) == "JAX compiling"
    assert busy_note({"programs": 3, "cache_hits": 3}) == busy_note({}) == ""
    seen = []

    class Recorder(Progress):
        def advance(self, label="", note=""):
            seen.append((label, note))

    report = run_suite([BackendRef("spec", BUILTIN["spec"].reference, builtin=True, dtypes=("float64",))], SOME[:2],
                       progress=Recorder(io.StringIO()), jobs=1)
    assert report.exit_code == 0 and seen == [("spec/float64", "")] * 2  # the spec compiles nothing

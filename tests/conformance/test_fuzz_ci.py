"""The fuzzer in a port author's CI: the pytest plugin run as the `pytest` script in the port's own
folder, a backend's declared support (protocol version 2 for exec: workers) that the draws keep
within, refused draws counted by reason and a shortfall that fails the run, failing examples
kept in a database and judged first on the next run, and a port's faults (raising, answering
garbage, exiting, hanging, crashing) reported as its findings, each bound holding."""

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from odeattn.cli import main
from odeattn.conformance.adapters import external as E
from odeattn.conformance.adapters import make_adapter
from odeattn.conformance.fuzzing.fuzz import fuzz
from odeattn.conformance.mutation import planted

WORKER = Path(__file__).with_name("external_worker.py")
PYTEST = Path(sys.executable).with_name("pytest")  # the script, as a port author runs it (not python -m pytest)
MY_PORT = """
from odeattn.conformance.adapters import SpecAdapter


class MyPort(SpecAdapter):
    name = "mine"
"""


def _pytest_script(folder: Path, *args: str) -> subprocess.CompletedProcess:
    if not PYTEST.is_file():
        pytest.skip(f"no pytest script beside {sys.executable}")
    return subprocess.run([str(PYTEST), "-p", "no:cacheprovider", *args], capture_output=True, text=True, cwd=folder,
                          timeout=300)


def test_the_pytest_script_finds_a_backend_module_in_the_port_s_own_folder(tmp_path):
    """The port's tests in tests/ (so pytest puts tests/, not the folder, on the path): mymod.py
    beside them is found as `odeattn conformance` finds it, and the fuzz item leaves no .hypothesis/."""
    (tmp_path / "mymod.py").write_text(MY_PORT)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mine.py").write_text("def test_mine():\n    pass\n")
    done = _pytest_script(tmp_path, "--odeattn-backend", "mymod:MyPort", "--odeattn-examples", "3", "-k",
                          "test_mine or fuzz or block_t1", "tests")
    assert done.returncode == 0 and "4 passed" in done.stdout, done.stdout + done.stderr  # the two fuzz items among them
    assert not (tmp_path / ".hypothesis").exists()


@pytest.mark.parametrize("args, message", [
    (["--odeattn-backend", "nomod:MyPort"], "ERROR: --odeattn-backend nomod:MyPort: cannot be loaded (ModuleNotFoundError: "
                                            "No module named 'nomod'; run from the folder that holds nomod.py"),
    (["--odeattn-backend", "spec", "--odeattn-dtype", "float8"], "ERROR: --odeattn-dtype: expected one of float32, float64, "
                                                                 "bfloat16, float16; got 'float8'"),
    (["--odeattn-backend", "spec", "--odeattn-min-examples", "9", "--odeattn-examples", "5"],
     "ERROR: --odeattn-min-examples: expected an integer from 1 to the budget (5); got 9"),
    (["--odeattn-backend", "spec", "--odeattn-examples", "-1"], "ERROR: --odeattn-examples: expected an integer >= 0; got -1"),
    (["--odeattn-backend", "spec", "--odeattn-dtype", "float32"],
     "ERROR: --odeattn-dtype: no backend runs any of the dtypes asked for (float32)"),
    (["--odeattn-backend", "spec", "--odeattn-timeout", "0"], "ERROR: --odeattn-timeout: expected a finite number of seconds > 0; got 0.0"),
], ids=["missing-module", "bad-dtype", "minimum-over-budget", "negative-examples", "dtype-it-lacks", "timeout-0"])
def test_a_bad_plugin_option_is_a_one_line_usage_error(tmp_path, args, message):
    done = _pytest_script(tmp_path, *args)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 4 and len(errors) == 1 and errors[0].startswith(message), done.stdout + done.stderr
    assert "INTERNALERROR" not in done.stdout + done.stderr


PICKY = """
from odeattn.conformance.adapters import SpecAdapter


class Picky(SpecAdapter):
    \"\"\"A narrow port that says so only case by case (supports()): derf, rk38, 2 steps, decoder mode.\"\"\"

    name = "picky"
    run_vjp = run_decode = run_encoder = None
    WANTS = {"norm_type": "derf", "ode_solver": "rk38", "ode_steps": 2, "mode": "decoder"}

    def supports(self, config, dtype):
        wrong = next((k for k, v in self.WANTS.items() if getattr(config, k) != v), None)
        return None if wrong is None else f"not supported: {wrong} {getattr(config, wrong)}"


class Declared(Picky):
    \"\"\"The same port, its support declared: the fuzzer draws only configs it runs.\"\"\"

    name = "declared"
    support = {"config": {k: [v] for k, v in Picky.WANTS.items()}}
"""


@pytest.fixture
def picky(tmp_path, monkeypatch):
    """The module picky_port (PICKY), importable by the command as by the test."""
    (tmp_path / "picky_port.py").write_text(PICKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("picky_port")


def test_a_declared_support_is_drawn_within_and_case_by_case_refusals_are_counted_by_reason(picky):
    narrow, declared = fuzz(picky.Picky(), "float64", examples=10), fuzz(picky.Declared(), "float64", examples=10)
    assert declared.examples == 10 and declared.skipped == 0 and not declared.short
    assert set(declared.refusals) <= {"no fair input"}  # the only draws it did not judge
    assert narrow.short and narrow.examples < 10 and narrow.skipped > 10 * narrow.examples
    assert sum(narrow.refusals.values()) == narrow.skipped + narrow.unfair
    assert narrow.refusals["not supported: norm_type layer_norm"] > 0


def test_a_shortfall_fails_the_command_unless_the_minimum_accepts_it(tmp_path, picky, capsys):
    # seed 1: 2 of its draws hold the port's four factors together (at seed 0, none: then nothing is judged, exit 2)
    argv = ["conformance", "fuzz", "--backend", "picky_port:Picky", "--examples", "10", "--seed", "1", "--repro", str(tmp_path / "r"),
            "--json", str(tmp_path / "fuzz.json"), "--force"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    judged = int(re.search(r"^fuzz: picky/float64: judged (\d+) of 10 examples asked: hypothesis stopped drawing after "
                           r"\d+ draws, \d+ of them refused \(.*not supported: .*\); that is not a pass "
                           r"\(--min-examples N accepts fewer\)$", err, re.M).group(1))
    assert 1 <= judged < 10 and "  refused: " in out and "  shortfall: judged" in out
    report = json.loads((tmp_path / "fuzz.json").read_text())
    assert report["exit_code"] == 1 and report["runs"][0]["short"] and report["runs"][0]["refusals"]
    assert main([*argv, "--min-examples", str(judged)]) == 0


def _exec(mode: str) -> str:
    return f"exec:{sys.executable} {WORKER} {mode}"


def test_a_version_2_worker_s_declared_support_is_all_it_is_sent(tmp_path, monkeypatch):
    record = tmp_path / "requests.jsonl"
    monkeypatch.setenv("ODEATTN_TEST_RECORD", str(record))
    adapter = make_adapter(_exec("narrow"))
    try:
        run = fuzz(adapter, "float64", examples=8)
    finally:
        adapter.close()
    assert run.examples == 8 and run.skipped == 0, run.refusals
    messages = [json.loads(line) for line in record.read_text().splitlines()]
    assert messages[0] == {"op": "hello", "protocol": E.PROTOCOL}
    for m in messages:
        E.check_message(m, m["op"])
    configs = [m["config"] for m in messages if m["op"] == "run"]
    assert configs and all(c.get("norm_type", "layer_norm") == "layer_norm" and not c.get("use_bitnet") for c in configs)


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on PATH")
@pytest.mark.parametrize("host", [1, 2])
def test_the_javascript_port_answers_the_host_s_version(host, monkeypatch):
    """A version 1 host gets a version 1 reply (no supports); a version 2 host, the declaration."""
    monkeypatch.setattr(E, "PROTOCOL", host)
    adapter = E.Exec(["node", str(E.JS_DIR / "native.mjs")])()
    try:
        assert adapter.hello["protocol"] == host
        assert adapter.support == (None if host == 1 else {"config": {
            "norm_type": ["layer_norm"], "ode_solver": ["euler", "rk4"], "use_bitnet": [False], "positional_encoding": ["none"]}})
    finally:
        adapter.close()


FIXED = """
import json
import os

from odeattn.conformance.adapters import SpecAdapter


class Fixed(SpecAdapter):
    \"\"\"TileBoundary fixed: the spec under the planted port's name, recording each example's shape
    (a line of the file ODEATTN_TEST_SHAPES: the command runs it in a worker process).\"\"\"

    name, dtypes, run_vjp = "planted-TileBoundary", ("float32", "float64"), None

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        self.record(x)
        return super().run_trajectory(config, params, x, padding_mask, dtype)

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        self.record(x)
        return super().run_decode(config, params, x, padding_mask, prompt, dtype)

    def record(self, x):
        with open(os.environ["ODEATTN_TEST_SHAPES"], "a") as f:
            f.write(json.dumps(x.shape) + "\\n")
"""


def test_a_failing_example_is_kept_and_judged_first_on_the_next_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixed_port.py").write_text(FIXED)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["conformance", "fuzz", "--dtype", "float32", "--database", "db", "--force"]
    assert main([*base, "--backend", "odeattn.conformance.mutation.planted:TileBoundary", "--examples", "40"]) == 1
    capsys.readouterr()
    assert any((tmp_path / "db" / "planted-TileBoundary-float32").rglob("*"))
    again = fuzz(planted.TileBoundary(), "float32", examples=40, database="db")  # still broken: fails at once
    kept = again.finding.first  # hypothesis's shrunk example, kept (the essence's smaller one is the report's)
    assert again.replayed == 1 and again.examples <= 2 and again.found_in.startswith("database")
    monkeypatch.setenv("ODEATTN_TEST_SHAPES", str(tmp_path / "shapes.jsonl"))
    assert main([*base, "--backend", "fixed_port:Fixed", "--examples", "5", "--json", "fuzz.json"]) == 0
    first = json.loads((tmp_path / "shapes.jsonl").read_text().splitlines()[0])
    assert tuple(first) == (kept.batch, kept.seq, kept.config.hidden_size)  # the example that broke it, judged first
    replayed = int(re.search(r"\b(\d+) replayed from the database", capsys.readouterr().out).group(1))
    assert replayed >= 1 and json.loads((tmp_path / "fuzz.json").read_text())["runs"][0]["replayed"] == replayed
    assert not (tmp_path / ".hypothesis").exists()


@pytest.mark.parametrize("argv, message", [
    (["fuzz", "--backend", "spec", "--examples", "5", "--min-examples", "6"],
     "--min-examples: expected at most the examples asked (--examples 5); got 6"),
    (["fuzz", "--backend", "spec", "--database", "{file}"], "--database: expected a folder; got the file "),
    (["fuzz", "--backend", "spec", "--replay", "{tmp}", "--database", "{tmp}"],
     "--database: not taken with --replay (it reruns one example, drawing nothing)"),
    (["--backend", "spec", "--min-examples", "3"], "--min-examples: taken only by 'odeattn conformance fuzz'"),
], ids=["minimum-over-examples", "database-a-file", "database-with-replay", "minimum-in-the-main-run"])
def test_the_new_fuzz_options_refuse_bad_input_in_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "f").write_text("")
    args = [a.replace("{file}", str(tmp_path / "f")).replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["conformance", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


FAULTY = """
import os
import sys
import time

import numpy as np

from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.mutation.planted import TileBoundary


class Block(SpecAdapter):
    \"\"\"The spec's block alone (no f0, trajectory, decode or gradient): each fault replaces a part of it.\"\"\"

    run_func = run_trajectory = run_decode = run_vjp = run_stages = None


class SupportsRaises(Block):
    def supports(self, config, dtype):
        raise RuntimeError("supports() broke")


class SupportsOne(Block):
    def supports(self, config, dtype):
        return 1


class SupportsHangs(Block):
    def supports(self, config, dtype):
        time.sleep(3600)


class ReturnsStr(Block):
    def run_block(self, *args):
        return "z"


class ReturnsDict(Block):
    def run_block(self, *args):
        return {"z": 1}


class ReturnsGenerator(Block):
    def run_block(self, *args):
        return (i for i in range(3))


class Exits(Block):
    def run_block(self, *args):
        sys.exit(0)


class Hangs(Block):
    def run_block(self, *args):
        time.sleep(3600)


class Aborts(Block):
    def run_block(self, *args):
        os.abort()


class StagesGarbage(TileBoundary):
    def run_stages(self, *args):
        return {"attn": np.zeros(3)}


class SetsRaise(SpecAdapter):
    def run_trajectory(self, *args):
        np.seterr(all="raise")
        return super().run_trajectory(*args)


class EditsConfig(SpecAdapter):
    \"\"\"Right results, and its config edited after: the fuzzer's own copy must not change.\"\"\"

    def run_trajectory(self, config, *args):
        out = super().run_trajectory(config, *args)
        object.__setattr__(config, "ode_steps", config.ode_steps + 7)
        return out
"""


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """The folder holding faulty_ports.py (FAULTY), the working folder and importable."""
    (tmp_path / "faulty_ports.py").write_text(FAULTY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("port, message, in_traceback", [
    ("SupportsRaises", "RuntimeError: supports() broke", "faulty_ports.py"),
    ("SupportsOne", "TypeError: supports() must return None or a reason string; got 1", "check_supports"),
    ("ReturnsStr", "TypeError: run_block: expected an array of numbers; got str", "in numbers"),
    ("ReturnsDict", "TypeError: run_block: expected an array of numbers; got dict", "in numbers"),
    ("ReturnsGenerator", "TypeError: run_block: expected an array of numbers; got generator", "in numbers"),
    ("Exits", "SystemExit: 0", "faulty_ports.py"),
])
def test_a_port_s_fault_is_its_error_finding_with_its_traceback_in_the_report(faulty, capsys, port, message, in_traceback):
    """supports() raising or answering 1, run_block answering a str, a dict or a generator, or
    calling sys.exit(0): each is the backend's error, a finding (exit 1) with the traceback from
    its worker in the JSON report, never the command's traceback or a green exit."""
    code = main(["conformance", "fuzz", "--backend", f"faulty_ports:{port}", "--examples", "3", "--json", "f.json"])
    out = capsys.readouterr().out
    finding = json.loads((faulty / "f.json").read_text())["runs"][0]["finding"]
    assert code == 1 and "1 diverged" in out and message in finding["message"], (out, finding)
    assert in_traceback in finding["traceback"]
    assert (faulty / "fuzz-repro" / f"faulty_ports_{port}-float64" / "case.json").is_file()


def test_a_port_left_raising_on_float_errors_or_editing_its_config_reaches_nothing_of_the_fuzzer(faulty, capsys):
    """np.seterr(all='raise') and an edited config stay in the port's worker: the spec's side
    computes and judges as before (the config edit is no divergence: its results were right)."""
    import numpy as np

    before = np.geterr()
    assert main(["conformance", "fuzz", "--backend", "faulty_ports:EditsConfig", "--examples", "5"]) == 0
    assert main(["conformance", "fuzz", "--backend", "faulty_ports:SetsRaise", "--examples", "5"]) in (0, 1)
    assert np.geterr() == before
    assert re.search(r"^spec/float64: 5 examples", capsys.readouterr().out, re.M)


def test_a_module_that_exits_as_it_is_imported_is_a_one_line_error(faulty, capsys):
    (faulty / "exits_at_import.py").write_text("import sys\n\nsys.exit(0)\n")
    assert main(["conformance", "fuzz", "--backend", "exits_at_import:Port", "--examples", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "odeattn conformance fuzz: --backend exits_at_import:Port: cannot be constructed (SystemExit: 0)", err


def _command(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """odeattn conformance fuzz in its own process: a hang it failed to bound ends the test, not the suite."""
    return subprocess.run([sys.executable, "-m", "odeattn", "conformance", "fuzz", *args], capture_output=True, text=True,
                          cwd=folder, timeout=300)


@pytest.mark.parametrize("port, why", [("Hangs", "timed out after 2 s"), ("SupportsHangs", "timed out after 2 s"),
                                       ("Aborts", "was killed by SIGABRT")])
def test_a_port_that_hangs_or_crashes_is_a_finding_with_its_repro(faulty, port, why):
    """A run_block or supports() that blocks, or an os.abort(): the worker is killed at --timeout
    (or found dead), and the example is the finding, unshrunk, written as a repro folder."""
    done = _command(faulty, "--backend", f"faulty_ports:{port}", "--examples", "5", "--timeout", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"result:   error: the worker {why} while running this case" in done.stdout, done.stdout
    assert f"not shrunk (the worker {why})" in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
    meta = json.loads((faulty / "fuzz-repro" / f"faulty_ports_{port}-float64" / "case.json").read_text())
    assert why in meta["message"]


def test_the_time_budget_stops_the_drawing(faulty):
    """A budget spent ends hypothesis's run, however many examples were asked: the run ends, and
    says how many were judged (where draws went on passing unrun before)."""
    done = _command(faulty, "--backend", "spec", "--examples", "1000000000", "--time-budget", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"time budget: judged \d+ of 1000000000 examples asked before it ran out", done.stdout), done.stdout


def test_an_unwritable_repro_folder_is_refused_before_the_run(faulty, capsys, monkeypatch):
    """A folder that cannot take the repro (read-only: here a folder whose making fails, as it
    does for root nowhere else) is a one-line usage error before anything is drawn."""
    import tempfile

    made = tempfile.mkdtemp

    def read_only(suffix=None, prefix=None, dir=None):
        if dir is not None and Path(dir).resolve() == (faulty / "ro").resolve():
            raise PermissionError(13, "Permission denied")
        return made(suffix, prefix, dir)

    (faulty / "ro").mkdir()
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    assert main(["conformance", "fuzz", "--backend", "spec", "--repro", "ro/sub"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == ("odeattn conformance fuzz: --repro: 'ro/sub' cannot be written (Permission "
                                         "denied); a counterexample's folder would be lost"), err


def test_a_repro_that_cannot_be_written_at_the_end_keeps_the_finding_printed(faulty, capsys, monkeypatch):
    from odeattn.conformance.fuzzing import repro

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repro, "write_repro", full)
    code = main(["conformance", "fuzz", "--backend", "odeattn.conformance.mutation.planted:TileBoundary", "--dtype",
                 "float32", "--examples", "30"])
    out, err = capsys.readouterr()
    assert code == 1 and "minimal example (" in out and "quantity: " in out, out
    assert err.strip().splitlines()[-1] == (
        "odeattn conformance fuzz: --repro: 'fuzz-repro/odeattn.conformance.mutation.planted_TileBoundary-float32' could "
        "not be written (No space left on device); the counterexample of odeattn.conformance.mutation.planted:TileBoundary"
        "/float32 is printed above only"), err


def test_a_port_s_garbage_stages_are_said_so_in_the_replay(faulty, capsys):
    """run_stages answering an array of another shape: the replay's stage line says so (exit 1 for
    the divergence it still has), where the comparison would raise."""
    import ode_ref as R
    from odeattn.conformance.fuzzing.draw import Draw, build
    from odeattn.conformance.fuzzing.fuzz import Finding
    from odeattn.conformance.running.compare import run_case
    from odeattn.conformance.fuzzing.repro import write_repro

    d = Draw("block", R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder"), 2, 17, None, 1.0, 0.0, 1, 2)
    case = build(d, "float32")
    write_repro(faulty / "r", Finding(d, case, run_case(planted.TileBoundary(), case, "float32", outputs=(outputs := {})), outputs, first=d), "spec", "float32")
    assert main(["conformance", "fuzz", "--replay", "r", "--backend", "faulty_ports:StagesGarbage"]) == 1
    assert "  stage: run_stages: stage attn: expected shape (2, 17, 2, 4); got (3,)" in capsys.readouterr().out


def test_the_plugin_bounds_a_port_s_import_and_its_cases_by_its_timeout(faulty):
    """A module whose import blocks is a one-line usage error once --odeattn-timeout has passed; a
    run_block that blocks fails its items (its worker killed at the timeout), and the session ends."""
    (faulty / "slow_import.py").write_text("import time\n\ntime.sleep(3600)\n")
    (faulty / "test_mine.py").write_text("def test_mine():\n    pass\n")
    done = _pytest_script(faulty, "--odeattn-backend", "slow_import:Port", "--odeattn-timeout", "2")
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 4 and errors == [
        "ERROR: --odeattn-backend slow_import:Port: importing it took longer than the timeout (2 s)"], done.stdout + done.stderr
    done = _pytest_script(faulty, "--odeattn-backend", "faulty_ports:Hangs", "--odeattn-timeout", "2", "--odeattn-examples", "3",
                          "-k", "mine or fuzz or block_t1", "--basetemp", str(faulty / "base"), "test_mine.py")
    assert done.returncode == 1 and "2 failed, 2 passed" in done.stdout, done.stdout + done.stderr  # its encoder does not hang
    assert done.stdout.count("the worker timed out after 2 s while running this case") >= 2, done.stdout


def test_a_backend_that_judges_nothing_does_not_lose_another_s_finding(tmp_path, monkeypatch, capsys):
    """Two backends, the first diverging, the second refusing every draw: the first's finding is
    printed, kept in --json and its repro written; the run ends on the second's line, exit 2."""
    (tmp_path / "refuser.py").write_text("from odeattn.conformance.adapters import SpecAdapter\n\n\n"
                                         "class Refuser(SpecAdapter):\n    name = 'refuser'\n    dtypes = ('float32',)\n\n"
                                         "    def supports(self, config, dtype):\n        return 'nothing here'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = main(["conformance", "fuzz", "--backend", "odeattn.conformance.mutation.planted:TileBoundary", "--backend",
                 "refuser:Refuser", "--dtype", "float32", "--examples", "30", "--json", "fz.json"])
    out, err = capsys.readouterr()
    assert code == 2 and "minimal example" in out and err.strip().splitlines()[-1].startswith(
        "odeattn conformance fuzz: --backend refuser:Refuser: ran none of the drawn configs in float32"), err
    runs = [r for r in json.loads((tmp_path / "fz.json").read_text())["runs"] if r["drew"] == "attention block"]
    assert runs[0]["finding"] is not None and runs[1]["examples"] == 0 and any((tmp_path / "fuzz-repro").iterdir())


def test_a_database_folder_that_cannot_be_made_is_refused_before_the_run(tmp_path, capsys):
    """hypothesis drops a failed write to its database silently: the folder is tried first, in the
    command and the plugin alike."""
    (tmp_path / "file").write_text("")
    code = main(["conformance", "fuzz", "--backend", "spec", "--database", str(tmp_path / "file" / "db")])
    assert code == 2 and capsys.readouterr().err == (f"odeattn conformance fuzz: --database: {str(tmp_path / 'file')!r} is "
                                                     f"not a folder, so {str(tmp_path / 'file' / 'db')!r} cannot be made\n")
    done = _pytest_script(tmp_path, "--odeattn-backend", "spec", "--odeattn-database", str(tmp_path / "file" / "db"))
    assert done.returncode == 4 and "ERROR: --odeattn-database: " in done.stderr, done.stdout + done.stderr


def test_a_dtype_a_backend_does_not_run_is_said_and_a_missing_model_named(tmp_path, monkeypatch, capsys):
    """A dtype asked for that one backend does not run is a line of the run, not dropped silently; a
    --model path that does not exist is named as such, in one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    assert main(["conformance", "fuzz", "--backend", "spec", "--dtype", "float32", "--dtype", "float64", "--examples", "3"]) == 0
    assert "spec: not run in float32 (it runs float64)\n" in capsys.readouterr().out
    assert main(["conformance", "fuzz", "--model", "nosuch.onnx", "--config", "c.json", "--weights", "w.npz"]) == 2
    assert capsys.readouterr().err == ("odeattn conformance fuzz: --model: expected an .onnx file; got 'nosuch.onnx', "
                                       "which does not exist\n")


def test_a_declared_support_gets_a_covering_array_of_its_own(picky):
    """The array of a narrow port's default run is built over the levels its declaration keeps
    (cover.allowed): every row within them, most searched (a decode row this port, which has no
    run_decode, runs as a block forward where its other levels allow one), most pairs it allows held."""
    from odeattn.conformance.fuzzing import cover

    run = fuzz(picky.Declared(), "float64")
    rows = cover.covering_array(0, run.kept)
    assert run.kept is not None and run.cells >= 0.8 * len(rows) and not run.failed
    assert {(r["norm_type"], r["ode_solver"], r["steps"], r["mode"]) for r in rows} == {("derf", "rk38", "2", "decoder")}
    feasible = cover.feasible_pairs(run.kept)[0]
    # held: 937 of its 1193 at seed 0, the pairs with decoded tokens among those it cannot hold (no run_decode)
    assert len(run.held & feasible) >= 0.75 * len(feasible) and len(feasible) < 0.6 * len(cover.feasible_pairs()[0])

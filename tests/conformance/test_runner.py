"""The runner: what it reports for wrong outputs, and that no plug-in can change another's verdict
or the run's, whatever it does in its worker process."""

import dataclasses
import json
import sys
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.adapters import BUILTIN, BackendRef
from odeattn.conformance.golden import load_cases
from odeattn.conformance.running.compare import run_case
from odeattn.conformance.running.runner import run_suite
from odeattn.conformance.running.selection import select
from odeattn.conformance.running.reports import format_report, write_json, write_junit

CASES = load_cases()
SOME = select(CASES, include=["block_layer_norm_heun_decoder_bitnet_pad", "block_derf_euler_encoder_float_nopad_s1_b2t5h2d8$"])


class BlockOnly:
    """The minimal protocol: no trajectory, no f."""

    name, dtypes = "block-only", ("float32",)

    def __init__(self, fn=None):
        self.fn = fn

    def supports(self, config, dtype):
        return "no BitLinear here" if config.use_bitnet else None

    def run_block(self, config, params, x, padding_mask, dtype):
        return self.fn(x) if self.fn else R.ode_block(params, x, config, padding_mask)


@pytest.mark.parametrize("output, reported", [
    pytest.param(lambda x: x.astype(np.float64), lambda r: r.message == "z1: expected dtype float32; got float64",
                 id="wrong-dtype"),
    pytest.param(lambda x: x[:, :1], lambda r: "z1: expected shape" in r.message, id="wrong-shape"),
    pytest.param(lambda x: x * np.float32("nan"), lambda r: "non-finite" in r.message, id="nan"),
    pytest.param(lambda x: 1 / 0, lambda r: r.status == "error" and r.message == "ZeroDivisionError: division by zero"
                 and "1 / 0" in r.traceback, id="crash"),
])
def test_a_wrong_output_or_a_crash_is_reported(output, reported):
    case = next(c for c in CASES if not c.config.use_bitnet)
    r = run_case(BlockOnly(output), case, "float32")
    assert reported(r), (r.status, r.message)


PLUGINS = r'''
import os, signal, sys, time
import ode_ref as R
from odeattn.conformance.adapters import SpecAdapter

class Spec32(SpecAdapter):
    dtypes = ("float32",)

class Exits(Spec32):
    name = "exits"
    def run_block(self, *a): sys.exit(0)
    run_trajectory = run_func = run_block

class Dies(Spec32):
    name = "dies"
    def run_func(self, config, params, t, x, mask, dtype):
        if config.use_bitnet: os._exit(3)
        return super().run_func(config, params, t, x, mask, dtype)

class Segfaults(Spec32):
    name = "segfaults"
    def run_func(self, *a): os.kill(os.getpid(), signal.SIGSEGV)

class Hangs(Spec32):
    name = "hangs"
    def run_func(self, *a): time.sleep(60)

class Writes(Spec32):
    name = "writes"
    def run_func(self, config, params, t, x, mask, dtype):
        x[...] = 0.0
        for v in params.values(): v[...] = 0.0
        if mask is not None: mask[...] = False
        return super().run_func(config, params, t, x, mask, dtype)

class BadInit(Spec32):
    name = "bad-init"
    def __init__(self): raise RuntimeError("no device")

class SupportsRaises(Spec32):
    name = "supports-raises"
    def supports(self, config, dtype): raise KeyError("norm")

class SupportsTrue(Spec32):
    name = "supports-true"
    def supports(self, config, dtype): return True

class CallsItselfSpec(Spec32):
    name = "spec"

class HangsInInit(Spec32):
    name = "hangs-in-init"
    def __init__(self): time.sleep(60)

def first_time(what):
    """True in the first worker of the run to ask (a file beside the lock), False after."""
    try:
        os.close(os.open(os.environ["ODEATTN_TEST_LOCK"] + "." + what, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False

class StallsAfterOne(Spec32):
    """Answers once, then never reads again (once in the run): the run must not block writing to it."""
    name = "stalls"
    count = 0
    def run_func(self, *a):
        StallsAfterOne.count += 1
        if StallsAfterOne.count > 1 and first_time("stalled"):
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().run_func(*a)

class Slow(Spec32):
    """A case's block takes 1.5 s (a backend that compiles each case ahead of time)."""
    name = "slow"
    def run_block(self, *a):
        time.sleep(1.5)
        return super().run_block(*a)
    run_trajectory = run_func = None

class Oversends(Spec32):
    """Announces a reply far larger than its case's outputs (once in the run)."""
    name = "oversends"
    def run_block(self, config, params, x, mask, dtype):
        import numpy as np
        return np.zeros(5_000_000, np.float32) if first_time("oversent") else super().run_block(config, params, x, mask, dtype)
    run_trajectory = run_func = None

class GeneratorDtypes(Spec32):
    name = "generator-dtypes"
    dtypes = (d for d in ["float64"])

class SupportsNothing(Spec32):
    name = "supports-nothing"
    def supports(self, config, dtype): return "nothing here"

class ColourfulError(Spec32):
    name = "colourful"
    def run_func(self, *a): raise RuntimeError("\x1b[31mred\x1b[0m \x00")

class OneInstance(Spec32):
    """Only one instance may exist at a time (a device lock): extra workers fail to start."""
    name = "one-instance"
    def __init__(self):
        import fcntl
        self._lock = open(os.environ["ODEATTN_TEST_LOCK"], "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

class BlockOnly(Spec32):
    name = "block-only"
    run_trajectory = run_func = None
    def supports(self, config, dtype): return "no BitLinear here" if config.use_bitnet else None

CONSTRUCTED = []

class Counted(Spec32):
    """Named 'class-K', K the backends this process constructed before it: a second in one worker shows."""
    def __init__(self):
        self.name = f"{type(self).__name__.lower()}-{len(CONSTRUCTED)}"
        CONSTRUCTED.append(self.name)

class ShareA(Counted): pass
class Alone(Counted): pass
class ShareB(Counted): pass

class ShareBad(Counted):
    def __init__(self): raise RuntimeError("no device")
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "odeattn_test_plugins.py").write_text(PLUGINS)
    (tmp_path / "odeattn_exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get this process's sys.path
    return lambda name: BackendRef(name, f"odeattn_test_plugins:{name}")


@pytest.mark.parametrize("shares", [True, False])
def test_backends_sharing_their_process_run_one_after_another_in_one_worker(plugins, shares):
    """One job: the first sharing backend's worker goes on to the next sharing one (which counts a
    construction before its own), skipping the one between them, which does not share and gets a
    process of its own; without sharing, each has a process of its own. Every case runs on each."""
    refs = [dataclasses.replace(plugins("ShareA"), shares_process=shares), plugins("Alone"),
            dataclasses.replace(plugins("ShareB"), shares_process=shares)]
    report = run_suite(refs, SOME, jobs=1)
    assert {r.backend for r in report.results} == ({"sharea-0", "shareb-1", "alone-0"} if shares else {"sharea-0", "alone-0", "shareb-0"})
    assert not report.errors and len(report.results) == 3 * len(SOME) and {r.status for r in report.results} == {"passed"}


def test_a_sharing_backend_that_fails_to_construct_is_an_error_for_itself_and_the_next_starts_afresh(plugins):
    """The worker handed to ShareBad fails its construction: ShareBad's error, and that worker goes;
    ShareB then runs in a fresh worker (its name counts no construction before it)."""
    refs = [dataclasses.replace(plugins(n), shares_process=True) for n in ("ShareA", "ShareBad", "ShareB")]
    report = run_suite(refs, SOME, jobs=1)
    assert [(e.backend, e.message) for e in report.errors] == [("ShareBad", "RuntimeError: no device")]
    assert {r.backend for r in report.results} == {"sharea-0", "shareb-0"} and {r.status for r in report.results} == {"passed"}


def test_no_plugin_changes_another_verdict_or_the_run(plugins):
    refs = [BackendRef("spec", BUILTIN["spec"].reference, builtin=True)]
    refs += [plugins(n) for n in ("Exits", "Dies", "Segfaults", "Hangs", "Writes", "BadInit", "SupportsRaises",
                                  "SupportsTrue", "CallsItselfSpec", "BlockOnly")]
    refs.append(BackendRef("exits-on-import", "odeattn_exits_on_import:anything"))
    # Nothing here hangs while starting, so the start's timeout is a bound, never waited out: 60 s
    # holds a worker's start (imports, spawn) on a 2-core machine at any load CI has shown (over
    # 3 s at its worst). A case takes milliseconds; Hangs waits out the 2 s case timeout.
    report = run_suite(refs, SOME, jobs=2, timeout=2.0, init_timeout=60.0, taken=set(BUILTIN))
    by = {}
    for r in report.results:
        by.setdefault(r.backend, []).append(r)
    assert {r.status for r in by["spec"]} == {"passed"} and len(by["spec"]) == len(SOME)  # not blamed, not merged
    assert all(r.status == "error" and r.message == "SystemExit: 0" for r in by["exits"])
    dies = {r.case: r for r in by["dies"]}
    bitnet = [c.name for c in SOME if c.config.use_bitnet]
    assert bitnet and all(dies[n].message == "the worker exited with status 3 while running this case" for n in bitnet)
    assert all(dies[c.name].status == "passed" for c in SOME if not c.config.use_bitnet)  # a fresh worker went on
    assert by["segfaults"][0].message == "the worker was killed by SIGSEGV while running this case"
    assert by["hangs"][0].message == "the worker timed out after 2 s while running this case"
    assert all(r.status == "failed" for r in by["writes"])  # wrong for itself only: spec passed above
    assert all(r.status == "error" and r.message.startswith("KeyError") for r in by["supports-raises"])
    assert all(r.message == "TypeError: supports() must return None or a reason string; got True" for r in by["supports-true"])
    assert {r.status for r in by["block-only"]} == {"passed", "skipped"}
    errors = {e.backend: e for e in report.errors}
    assert errors["BadInit"].message == "RuntimeError: no device"
    assert "raise RuntimeError" in errors["BadInit"].traceback
    assert errors["CallsItselfSpec"].message == "reports the name 'spec', which another backend has taken"
    assert errors["exits-on-import"].message == "SystemExit: 0"
    assert report.exit_code == 1
    text = format_report(report)
    assert "backend errors" in text and "bad-init" not in {r.backend for r in report.results}
    assert "odeattn_test_plugins" not in sys.modules  # the run imported no plug-in itself


def test_xfail_unexpected_pass_fails_and_reports_agree(tmp_path):
    refs = [BackendRef("spec", BUILTIN["spec"].reference, builtin=True)]
    report = run_suite(refs, SOME, xfail=[f"spec/float64/{SOME[0].name}"])
    statuses = [r.status for r in report.results]
    assert statuses == ["xpassed", "passed"] and report.exit_code == 1
    header = {"golden": "packaged (sealed)", "digest": "d" * 64}
    write_json(report, tmp_path / "r.json", header)
    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["digest"] == "d" * 64 and payload["exit_code"] == 1 and payload["summary"][0]["failed"] == 1
    write_junit(report, tmp_path / "r.xml", header)
    root = ET.parse(tmp_path / "r.xml").getroot()
    suite = root.find("testsuite")
    assert suite.get("failures") == "1" and len(root.findall(".//failure")) == 1
    assert root.find(".//property[@name='digest']").get("value") == "d" * 64


def test_fail_fast_stops_scheduling(plugins):
    report = run_suite([plugins("Writes")], CASES[:20], fail_fast=True, jobs=1)
    assert 1 <= len(report.results) < 20 and report.results[0].failed


def test_first_failure_stops_a_backend_in_that_dtype_only(plugins):
    """The mutation battery's half rows: a backend stops at its first failed case in a
    first_failure dtype; the others' cases, and the other dtypes', all run."""
    report = run_suite([plugins("Writes"), BackendRef("spec", BUILTIN["spec"].reference, builtin=True)], CASES[:6],
                       jobs=1, first_failure=("float32",))
    writes = [r for r in report.results if r.backend == "writes"]
    assert len(writes) == 1 and writes[0].status == "failed"
    assert [r.status for r in report.results if r.backend == "spec"] == ["passed"] * 6


def test_cli_prints_the_kill_free_summary_and_reports(plugins, tmp_path, capsys):
    from odeattn.cli import main

    code = main(["conformance", "--backend", "odeattn_test_plugins:BlockOnly", "-k", "layer_norm",
                 "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert code == 0 and "block-only" in out and "digest" in out
    assert json.loads((tmp_path / "r.json").read_text())["golden"] == "packaged (sealed)"
    assert textwrap.dedent(out).splitlines()[0].startswith("golden set: packaged (sealed), ")


def test_entry_points_are_found_and_cannot_take_a_builtin_name(plugins, tmp_path):
    """A distribution installed on sys.path (a dist-info folder) registers two entry points."""
    from odeattn.conformance import adapters as B

    info = tmp_path / "odeattn_test_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: odeattn-test-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[odeattn.backends]\nmine = odeattn_test_plugins:BlockOnly\nspec = odeattn_test_plugins:Spec32\n")
    refs, notes, errors = B.discover()
    assert refs[-1] == BackendRef("mine", "entry-point:mine")
    assert errors == [("spec", "entry point 'spec' (odeattn_test_plugins:Spec32): the name is taken by a built-in backend")]
    report = run_suite([refs[-1]], SOME[:1])
    assert report.results[0].backend == "block-only" and report.results[0].status == ("skipped" if SOME[0].config.use_bitnet else "passed")


def test_not_installed_is_a_note_and_broken_is_an_error(tmp_path, monkeypatch):
    from odeattn.conformance import adapters as B

    (tmp_path / "odeattn_broken_port.py").write_text("import numpy as np\nfrom ode_ref import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(B, "BUILTIN", {"absent": B.Builtin("odeattn_absent:X", ("odeattn_absent_package",)),
                                       "broken": B.Builtin("odeattn_broken_port:X", ("numpy",))})
    refs, notes, errors = B.discover()
    assert notes == ["absent: not installed (missing odeattn_absent_package)"] and [r.label for r in refs] == ["broken"]
    report = run_suite(refs, SOME[:1])
    assert report.errors[0].message.startswith("ImportError: cannot import name 'no_such_name'") and report.exit_code == 1


def test_hung_stalled_oversending_and_odd_plugins_are_reported_and_the_run_goes_on(plugins, tmp_path, monkeypatch):
    monkeypatch.setenv("ODEATTN_TEST_LOCK", str(tmp_path / "lock"))
    refs = [BackendRef("spec", BUILTIN["spec"].reference, builtin=True)]
    refs += [plugins(n) for n in ("StallsAfterOne", "Oversends", "GeneratorDtypes", "SupportsNothing", "ColourfulError",
                                  "OneInstance")]
    # A case takes milliseconds and the short case timeout finds the stalled worker at once. A
    # worker's start took over 3 s in CI at load (a good worker timed out there once), so the run's
    # start timeout is 15 s, and HangsInInit's own 2 s (a ref's start_timeout): it waits out that.
    refs.insert(1, dataclasses.replace(plugins("HangsInInit"), start_timeout=2.0))
    report = run_suite(refs, CASES[:12], jobs=2, timeout=2.0, init_timeout=15.0, taken=set(BUILTIN))
    by = {}
    for r in report.results:
        by.setdefault(r.backend, []).append(r)
    errors = {e.backend: e.message for e in report.errors}
    assert {r.status for r in by["spec"]} == {"passed"}
    assert errors["HangsInInit"] == "the worker timed out after 2 s while constructing the backend"
    assert by["stalls"][1].message == "the worker timed out after 2 s while running this case"
    assert by["oversends"][0].message.startswith("the worker announced a reply of 20000")  # 20 MB; its case fits in 1 MB
    for name, bad in (("stalls", 1), ("oversends", 0)):  # a fresh worker ran the rest
        assert [r.status for r in by[name]] == ["error" if k == bad else "passed" for k in range(12)], name
    assert errors["GeneratorDtypes"].startswith("TypeError: adapter 'generator-dtypes': dtypes must be a non-empty tuple")
    assert errors["SupportsNothing"] == "ran no case: supports() refused every one"
    assert {r.status for r in by["one-instance"]} == {"passed"} and len(by["one-instance"]) == 12  # extra workers failed
    header = {"digest": "0" * 64}
    write_junit(report, tmp_path / "r.xml", header)
    ET.parse(tmp_path / "r.xml")  # well-formed despite the escape codes and the NUL
    assert "red" in (tmp_path / "r.xml").read_text()


@pytest.mark.parametrize("case_timeout", [None, 5.0])
def test_a_backend_s_case_timeout_raises_the_run_s(plugins, case_timeout):
    """A ref's case_timeout is the least time its case may take: a 1.5 s case passes under a 1 s
    run timeout with a case_timeout of 5 s, and times out without one. The backends that compile
    each case ahead of time declare theirs."""
    ref = dataclasses.replace(plugins("Slow"), case_timeout=case_timeout)
    report = run_suite([ref], SOME[1:], jobs=1, timeout=1.0, init_timeout=15.0)
    (result,) = report.results
    assert (result.status, result.message) == (("passed", "") if case_timeout else
                                              ("error", "the worker timed out after 1 s while running this case"))


def test_the_backends_that_build_each_case_declare_a_case_timeout():
    from odeattn.conformance.adapters import discover

    assert BUILTIN["aoti"].case_timeout == BUILTIN["executorch"].case_timeout == 600
    assert BUILTIN["torch"].case_timeout is None
    refs, _, _ = discover(["aoti"])
    assert refs[0].case_timeout == 600


def test_a_wrong_gradient_is_named_by_its_parameter():
    """A backend whose run_vjp gets one parameter's gradient wrong fails at that parameter; one
    without run_vjp is reported 'not supported' on the grad cases."""
    from odeattn.conformance.adapters import SpecAdapter
    from odeattn.conformance.running.compare import run_case

    class WrongNormGradient(SpecAdapter):
        name = "wrong-norm-gradient"

        def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
            x_bar, params_bar = super().run_vjp(config, params, x, padding_mask, z1_bar, dtype)
            params_bar["ode_func.out_proj.weight"] = params_bar["ode_func.out_proj.weight"] * 1.001
            return x_bar, params_bar

    class NoGradients(SpecAdapter):
        name = "no-gradients"
        run_vjp = None

    case = next(c for c in load_cases() if c.kind.name == "grad")
    result = run_case(WrongNormGradient(), case, "float64")
    assert result.status == "failed" and result.message.startswith(
        "diverges first at grad.ode_func.out_proj.weight (the gradient of the parameter ode_func.out_proj.weight)")
    skipped = run_case(NoGradients(), case, "float64")
    assert skipped.status == "skipped" and skipped.message == "not supported: gradients (the backend has no run_vjp)"


@pytest.mark.parametrize("first_state, reported", [
    pytest.param(lambda x: np.zeros_like(x), "diverges first at step_0 (t = 0/", id="zeros-at-t0"),
    pytest.param(lambda x: x + np.asarray(1e-3, x.dtype) * np.abs(x).max(), "diverges first at step_0 (t = 0/",
                 id="offset-at-t0"),
    pytest.param(lambda x: 2 * x, "diverges first at step_0 (t = 0/", id="doubled-at-t0"),
    pytest.param(lambda x: np.full_like(x, np.nan), "step_0: non-finite values (NaN or inf) at [0, 0, 0]", id="nan-at-t0"),
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_wrong_first_state_fails(first_state, reported, dtype):
    """The trajectory's first state z(0), which is x, is a returned quantity like the others: a
    backend right at every later step but wrong at t = 0 fails there, and z(0) is reported first."""
    from odeattn.conformance.adapters import SpecAdapter

    class WrongAtTimeZero(SpecAdapter):
        name, dtypes = "wrong-at-t0", ("float32", "float64")

        def run_trajectory(self, config, params, x, padding_mask, dtype):
            traj = super().run_trajectory(config, params, x, padding_mask, dtype)
            traj[0] = first_state(x)
            return traj

    cases = [c for c in SOME if c.kind.name == "block"]
    for case in cases:
        result = run_case(WrongAtTimeZero(), case, dtype)
        assert result.status == "failed" and result.message.startswith(reported), (case.name, result.message)
        assert run_case(SpecAdapter(), case, "float64").status == "passed"
    checked = [q.quantity for q in run_case(SpecAdapter(), cases[0], "float64").quantities]
    assert checked[:2] == ["step_0", "f0"] and checked[-1] == "z1"


def test_failures_are_grouped_by_where_they_diverge_first_and_capped(tmp_path):
    """A backend off by 1e-3 everywhere after z(0): the report prints a group per (backend, dtype,
    first divergent quantity), the first few of each and how many more; the JSON holds every one."""
    from odeattn.conformance.adapters import SpecAdapter
    from odeattn.conformance.running.compare import Report
    from odeattn.conformance.running.reports import SHOWN_PER_GROUP

    off = np.float64(1 + 1e-3)

    class OffByAThousandth(SpecAdapter):
        name = "off"

        def run_func(self, *a):
            return super().run_func(*a) * off

        def run_trajectory(self, *a):
            traj = super().run_trajectory(*a)
            traj[1:] *= off
            return traj

        def run_vjp(self, *a):
            x_bar, params_bar = super().run_vjp(*a)
            return x_bar * off, params_bar

    blocks = select(CASES, include=["^block_derf"])
    grads = select(CASES, include=["^grad_layer_norm_(euler|ralston)"])
    assert len(blocks) > SHOWN_PER_GROUP + 1 and 0 < len(grads) <= SHOWN_PER_GROUP
    report = Report(results=[run_case(OffByAThousandth(), c, "float64") for c in blocks + grads])
    assert all(r.status == "failed" for r in report.results)
    lines = format_report(report).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("failures: ")))
    assert lines[at].startswith(f"failures: {len(blocks) + len(grads)}, in 2 groups")
    assert lines[at + 1] == f"  off/float64, f0: {len(blocks)} cases"
    assert [line.split(":")[0].strip() for line in lines[at + 2:at + 2 + SHOWN_PER_GROUP]] == [c.name for c in blocks[:SHOWN_PER_GROUP]]
    assert lines[at + 2 + SHOWN_PER_GROUP] == f"    ... and {len(blocks) - SHOWN_PER_GROUP} more"
    assert lines[at + 3 + SHOWN_PER_GROUP] == f"  off/float64, x_bar: {len(grads)} case{'s' if len(grads) > 1 else ''}"
    assert len(lines) == at + 4 + SHOWN_PER_GROUP + len(grads)  # no "more" line for a group under the cap
    write_json(report, tmp_path / "r.json", {})
    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["failure_groups"] == [
        {"backend": "off", "dtype": "float64", "divergence": "f0", "cases": [c.name for c in blocks], "shared_settings": [],
         "stage": None},
        {"backend": "off", "dtype": "float64", "divergence": "x_bar", "cases": [c.name for c in grads], "shared_settings": [],
         "stage": None}]  # no triage: run_suite's command asks for it (test_port_ci)
    assert sum(r["status"] == "failed" for r in payload["results"]) == len(blocks) + len(grads)


@pytest.mark.parametrize("status, message, divergence", [
    ("failed", "z1: expected dtype float32; got float64", "z1 (dtype)"),
    ("failed", "step_2: non-finite values (NaN or inf) at [0, 1, 0]", "step_2 (non-finite)"),
    ("error", "ZeroDivisionError: division by zero", "error: ZeroDivisionError"),
    ("error", "the worker was killed by SIGSEGV while running this case",
     "error: the worker was killed by SIGSEGV while running this case"),
    ("xpassed", "unexpected pass: the case matches an xfail pattern but passed", "unexpected pass"),
])
def test_a_failure_that_is_no_divergence_is_grouped_by_its_check(status, message, divergence):
    from odeattn.conformance.running.compare import CaseResult
    from odeattn.conformance.running.reports import divergence as divergence_of

    assert divergence_of(CaseResult("b", "float32", "c", status, message)) == divergence


def test_a_block_only_port_off_at_z1_is_told_what_would_locate_the_step():
    from odeattn.conformance.adapters import SpecAdapter

    class OffAtTheEnd(SpecAdapter):
        name = "off-at-the-end"

        def run_trajectory(self, *a):
            traj = super().run_trajectory(*a)
            traj[-1] *= 1.01
            return traj

    case = next(c for c in CASES if not c.config.use_bitnet and c.kind.name == "block")
    r = run_case(BlockOnly(lambda x: (case.z1 * 1.01).astype(np.float32)), case, "float32")
    assert r.status == "failed" and r.message.startswith(
        "diverges first at z1 (only z(1) was compared: the backend has no run_func or run_trajectory to show whether f "
        "or which step diverges first; a stage line, where there is one, places it)"), r.message
    full = run_case(OffAtTheEnd(), case, "float64")  # with the optional methods, the step is named instead
    assert full.status == "failed" and full.message.startswith("diverges first at step_") and "only z(1)" not in full.message


@pytest.mark.parametrize("output, shown", [
    pytest.param(lambda x: x.astype(np.float64), "failed: z1 (dtype)", id="dtype"),
    pytest.param(lambda x: x[:, :1], "failed: z1 (shape)", id="shape"),
    pytest.param(lambda x: 1 / 0, "failed: error: ZeroDivisionError", id="exception"),
])
def test_a_row_whose_failures_were_never_measured_shows_their_kind_not_a_headroom(output, shown):
    """A row whose cases all fail before any error is measured has no headroom: not `0` and `-`
    beside its failures, but what they failed on."""
    from odeattn.conformance.running.compare import Report

    cases = [c for c in CASES if c.kind.name == "block" and not c.config.use_bitnet][:3]
    report = Report(results=[run_case(BlockOnly(output), c, "float32") for c in cases])
    row = format_report(report).splitlines()[1].split()
    assert row[:4] == ["block-only", "float32", "0", "3"] and row[7:] == ["-", *shown.split()]


def test_a_worker_s_threads_are_its_share_of_the_cores_and_no_more_than_omp_num_threads(monkeypatch):
    from odeattn.conformance.running import pool

    monkeypatch.setattr(pool, "core_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [pool.worker_threads(j) for j in (1, 3, 8, 16)] == [8, 2, 1, 1]
    for given, expected in (("1", 1), ("4", 4), ("32", 8), ("0", 8), ("two", 8)):  # not a positive count: not a limit
        monkeypatch.setenv("OMP_NUM_THREADS", given)
        assert pool.worker_threads(1) == expected, given

"""External backends (conformance/adapters/external.py): the protocol, its faults, and the JavaScript
reference workers (conformance/js/), each a program in another process speaking the frames."""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pytest

import ode_ref as R
from odeattn.conformance.adapters import external as E
from odeattn.conformance.adapters import BUILTIN, BackendRef, discover, make_adapter, missing_requirements
from odeattn.conformance.golden import load_cases
from odeattn.conformance.running.runner import run_suite
from odeattn.conformance.running.selection import select

CASES = load_cases()
BY_NAME = {c.name: c for c in CASES}
WORKER = Path(__file__).with_name("external_worker.py")
# a block case padded in decoder mode, a BitLinear one, a cached decode, a rk4 layer_norm one and an encoder stack
FEW = select(CASES, include=["block_layer_norm_heun_decoder_bitnet_pad", "^decode_rk4_layer_norm_rope_pad$",
                             "block_layer_norm_rk4_encoder_float_nopad", "^encoder_rk2_gated_paper_pre_nopad"])
LM_CASE = select(CASES, include=["^lm_bam_learn_mu_pad$"])  # a language model's: its token ids travel as int64


def exec_ref(mode: str) -> BackendRef:
    return BackendRef(f"exec:{mode}", f"exec:{sys.executable} {WORKER} {mode}")


def test_an_external_port_passes_and_every_request_it_gets_is_a_schema_message(tmp_path, monkeypatch):
    record = tmp_path / "requests.jsonl"
    monkeypatch.setenv("ODEATTN_TEST_RECORD", str(record))
    report = run_suite([exec_ref("spec")], FEW + LM_CASE, jobs=1)
    assert {r.status for r in report.results} == {"passed"} and len(report.results) == 2 * len(FEW + LM_CASE)
    messages = [json.loads(line) for line in record.read_text().splitlines()]
    definitions = {"hello": "hello", "run": "run", "exit": "exit"}  # the schema's $defs, by op
    for message in messages:
        E.check_message(message, definitions[message["op"]])
    assert {m.get("kind") for m in messages if m["op"] == "run"} == {"trajectory", "decode", "encoder", "lm"}
    # the config as the golden manifest stores it: the required fields and the non-defaults
    assert all("dropout" not in m["config"] for m in messages if m["op"] == "run")


def test_an_external_port_declares_half_rows_and_its_arrays_travel_as_bf16_and_f16():
    report = run_suite([exec_ref("half")], FEW, jobs=1)
    got = {(r.dtype, r.case): r.status for r in report.results}
    assert not report.errors and {d for d, _ in got} == {"bfloat16", "float16"}
    for (dtype, case), status in got.items():  # the encoder case is untestable: the policy does not cover it
        assert status == ("untestable" if BY_NAME[case].untestable(dtype) else "passed"), (dtype, case, status)
    assert sorted(got.values()).count("passed") >= 4 and got[("float16", FEW[-1].name)] == "untestable"


def test_a_refusal_is_not_supported_with_the_workers_reason():
    report = run_suite([exec_ref("refuses")], FEW, jobs=1)
    refused = [r for r in report.results if r.status == "skipped"]
    assert refused and all(r.message == "not supported: use_bitnet (this port has float projections only)" for r in refused)
    assert {r.status for r in report.results if r not in refused} == {"passed"}


@pytest.mark.parametrize("mode, message", [
    ("garbage", "announced a frame of 1918989427 + 1735289204 bytes, over the limits (1048576 and 1073741824) to the "
                "hello request; its stdout began 'starting up...\\nready\\n' (a worker's logs go to its stderr)"),
    ("version9", "speaks protocol version 9; this odeattn speaks 1 or 2"),
    ("undeclarable", "sent a malformed hello_reply to the hello request: hello_reply: supports: config: expected fields "
                     "of ode_ref.ODEConfig or head_dim; got 'kernel'"),
    ("malformed", "sent a malformed hello_reply to the hello request: hello_reply: dtypes/0: 'float8' is not one of "
                  "['float32', 'float64', 'bfloat16', 'float16']"),
    ("oversized", "announced a frame of 1048576 + 2147483648 bytes, over the limits"),
    ("silent", "no reply within 2 s to the hello request"),
])
def test_a_handshake_fault_is_one_error_naming_the_backend(mode, message, monkeypatch):
    # the silent worker waits out 2 s; a worker that answers gets the default's 60 s, as its start
    # (a Python process and its imports) took over 2 s once on a loaded 2-core machine
    timeout = 2.0 if mode == "silent" else E.HANDSHAKE_TIMEOUT
    monkeypatch.setattr(E, "HANDSHAKE_TIMEOUT", timeout)
    exe = E.Exec([sys.executable, str(WORKER), mode], handshake_timeout=timeout)
    with pytest.raises(E.ExternalError) as err:
        exe()
    assert str(err.value).startswith(f"backend exec:{exe.argv[0]} ") and message in str(err.value)


class _Unstarted(E.Channel):
    """A channel with no process: what an adapter's constructor reads of it, its label."""

    def __init__(self, label: str):
        self.label, self.broken = label, ""

    def close(self) -> None:
        pass


def test_an_onnx_runtime_s_form_is_export_options_and_one_the_export_does_not_make_is_a_handshake_error():
    hello = {"protocol": 2, "name": "js-onnx", "dtypes": ["float32"], "kinds": ["block", "trajectory"], "consumes": "onnx"}
    adapter = E.OnnxAdapter(_Unstarted("js-onnx"), {**hello, "onnx": {"opset": 23, "form": "loop"}})
    assert adapter.options == E.ExportOptions(opset=23, steps_input=True) and adapter.calls == ("block", "trajectory")
    # a multistep solver has no Loop form (its past rides from step to step): not supported, as onnxruntime-loop says
    ab2 = R.ODEConfig(hidden_size=4, num_heads=1, ode_solver="ab2")
    assert adapter.supports(ab2, "float32").startswith("not supported: the Loop form's body is one RK step; ode_solver 'ab2'")
    assert adapter.supports(R.ODEConfig(hidden_size=4, num_heads=1), "float32") is None
    # the schema admits the opsets the export makes; a hello past it (a newer worker's) is refused by the export's rule
    with pytest.raises(E.ExternalError) as err:
        E.OnnxAdapter(_Unstarted("js-onnx"), {**hello, "onnx": {"opset": 19, "form": "unrolled"}})
    assert str(err.value) == ("backend js-onnx: sent a hello_reply to the hello request whose onnx form the export does "
                              "not make: opset: expected one of (17, 23); got 19")


def test_a_loop_form_runtime_runs_the_cached_models_unrolled_at_its_opset():
    """The prefill and decode-step models have one form: an onnx worker of the Loop form that lists
    decode is sent them as the unrolled one's (OnnxAdapter's run_decode is exported.py's)."""
    from odeattn.conformance.adapters import exported as X

    class LoopWithDecode(X._ExportedWithDecode, X._OnnxRuntimeSessions):
        options = E.ExportOptions(steps_input=True)

    case = BY_NAME["decode_rk4_layer_norm_rope_pad"]
    x, params = case.x.astype("float32"), {k: v.astype("float32") for k, v in case.params.items()}
    prompt = x.shape[1] - case.decoded
    got, want = (a.run_decode(case.config, params, x, case.padding_mask, prompt, "float32")
                 for a in (LoopWithDecode(), X.OnnxRuntimeAdapter()))
    assert (got == want).all()


def test_a_faulty_worker_is_an_error_for_itself_only():
    """A worker that dies mid-frame and one that never answers, beside the spec in one run: the
    spec's results are as alone, the others' errors say what happened."""
    spec = [BackendRef("spec", BUILTIN["spec"].reference, builtin=True)]
    alone = run_suite(spec, FEW, jobs=2)
    # the run's start timeout is 15 s, as a good worker's start took over 3 s once in CI at load; the
    # silent worker waits out its own, 2 s (a ref's start_timeout); a case takes milliseconds
    silent = dataclasses.replace(exec_ref("silent"), start_timeout=2.0)
    report = run_suite(spec + [exec_ref("dies"), silent, exec_ref("garbage")], FEW, jobs=2, timeout=5.0, init_timeout=15.0)
    assert [(r.case, r.dtype, r.status) for r in report.results if r.backend == "spec"] == \
           [(r.case, r.dtype, r.status) for r in alone.results]
    died = [r for r in report.results if r.backend == "py-dies"]
    assert died and died[0].status == "error" and "the worker exited with status 3 to the run request, mid-frame" in died[0].message
    errors = {e.backend: e.message for e in report.errors}
    assert "timed out after 2 s while constructing the backend" in errors["exec:silent"]
    assert "over the limits" in errors["exec:garbage"] and report.exit_code == 1


def test_exec_references_and_backends_files_are_checked_before_any_run(tmp_path):
    with pytest.raises(ValueError, match="^backend: expected a command after 'exec:'; got none$"):
        discover(["exec:  "])
    with pytest.raises(ValueError, match="cannot split the command"):
        discover(['exec:node "unclosed'])
    with pytest.raises(ValueError, match="start_timeout: expected a number of seconds > 0 and <= 86400; got -1$"):
        discover(['exec:{"command": "x", "cwd": ".", "start_timeout": -1}'])  # the backends file's form, given directly
    good = tmp_path / "backends.json"
    good.write_text(json.dumps({"backends": {"mine": {"exec": f"{sys.executable} {WORKER} spec"},
                                             "slow": {"exec": f"{sys.executable} {WORKER} spec", "start_timeout": 300}}}))
    refs, _, _ = discover(["mine", "slow"], declared=E.load_backends_file(str(good)))
    assert [(r.label, r.start_timeout) for r in refs] == [("mine", None), ("slow", 300)]
    assert [E.from_reference(r.reference).handshake_timeout for r in refs] == [E.HANDSHAKE_TIMEOUT, 300]
    refs = refs[:1]
    report = run_suite(refs, FEW[:1], jobs=1)
    assert {r.status for r in report.results} == {"passed"}
    for text, field in [('{"backends": {}}', "external: expected"), ('[1]', "external: expected"),
                        ('{"backends": {"m": {"exec": 3}}}', "external: backends.m: expected"),
                        ('{"backends": {"m": {"exec": "x", "cwd": "nowhere"}}}', "external: backends.m.cwd: expected a folder"),
                        ('{"backends": {"m": {"exec": ""}}}', "external: backends.m.exec: cannot split"), ("{", "is not JSON"),
                        *[(f'{{"backends": {{"m": {{"exec": "x", "start_timeout": {value}}}}}}}',
                           "external: backends.m.start_timeout: expected a number of seconds > 0 and <= 86400; got ")
                          for value in ("0", "-1", "true", '"5"', "null", "NaN", "1e999", "1e10")]]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            E.load_backends_file(str(bad))
    taken = tmp_path / "taken.json"
    taken.write_text(json.dumps({"backends": {"spec": {"exec": "x"}}}))
    with pytest.raises(ValueError, match="backends.spec: the name is taken by a built-in backend"):
        discover(declared=E.load_backends_file(str(taken)))


def test_the_command_line_refuses_a_bad_backends_file_in_one_line(tmp_path, capsys):
    from odeattn.cli import main

    assert main(["conformance", "--external", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--external: expected a file" in err[0]


# ---- the JavaScript workers (npm ci --prefix conformance/js) ----------------------------------------------
JS = {name: missing_requirements(name) for name in ("onnxruntime-node", "onnxruntime-web")}
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")


def js_ref(name):
    if JS[name]:
        pytest.skip(f"{name}: not installed (missing {', '.join(JS[name])})")
    return BackendRef(name, BUILTIN[name].reference, builtin=True, dtypes=("float32",))


@pytest.mark.parametrize("name", ["onnxruntime-node", "onnxruntime-web"])
def test_onnx_runtimes_in_javascript_pass_block_trajectory_and_decode_cases(name):
    report = run_suite([js_ref(name)], FEW, jobs=1)
    assert [(r.case, r.status) for r in report.results] == [(c.name, "passed") for c in FEW]
    assert max(r.worst_ratio for r in report.results) < 1.0


@pytest.mark.parametrize("reference, first", [
    (exec_ref("spec").reference, None), (exec_ref("planted").reference, "v"), ("odeattn.conformance.adapters.external:onnxruntime_node", None),
], ids=["spec", "planted", "onnxruntime-node"])
def test_an_external_backend_provides_the_stages_and_a_planted_stage_bug_is_named_there(reference, first):
    """A native port answers the run kind "stages" (its handshake lists it); a runtime runs the
    model exported with the stage outputs. The planted worker's v is 1% off: named at v."""
    import numpy as np

    import ode_ref as R
    from ode_ref.recording import STAGES
    from odeattn.conformance.fuzzing.draw import case_of
    from odeattn.conformance.fuzzing.stages import first_divergent_stage

    if "onnxruntime_node" in reference:
        js_ref("onnxruntime-node")  # skips without Node.js or the package
    config = R.ODEConfig(hidden_size=16, num_heads=2, ode_use_pe=True, mode="decoder")
    mask = np.ones((2, 6), bool)
    mask[1, 4:] = False
    case = case_of(config, R.init_params(config, seed=1, perturb_norms=True), np.random.default_rng(0).normal(size=(2, 6, 16)),
                   mask, kind="block")
    adapter = make_adapter(reference)
    stage = first_divergent_stage(adapter, case, "float32")
    adapter.close()
    assert stage["stage"] == first and stage["agree"] == list(STAGES[:STAGES.index(first) if first else None]), stage
    E.check_message({"op": "run", "kind": "stages", "dtype": "float32", "config": {"hidden_size": 16, "num_heads": 2}}, "run")


def test_a_stray_stage_array_is_the_worker_s_fault(monkeypatch):
    adapter = make_adapter(f"exec:{sys.executable} {WORKER} spec")
    monkeypatch.setattr(adapter, "_run", lambda *a, **k: {"stage/norm": 0, "stage/gate": 0})
    with pytest.raises(E.ExternalError, match=r"with the arrays \['stage/gate'\]; expected stage/<name>"):
        adapter.run_stages(None, {}, None, None, "float32")
    adapter.close()


def test_a_missing_operator_kernel_is_not_supported_and_named():
    import onnx
    from onnx import TensorProto, helper

    ref = js_ref("onnxruntime-node")
    det = helper.make_graph([helper.make_node("Det", ["a"], ["d"])], "g",
                            [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [2, 2])],
                            [helper.make_tensor_value_info("d", TensorProto.DOUBLE, [])])
    model = helper.make_model(det, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    adapter = make_adapter(ref.reference)
    with pytest.raises(E.NotSupported, match=r"^not supported: operator Det \(opset 11\) has no kernel in onnxruntime-node 1\.30\.0$"):
        E.RemoteRun(adapter.channel, model).start()
    adapter.close()
    onnx.checker.check_model(model)


@needs_node
def test_the_plain_javascript_port_passes_what_it_supports_and_names_the_rest():
    ref = BackendRef("js-native", f"exec:node {E.JS_DIR / 'native.mjs'}")
    report = run_suite([ref], CASES, jobs=2)
    ran = [r for r in report.results if r.status != "skipped"]
    assert {r.status for r in ran} == {"passed"} and {r.dtype for r in ran} == {"float32", "float64"}
    assert {r.case for r in ran} == {c.name for c in CASES if c.name.startswith("block_layer_norm_") and
                                     c.config.ode_solver in ("euler", "rk4") and not c.config.use_bitnet
                                     and c.config.position_encoding == "none"}
    reasons = {r.message for r in report.results if r.status == "skipped"}
    # its hello (protocol version 2) declares what it runs: the host refuses the rest without sending it
    assert "not supported: norm_type rms_norm (declared: layer_norm)" in reasons
    assert "not supported: use_bitnet True (declared: False)" in reasons
    # every decode case lies outside its declaration too, which is asked first
    assert all(r.status == "skipped" for r in report.results if r.case.startswith("decode_"))
    assert "not supported: gradients (the backend has no run_vjp)" in reasons


@needs_node
def test_the_golden_set_runs_from_javascripts_own_test_runner():
    """conformance/js/golden.test.mjs reads the golden files without odeattn (docs/protocol.md)."""
    import subprocess

    done = subprocess.run(["node", "--test", "golden.test.mjs"], cwd=E.JS_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    passed = int(next(line for line in done.stdout.splitlines() if line.startswith("# pass")).split()[-1])
    assert passed == 1 + 2 * 3  # the set holds block cases, and the port's three, in two dtypes


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, dead but not yet reaped by whoever adopted it, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_kill_9_of_the_run_takes_its_worker_and_the_exec_program_with_it(tmp_path):
    """`kill -9` of `odeattn conformance` while an exec: program hangs (it never answers hello):
    the worker (the program's parent) and the program die with the run (conformance/wire/lifetime.py).
    Every wait is bounded by polling; nothing waits on the handshake's own timeout."""
    import os
    import signal
    import subprocess
    import time

    pids = tmp_path / "pids"
    hang = tmp_path / "hang.py"
    hang.write_text("import os, pathlib, time\n"
                    f"pathlib.Path({str(pids)!r}).write_text(f'{{os.getpid()}} {{os.getppid()}}')\n"
                    "time.sleep(60)\n")
    run = subprocess.Popen([sys.executable, "-m", "odeattn", "conformance", "--backend", f"exec:{sys.executable} {hang}",
                            "-k", "derf_euler_encoder_float_nopad_s1_b2t5h2d8$", "-j", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = []
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        assert pids.exists(), "the exec: program never started"
        started = [int(p) for p in pids.read_text().split()]  # the program, its worker
        assert all(map(_alive, started))
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(map(_alive, started)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, started)), [p for p in started if _alive(p)]
    finally:
        for pid in [*started, run.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

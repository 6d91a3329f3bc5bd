"""The deployment targets' runtime-only worker (conformance/running/target_worker.py,
conformance/adapters/targets.py): what it refuses, and its check that neither odeattn nor ode_ref
is imported where the artifacts run. The rows' own tests (tests/export) run cases through it."""

import hashlib
import json
import sys

import numpy as np
import pytest

pytest.importorskip("tract")

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.adapters import targets
from odeattn.conformance.adapters.external import Channel, RemoteRun
from odeattn.conformance.wire import frames
from odeattn.export import standalone
from odeattn.export.block import export_model

CFG = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="euler", ode_steps=1)


def block(worker):
    """A RemoteRun of CFG's exported block in worker."""
    model = export_model(CFG, R.init_params(CFG, seed=0))
    return worker.run(*standalone.onnx_names(model), model=model)


def test_the_worker_runs_an_artifact_and_refuses_a_target_or_bytes_it_does_not_know():
    """The block's file, run by tract in the worker, is the spec within float32's tolerance; an
    unknown target and bytes that are no ONNX file are each the case's error in one line."""
    from odeattn.conformance.cases.tolerance import relative_error, tolerance

    worker = targets.TargetWorker("tract")
    try:
        x, params = np.random.default_rng(0).normal(size=(2, 5, 8)), R.init_params(CFG, seed=0)
        z = block(worker)({"x": x.astype(np.float32), "padding_mask": np.ones((2, 5), bool)})["z"]
        want = R.ode_block(params, x, CFG)
        assert relative_error(z, want) <= tolerance(relative_error(R.ode_block(params, x.astype(np.float32), CFG), want),
                                                    "float32")
        for target, artifact, message in (("nope", b"\0", "ValueError: target: expected one of openvino, tract"),
                                          ("tract", b"not a model", "TractError: ")):
            run = RemoteRun(worker.channel, artifact=artifact, fields={"target": target, "inputs": ["x"], "outputs": ["z"]})
            with pytest.raises(RuntimeError) as err:
                run.start()
            assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value
    finally:
        worker.close()


def test_a_file_kept_from_an_earlier_case_is_recorded_for_each_case_it_runs():
    """The record a case's reply carries (wire/counters.ARTIFACTS, emptied per request): a file
    loaded once and run again for the next case is that case's file too, listed once per case, and
    listed where the runtime fails on the case's input; a file the runtime refused to load is not."""
    from odeattn.conformance.wire import counters

    worker = targets.TargetWorker("tract")
    try:
        run, feed = block(worker), {"x": np.zeros((1, 3, 8), np.float32), "padding_mask": np.ones((1, 3), bool)}
        records = []
        for _ in range(2):  # two cases
            counters.ARTIFACTS.clear()
            run(feed)
            run(feed)
            records.append(list(counters.ARTIFACTS))
        assert records[0] == records[1] and len(records[0]) == 1 and records[0][0]["target"] == "tract"
        counters.ARTIFACTS.clear()
        with pytest.raises(RuntimeError):  # a width the file does not take, past the local check
            run.unchecked({"x": np.zeros((1, 3, 5), np.float32), "padding_mask": np.ones((1, 3), bool)})
        assert counters.ARTIFACTS == records[0]
        counters.ARTIFACTS.clear()
        refused = RemoteRun(worker.channel, artifact=b"not a model", fields={"target": "tract", "inputs": ["x"], "outputs": ["z"]})
        with pytest.raises(RuntimeError):
            refused.start()
        assert counters.ARTIFACTS == []
    finally:
        worker.close()


def test_a_worker_that_imported_odeattn_or_ode_ref_refuses_every_load():
    """The check the rows rely on: the same worker started after an import of ode_ref (as a runtime
    that pulled it in would) answers its first load with an error naming it."""
    prelude = "import ode_ref, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    argv = [sys.executable, "-c", prelude, str(targets.WORKER), frames.__file__, standalone.__file__]
    worker = targets.TargetWorker("tract")
    worker._channel = Channel(argv, "a worker with ode_ref")
    try:
        with pytest.raises(RuntimeError, match="^the runtime's worker imported ode_ref"):
            block(worker).start()
    finally:
        worker.close()


def test_a_worker_that_died_is_started_anew_for_the_next_case():
    """A runtime that crashed on one case fails that case alone: the next artifact starts a new worker."""
    worker = targets.TargetWorker("tract")
    try:
        first = worker.start()
        first.proc.kill()
        first.proc.wait()
        z = block(worker)({"x": np.zeros((1, 3, 8), np.float32), "padding_mask": np.ones((1, 3), bool)})["z"]
        assert z.shape == (1, 3, 8) and worker.start() is not first
    finally:
        worker.close()


def test_a_report_gives_each_case_the_digest_of_the_file_odeattn_export_writes(tmp_path):
    """A deployer's record: the --json report names the runtime's version and, for each case, the
    sha256 and size of the file the runtime ran; for a block case it is the file `odeattn export
    --target tract` writes for the case's config and weights."""
    import importlib.metadata

    from odeattn.conformance.golden import load_cases

    name = "block_derf_ralston_encoder_float_pad_s4_b2t4h1d10"
    assert main(["conformance", "--backend", "tract", "-k", f"^{name}$", "--json", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["environment"]["packages"]["tract"] == importlib.metadata.version("tract")
    (result,) = report["results"]
    case = next(c for c in load_cases() if c.name == name)
    (tmp_path / "config.json").write_text(json.dumps(case.config.to_dict()))
    R.save_params(case.params, tmp_path / "w.safetensors")
    assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "--target", "tract", "-o", str(tmp_path / "block.onnx")]) == 0
    data = (tmp_path / "block.onnx").read_bytes()
    assert result["artifacts"] == [{"target": "tract", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}]

"""The Loop form's two rows (conformance/adapters/exported.py): onnxruntime-loop runs each block case's
file at its steps fed as the runtime input; onnxruntime-loop-other-steps feeds the same file
another count and is judged against the spec at that count, built in the run (cases.at_steps)."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from odeattn.conformance.adapters import BUILTIN, BackendRef, make_adapter, other_steps, reference_steps
from odeattn.conformance.cases import at_steps, build_case, case_specs
from odeattn.conformance.golden import load_cases
from odeattn.conformance.running.compare import CaseResult, judge
from odeattn.conformance.running.selection import select
from odeattn.conformance.cases.kinds import BLOCK

CASES = load_cases()
# a gated solver with padding, and 8 steps with BitLinear, padding and a decoder (fed 4 steps)
SOME = select(CASES, include=["block_derf_rk2_gated_encoder_float_nopad_s1_b2t5h2d8$", "block_rk4_s8_decoder_bitnet_pad_dyt$"])


def test_the_reference_built_in_the_run_is_the_golden_one_at_the_case_s_own_steps():
    for case in SOME:
        same = at_steps(case, case.config.ode_steps)
        np.testing.assert_allclose(same.trajectory, case.trajectory, rtol=0, atol=1e-12 * np.abs(case.trajectory).max())
        assert same.e32.keys() == case.e32.keys()
        # e32 is a float32 run's error, so it is compared with the generator's own on this CPU: the
        # stored one came from another CPU, whose BLAS rounds float32 sums otherwise (AVX-512 against
        # AVX2: 0.85 to 1.42 times the stored figure, measured).
        generated = build_case(next(spec for spec in case_specs() if spec.name == case.name))
        assert all(np.isclose(same.e32[q], generated.e32[q], rtol=1e-3, atol=1e-12) for q in case.e32)
        other = at_steps(case, other_steps(case.config.ode_steps))
        assert other.config == dataclasses.replace(case.config, ode_steps=other_steps(case.config.ode_steps))
        assert len(other.trajectory) == other.config.ode_steps + 1 and other.f0 is case.f0


def test_the_other_count_is_judged_at_that_count_and_fails_against_the_golden_one():
    """Given a case's config, the second row's outputs pass the spec at the other count and are an
    error against the golden file (a trajectory of another length): the row tests the input."""
    other = make_adapter(BUILTIN["onnxruntime-loop-other-steps"].reference)  # (the main job runs both rows on every case)
    restepped = [n for n in BUILTIN if reference_steps(BackendRef(n, BUILTIN[n].reference, builtin=True))]
    assert restepped == [other.name] and other.reference_steps is other_steps
    assert [other_steps(n) for n in (1, 4, 5, 8)] == [2, 5, 2, 4]
    for case in SOME:
        params = {k: v.astype(np.float32) for k, v in case.params.items()}
        outputs = BLOCK.call(other, case.config, params, case.x.astype(np.float32), case.padding_mask, "float32", {}, {})
        judged = judge(CaseResult(other.name, "float32", case.name, "passed"), at_steps(case, other_steps(case.config.ode_steps)),
                       {"status": "ran"}, outputs)
        assert judged.status == "passed", (case.name, judged.message)
        wrong = judge(CaseResult(other.name, "float32", case.name, "passed"), case, {"status": "ran"}, outputs)
        assert wrong.status == "error" and wrong.message.startswith("run_trajectory: expected"), wrong.message


@pytest.mark.xdist_group("main-job-onnx-other")  # the process that runs that part of the main job
def test_the_suite_builds_the_other_count_s_reference_for_that_row_only(main_job):
    """In the suite's run of the main job's sample on the two rows, every block case passes both,
    the other row judged at the count it fed (its last state but the final output named step_N);
    every decode case is skipped on both (fixed steps)."""
    code, out, report = main_job("onnx-other")
    assert code == 0, out
    labels = ("onnxruntime-loop", "onnxruntime-loop-other-steps")
    status = {(r["backend"], r["case"]): r["status"] for r in report["results"] if r["backend"] in labels}
    sample = [c for c in CASES if c.name in main_job.sample]
    blocks = {c.name: c.config.ode_steps for c in sample if c.name.startswith("block_")}
    decode = {c.name for c in sample if c.name.startswith("decode_")}
    assert {k for k, v in status.items() if v == "passed"} == {(b, c) for b in labels for c in blocks}
    assert {(b, c) for b in labels for c in decode} <= {k for k, v in status.items() if v == "skipped"}
    steps = {r["case"]: [q["quantity"] for q in r["quantities"]][-2] for r in report["results"] if r["backend"] == labels[1]
             and r["status"] == "passed"}
    assert steps == {c: f"step_{other_steps(n)}" for c, n in blocks.items()}  # e.g. 1 -> 2, 8 -> 4
    assert {1, 2, 8} <= set(blocks.values()) and decode

"""The half-precision rows: e16 and ebf16 in the golden set, the untestable cases, the tolerance,
the runner's half rows, the frames carrying half arrays, and the refusals."""

import collections
import json
import textwrap

import ml_dtypes
import numpy as np
import pytest

from ode_ref.precision import DTYPES, HALF_DTYPES
from odeattn.conformance.wire import frames
from odeattn.conformance import golden
from odeattn.conformance.adapters import BUILTIN, BackendRef, check_adapter
from odeattn.conformance.cases import half_fields
from odeattn.conformance.golden import load_cases
from odeattn.conformance.cases.half import OTHERWISE, cast, check_dtypes, policy_otherwise
from odeattn.conformance.running.compare import run_case
from odeattn.conformance.running.runner import run_suite
from odeattn.conformance.running.selection import select
from odeattn.conformance.running.reports import format_report, summary, write_json
from odeattn.conformance.cases.tolerance import UNIT_ROUNDOFF, half_tolerance, relative_error

CASES = load_cases()
BY_NAME = {c.name: c for c in CASES}
# A few cases of each kind that stay testable in both dtypes: a block, a decode, positions, BitLinear.
TESTABLE = ["block_derf_euler_encoder_float_nopad_s1_b2t5h2d8", "decode_heun_dynamic_tanh_pad",
            "block_pos_hope_encoder_ssmax_pad_layer_norm_midpoint_b2t5h2d8", "block_dynamic_tanh_ralston_decoder_bitnet_nopad_s4_b2t5h2d8"]
# How far a recomputed e16 or ebf16 may move from the stored one: test_golden.py's E32_SPREAD, for
# the same reason (one rounding pattern's largest error); on the machine that generated the set,
# regenerated from the stored goldens, they move by at most 1 + 5e-13.
SPREAD = 8.0


# ---- the golden set -------------------------------------------------------------------------------
def test_every_case_has_its_half_errors_or_the_reason_it_has_none_and_they_are_counted():
    reasons = collections.Counter()
    for c in CASES:
        for dtype in HALF_DTYPES:
            why = c.untestable(dtype)
            if why is None:
                assert c.e_half(dtype).keys() == c.quantities().keys(), c.name  # every quantity a backend returns
            else:
                reasons[(dtype, why.split(":")[0].split(";")[0])] += 1
                with pytest.raises(ValueError, match="has no e"):
                    c.e_half(dtype)
    grads = sum(c.kind.name == "grad" for c in CASES)
    encoders, lms = (sum(c.kind.name == kind for c in CASES) for kind in ("encoder", "lm"))
    for dtype in HALF_DTYPES:  # measured on the packaged set (docs/conformance.md gives the counts)
        assert reasons[(dtype, "a grad case")] == grads == 22 and reasons[(dtype, "an encoder case")] == encoders == 24
        assert reasons[(dtype, "an LM case")] == lms == 10
        assert reasons[(dtype, "ill-conditioned")] == 8  # the prms_norm cases over near-zero channels, the tier's offset
    assert reasons[("bfloat16", "BitLinear rounding ties")] == 1 and reasons[("float16", "BitLinear levels")] == 10
    assert reasons[("float16", "float16 range")] == 1  # the tier's hope over 17 tokens: the spec refuses the run
    assert sum(n for (d, _), n in reasons.items() if d == "bfloat16") == 68
    assert sum(n for (d, _), n in reasons.items() if d == "float16") == 75


@pytest.mark.parametrize("name", TESTABLE + ["block_layer_norm_heun_decoder_bitnet_pad_s8_b3t7h3d12",
                                             "block_prms_norm_ralston_encoder_float_nopad_s6_b2t4h1d10",
                                             "grad_pos_hope_encoder", "block_tier_t17_b8_hd16_hope_decoder_pad"])
def test_stored_half_errors_and_reasons_are_the_spec_s_recomputed(name):
    case = BY_NAME[name]
    fresh = half_fields(case)
    assert fresh["half_untestable"] == case.half_untestable
    for field in ("e16", "ebf16"):
        stored = getattr(case, field)
        assert (stored is None) == (fresh[field] is None)
        if stored is not None:  # one rounding pattern's largest error, as e32 (test_golden.py)
            assert all(stored[q] / SPREAD <= fresh[field][q] <= stored[q] * SPREAD for q in stored), field


def test_a_team_set_without_half_errors_has_untestable_half_rows_and_an_inflated_one_is_refused(tmp_path):
    import shutil

    names = ["block_derf_euler_encoder_float_nopad_s1_b2t5h2d8", "grad_pos_hope_encoder"]
    team = tmp_path / "team"
    team.mkdir()
    manifest = golden.read_manifest()
    manifest["cases"] = [e for e in manifest["cases"] if e["name"] in names]
    for e in manifest["cases"]:
        shutil.copy(golden.GOLDEN_DIR / e["file"], team / e["file"])
    bare = json.loads(json.dumps(manifest))
    for e in bare["cases"]:
        e.pop("e16", None), e.pop("ebf16", None), e.pop("half_untestable", None)
    (team / "manifest.json").write_text(json.dumps(bare))
    case = golden.load_cases(team)[0]
    assert case.untestable("bfloat16") == "no ebf16 in this golden set" and case.untestable("float16") == "no e16 in this golden set"
    manifest["cases"][0]["ebf16"] = {q: 0.25 for q in manifest["cases"][0]["ebf16"]}  # every tolerance 0.5
    (team / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(golden.GoldenError, match=r"ebf16\.\w+ = 0.25 is over 8 times the spec's own bfloat16 error"):
        golden.load_cases(team)
    manifest["cases"][0]["half_untestable"] = {"bfloat16": "because"}
    (team / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(golden.GoldenError, match=r"\.ebf16: expected either ebf16 or half_untestable.bfloat16, not both"):
        golden.load_cases(team)


# ---- the tolerance --------------------------------------------------------------------------------
def test_other_implementations_of_the_policy_pass_within_the_half_tolerance_and_their_spread_is_as_measured():
    worst = 0.0
    for name in TESTABLE:
        case = BY_NAME[name]
        golden_q = {q: a for q, a in case.quantities().items() if q in case.e32}
        for dtype in HALF_DTYPES:
            e = case.e_half(dtype)
            for how in OTHERWISE:
                out = policy_otherwise(case.config, case.params, case.x, case.padding_mask, dtype=dtype, how=how,
                                       decoded=case.decoded)
                for q in golden_q:
                    ratio = relative_error(out[q], golden_q[q]) / max(e[q], UNIT_ROUNDOFF[dtype])
                    assert relative_error(out[q], golden_q[q]) <= half_tolerance(e[q], dtype), (name, dtype, how, q)
                    worst = max(worst, ratio)
    assert 1.0 <= worst <= 1.05  # tolerance.py: at most 1.05 over every testable case


def test_half_tolerance_is_the_rule_and_refuses_other_dtypes():
    assert half_tolerance(0.0, "bfloat16") == 2 * 2.0**-8 and half_tolerance(1e-2, "float16") == 2e-2
    for bad in ("float32", "float8", "int8"):
        with pytest.raises(ValueError, match=f"dtype: expected one of bfloat16, float16; got '{bad}'"):
            half_tolerance(1e-3, bad)


# ---- the runner's half rows -----------------------------------------------------------------------
PORTS = textwrap.dedent('''
    import numpy as np
    import ode_ref as R
    from ode_ref.precision import half_attention, half_block, half_func, round_to
    from odeattn.conformance.cases import run_decode
    from odeattn.conformance.cases.half import numpy_dtype


    class PolicyPort:
        """Follows the half-precision policy: the spec's, in float32 arrays holding storage values."""

        name, dtypes = "policy", ("bfloat16", "float16")
        policy = None  # the dtype whose policy it runs: its row's own

        def supports(self, config, dtype):
            return None

        def _in(self, params, x):
            return {k: np.asarray(v, np.float32) for k, v in params.items()}, np.asarray(x, np.float32)

        def run_trajectory(self, config, params, x, padding_mask, dtype):
            p, x = self._in(params, x)
            _, traj = half_block(p, x, config, padding_mask, dtype=self.policy or dtype, return_trajectory=True)
            return traj.astype(numpy_dtype(dtype))

        def run_block(self, config, params, x, padding_mask, dtype):
            return self.run_trajectory(config, params, x, padding_mask, dtype)[-1]

        def run_func(self, config, params, t, x, padding_mask, dtype):
            p, x = self._in(params, x)
            return half_func(p, t, x, config, padding_mask, dtype=self.policy or dtype).astype(numpy_dtype(dtype))

        def run_decode(self, config, params, x, padding_mask, prompt, dtype):
            p, x = self._in(params, x)
            z = run_decode(config, p, x, padding_mask, prompt, attention=half_attention(config, self.policy or dtype))
            return round_to(z, self.policy or dtype).astype(numpy_dtype(dtype))


    class Bfloat16AsFloat16(PolicyPort):
        """Breaks the float16 policy: holds its storage values in bfloat16, 3 bits fewer."""

        name, dtypes, policy = "bf16-as-f16", ("float16",), "bfloat16"


    class Float32Out(PolicyPort):
        name, dtypes = "float32-out", ("bfloat16",)

        def run_trajectory(self, config, params, x, padding_mask, dtype):
            return super().run_trajectory(config, params, x, padding_mask, dtype).astype(np.float32)


    class Float8(PolicyPort):
        name, dtypes = "float8", ("float8",)
''')


@pytest.fixture
def ports(tmp_path, monkeypatch):
    (tmp_path / "odeattn_half_ports.py").write_text(PORTS)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get this process's sys.path
    import importlib

    return importlib.import_module("odeattn_half_ports")


@pytest.mark.parametrize("name", TESTABLE)
def test_a_port_that_follows_the_policy_passes_and_one_that_breaks_it_fails(ports, name):
    case = BY_NAME[name]
    for dtype in HALF_DTYPES:
        r = run_case(ports.PolicyPort(), case, dtype)
        assert r.status == "passed" and 0 < r.worst_ratio <= 1.0, (dtype, r.message)
    broken = run_case(ports.Bfloat16AsFloat16(), case, "float16")
    assert broken.status == "failed" and broken.message.startswith("diverges first at "), broken.message


def test_a_half_row_checks_the_output_dtype_and_reports_untestable_cases_unrun(ports):
    r = run_case(ports.Float32Out(), BY_NAME[TESTABLE[0]], "bfloat16")
    assert r.status == "failed" and r.message == "step_0: expected dtype bfloat16; got float32"
    r = run_case(ports.PolicyPort(), BY_NAME["grad_pos_hope_encoder"], "bfloat16")
    assert r.status == "untestable" and r.message.startswith("a grad case: the half-precision policy covers")
    assert r.seconds == 0.0  # not run


def test_worker_processes_carry_half_arrays_and_the_report_counts_untestable(ports, tmp_path):
    cases = select(CASES, include=[TESTABLE[0] + "$", TESTABLE[1], "grad_pos_hope_encoder",
                                   "block_prms_norm_ralston_encoder_float_nopad_s6_b2t4h1d10"])
    report = run_suite([BackendRef("policy", "odeattn_half_ports:PolicyPort")], cases, jobs=1)
    rows = {r["dtype"]: r for r in summary(report.results)}
    assert list(rows) == ["bfloat16", "float16"] and not report.errors
    for dtype in HALF_DTYPES:
        assert rows[dtype]["passed"] == 2 and rows[dtype]["failed"] == 0 and rows[dtype]["untestable"] == 2
    table = format_report(report)
    assert "untestable" in table.splitlines()[0] and any(line.split()[1] == "bfloat16" for line in table.splitlines()[1:])
    write_json(report, tmp_path / "r.json", {})
    listed = json.loads((tmp_path / "r.json").read_text())["untestable"]
    assert {(u["dtype"], u["case"]) for u in listed} == {(d, c) for d in HALF_DTYPES for c in (
        "grad_pos_hope_encoder", "block_prms_norm_ralston_encoder_float_nopad_s6_b2t4h1d10")}
    assert all(u["reason"] for u in listed)


def test_frames_carry_bfloat16_and_float16_arrays_bit_for_bit():
    a = np.array([1.5, -2.0, 3e38, np.inf, np.nan], np.float32).astype(ml_dtypes.bfloat16)
    b = np.array([65504, -1e-7, 0.1], np.float16)
    frame = frames.encode({"op": "x"}, {"a": a, "b": b, "m": np.array([True, False])})
    n_body, _ = frames.HEADER.unpack(frame[:8])
    _, got = frames.decode(frame[8:8 + n_body], frame[8 + n_body:])
    assert got["a"].dtype == a.dtype and got["a"].tobytes() == a.tobytes()
    assert got["b"].dtype == np.float16 and got["b"].tobytes() == b.tobytes() and got["m"].dtype == np.bool_
    assert b'"dtype":"BF16"' in frame  # safetensors' own dtype name: any language's reader knows it


# ---- refusals -------------------------------------------------------------------------------------
def test_an_unknown_dtype_is_refused_naming_the_backend_the_field_and_the_allowed_values(ports):
    with pytest.raises(TypeError, match=r"adapter 'float8': dtypes must be a non-empty tuple of 'float32', 'float64', "
                                        r"'bfloat16', 'float16'; got \('float8',\)"):
        check_adapter(ports.Float8())
    for bad in (("int8",), (), "bfloat16", (np.float16,)):
        with pytest.raises(ValueError, match="dtypes: expected a non-empty tuple of"):
            check_dtypes(bad)
    assert check_dtypes(list(DTYPES)) == DTYPES
    with pytest.raises(ValueError, match="dtype: expected a non-empty tuple"):
        cast(np.zeros(2), "float8")


def test_run_suite_refuses_an_unknown_dtype_asked_for_and_runs_only_those_asked_for(ports):
    with pytest.raises(ValueError, match=r"dtypes: expected a non-empty tuple of 'float32', 'float64', 'bfloat16', "
                                         r"'float16'; got \('float8',\)"):
        run_suite([BackendRef("policy", "odeattn_half_ports:PolicyPort")], CASES[:1], dtypes=("float8",))
    report = run_suite([BackendRef("policy", "odeattn_half_ports:PolicyPort")], select(CASES, include=[TESTABLE[0] + "$"]),
                       jobs=1, dtypes=("float16", "float32"))
    assert [(r.dtype, r.status) for r in report.results] == [("float16", "passed")] and not report.errors
    report = run_suite([BackendRef("spec", BUILTIN["spec"].reference, builtin=True)], CASES[:1], jobs=1, dtypes=("bfloat16",))
    assert report.notes == ["spec: runs none of the dtypes asked for (bfloat16)"] and report.exit_code == 1
    assert [e.message for e in report.errors] == ["no backend runs any of the dtypes asked for (bfloat16)"]

"""The mutation battery: every one-line bug is caught by the golden set in float32 and float64,
through the real runner; in bfloat16 those it can see are, and each of the others is named with
the smallest dtype that kills it; every violation of the half-precision policy is caught in
bfloat16; and the manual's kill table (docs/conformance.md) is the one this run prints."""

from pathlib import Path

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.golden import load_cases
from odeattn.conformance.cases import fields
from odeattn.conformance.mutation.mutants import FIELD_MUTANTS, MUTANTS, format_field_table, format_table, kill_table
from odeattn.conformance.mutation.policy_mutants import storage_sum
from ode_ref.precision import half_block, round_to

CONFORMANCE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
SPECIFICATION_PAGE = Path(__file__).resolve().parents[2] / "docs" / "specification.md"


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("conformance/test_mutants")


@pytest.fixture(scope="session")
def rows():
    return kill_table(load_cases())


def test_the_battery_covers_every_stage_norm_bitlinear_and_the_solver():
    targets = {m.target for m in MUTANTS}
    assert len(MUTANTS) >= 20 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert targets >= {"attn", "build_mask", "project", "postprocess_attn", "merge_heads", "layer_norm", "rms_norm",
                       "prms_norm", "flash_norm", "dynamic_tanh", "derf", "BitLinear", "tableau", "step times", "trajectory"}
    policy = {m.name for m in MUTANTS if m.policy}
    assert policy >= {"policy_softmax_in_storage", "policy_norm_statistics_in_storage"}
    assert all(m.dtypes == ("float16", "bfloat16") for m in MUTANTS if m.policy)


def test_every_mutant_is_killed_in_both_precisions(rows):
    survivors = [(r["mutant"], r["killed_float32"], r["killed_float64"], r["errors"]) for r in rows
                 if not r["policy"] and (not (r["killed_float32"] and r["killed_float64"]) or r["errors"])]
    assert not survivors


def test_every_policy_violation_is_killed_in_bfloat16(rows):
    """A port computing the softmax, the norm statistics, the RK state or the projections' sums in
    the storage dtype fails a case."""
    policy = [r for r in rows if r["policy"]]
    assert len(policy) == 4 and all(r["smallest_dtype"] == "bfloat16" and not r["errors"] for r in policy), policy


def test_each_mutant_names_the_smallest_dtype_that_kills_it(rows):
    """bfloat16 for most; a mutant bfloat16 misses is named with float16 or float32 (every other
    mutant dies in float32), and those are the ones the manual lists."""
    for r in rows:
        assert r["smallest_dtype"] in ("bfloat16",) if r["policy"] else ("bfloat16", "float16", "float32"), r
    stages = [r for r in rows if not r["ignores"]]  # a field mutant runs in float32 and float64 only
    assert sum(r["smallest_dtype"] == "bfloat16" for r in stages) > len(stages) / 2


def test_where_a_mutant_is_caught_first(rows):
    """A bug in f shows at f0 (one evaluation); a bug in the solver (the gate too) only from the
    first step on (Adams-Bashforth's from its first step after the start); a trajectory out of order at its first state, z(0); a bug in the cache only at
    the first decoded token; a bug in the encoder (qkvflow's stack too) at its one quantity, z."""
    first = {r["mutant"]: r["first_divergence"] for r in rows}
    where = {"tableau": "step_1", "gated RK2": "step_1", "step times": "step_1", "trajectory": "step_0", "cache": "decode_1",
             "encoder block": "z", "encoder layer": "z", "PCformer predictor": "z", "PCformer corrector": "z", "Macaron layer": "z",
             "time-dependent weights": "z", "Adams-Bashforth": "step_2", "momentum": "step_1"}  # ab2's first step is its starter's, Heun's
    for m in MUTANTS:
        if m.ignores:  # a field ignored: wherever the field enters (the per-field table names it)
            continue
        if m.name == "policy_state_in_storage":  # f0 is one evaluation on x, already in storage: a later state
            assert first[m.name].startswith("step_"), m.name
        else:
            assert first[m.name] == where.get(m.target, "f0"), m.name


def test_the_conformance_page_prints_this_kill_table(rows):
    page = CONFORMANCE_PAGE.read_text()
    assert format_table(rows) in page and format_field_table(rows) in page


def test_every_config_field_is_proven_by_a_golden_case_or_set_aside_with_its_reason():
    """Each field with a default of ODEConfig and ODEEncoderConfig: a packaged case sets it away
    from its default and the battery holds the mutant that ignores it (killed: the test above), or
    fields.SET_ASIDE says why no output can show it. A new field with neither fails here; so does
    a field the specification page leaves out."""
    for (cls, name), reason in fields.SET_ASIDE.items():
        assert name in fields.defaults(cls) and len(reason) > 20, (cls, name)
    assert fields.unproven(load_cases()) == []
    proven = [name for cls in fields.CONFIGS for name in fields.proven(cls)]
    assert sorted(m.ignores for m in FIELD_MUTANTS) == sorted(proven) and len(proven) >= 25
    page = SPECIFICATION_PAGE.read_text()
    assert [n for n in proven if n not in page and n.replace("_", "\\_") not in page] == []


def test_a_field_mutant_runs_only_the_cases_that_set_its_field():
    """Ignoring alibi_scale is the spec wherever the case leaves it at 1: those are refused, not run."""
    from odeattn.conformance.mutation.mutants import MutantAdapter

    mutant = MutantAdapter(next(m for m in FIELD_MUTANTS if m.ignores == "alibi_scale"))
    config = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="alibi")
    assert "alibi_scale is at its default" in mutant.supports(config, "float64")
    assert mutant.supports(R.ODEConfig(**{**config.to_dict(), "alibi_scale": 3.0}), "float64") is None
    assert fields.ignoring(R.ODEConfig(**{**config.to_dict(), "alibi_scale": 3.0}), "alibi_scale") == config


def test_a_sum_held_in_bfloat16_stops_growing_at_256():
    """What the softmax violation models: 512 ones summed in a running bfloat16 total give 256
    (256 + 1 is a tie, rounded to the even 256), not 512."""
    total = storage_sum(np.ones((2, 512), np.float32), lambda a: round_to(a, "bfloat16"))
    assert total.shape == (2, 1) and np.all(total == 256.0)


def test_the_spec_runs_half_rows_under_the_policy_and_refuses_what_has_none():
    import ml_dtypes

    cases = load_cases()
    case = next(c for c in cases if c.kind.name == "block")
    spec = SpecAdapter()
    assert spec.dtypes == ("float64",)  # the half rows are the half goldens' own run: no default row
    params = {k: np.asarray(v).astype(np.float32).astype(ml_dtypes.bfloat16) for k, v in case.params.items()}
    x = case.x.astype(np.float32).astype(ml_dtypes.bfloat16)
    z = spec.run_block(case.config, params, x, case.padding_mask, "bfloat16")
    want = half_block({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), case.config,
                      case.padding_mask, dtype="bfloat16")
    assert z.dtype == ml_dtypes.bfloat16 and np.array_equal(z.astype(np.float32), want)
    encoder = next(c for c in cases if isinstance(c.config, R.ODEEncoderConfig))
    assert "encoder" in spec.supports(encoder.config, "bfloat16") and spec.supports(encoder.config, "float32") is None
    with pytest.raises(ValueError, match="dtype: the backward pass runs in float32 or float64; got 'float16'"):
        spec.run_vjp(case.config, params, x, case.padding_mask, x, "float16")


def test_the_half_rows_run_only_where_float64_kills_and_stop_at_the_first_kill():
    """run_suite's gate and first_failure, as the battery uses them: causal_off_by_one passes the
    encoder cases in float64, so they do not run in a half dtype; of the decoder cases, each half
    dtype runs until one kills it."""
    from odeattn.conformance.adapters import BackendRef
    from odeattn.conformance.running.runner import run_suite

    cases = [c for c in load_cases() if c.kind.name in ("block", "decode") and not c.config.use_bitnet]
    cases = [c for c in cases if c.config.mode == "encoder"][:2] + [c for c in cases if c.config.mode == "decoder"][:3]
    ref = BackendRef("mutant:causal_off_by_one", "odeattn.conformance.mutation.mutants:battery.causal_off_by_one")
    results = run_suite([ref], cases, jobs=1, first_failure=("float16", "bfloat16"), gate="float64").results
    killed64 = {r.case for r in results if r.dtype == "float64" and r.status == "failed"}
    assert killed64 == {c.name for c in cases[2:]}
    for dtype in ("float16", "bfloat16"):
        mine = [r for r in results if r.dtype == dtype]
        assert mine and {r.case for r in mine} <= killed64 and [r.status for r in mine][-1] == "failed"
        assert sum(r.status == "failed" for r in mine) == 1

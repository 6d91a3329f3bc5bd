"""Case identity is stable: a case's seeds come from its name, and registering a solver or a norm
appends cases while every existing file stays byte-identical."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance import golden
from odeattn.conformance.cases import DECODE_CASES, EDGE_CASES, appended_specs, build_case, case_specs, grad_specs, name_seed
from odeattn.conformance.cases import MULTISTEP_CASES, POSITION_DECODE_CASES, POSITION_GRAD_CASES, TIER_BEFORE_ENCODER, position_specs
from odeattn.conformance.cases.matrix import BASE_FACTORS, EXTRA_FACTORS, HISTORY, extend_pairwise, pairwise, rows
from ode_ref import norms as N
from ode_ref.multistep import MULTISTEP
from ode_ref.tableaus import TABLEAUS, ButcherTableau


TAIL = (len(EDGE_CASES) + len(DECODE_CASES) + len(grad_specs()) + len(position_specs()) + len(POSITION_DECODE_CASES)
        + len(POSITION_GRAD_CASES) + len(TIER_BEFORE_ENCODER))  # the cases after the matrix rows


def _scale_norm(x, g):
    """A norm registered only for this test: g * x / max(||x||, eps) * sqrt(n)."""
    return g * x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), 1e-6) * np.sqrt(x.shape[-1])


@pytest.fixture
def registered(monkeypatch):
    """A third-order tableau (Kutta's) and a norm with one scalar parameter, registered as a user would."""
    kutta3 = ButcherTableau("kutta3", 3, (0.0, 0.5, 1.0), ((), (0.5,), (-1.0, 2.0)), (1 / 6, 2 / 3, 1 / 6))
    monkeypatch.setitem(TABLEAUS, "kutta3", kutta3)
    monkeypatch.setitem(N.NORM_PARAMS, "scale_norm", {"g": ("scalar", 1.0)})
    monkeypatch.setitem(N.NORMS, "scale_norm", _scale_norm)


def test_seeds_derive_from_the_name_alone():
    for spec in case_specs():
        assert (spec.param_seed, spec.input_seed) == (name_seed(spec.name, "params"), name_seed(spec.name, "input"))
    assert name_seed("block_x", "params") == 1488451527  # pinned (sha256sum of "block_x/params", first 4 bytes little-endian)


def test_extension_keeps_rows_and_covers_every_new_pair():
    base = pairwise(BASE_FACTORS)
    grown = {**BASE_FACTORS, "ode_solver": BASE_FACTORS["ode_solver"] + ["kutta3"], "rope": [False, True]}
    new = extend_pairwise(base, grown)
    every = [{**{"rope": False}, **r} for r in base] + new
    for a in grown:
        for b in grown:
            if a < b:
                assert {(va, vb) for va in grown[a] for vb in grown[b]} <= {(r[a], r[b]) for r in every}, (a, b)
    assert all(r["ode_solver"] == "kutta3" or r["rope"] for r in new)  # only rows the new values need


@pytest.mark.xdist_group("golden-regenerated")  # the session's `regenerated` set written once (tests/conformance/conftest.py)
def test_registering_a_tableau_and_a_norm_appends_cases_and_keeps_every_file(regenerated, registered, tmp_path):
    """Against the set written on this machine without the registration (the stored set's
    outputs differ from this machine's in the last bits: test_golden)."""
    before = golden.read_manifest(regenerated)["cases"]
    assert [e["name"] for e in before] == [e["name"] for e in golden.read_manifest()["cases"]]
    appended = {s.name for s in appended_specs()}  # after the encoder cases (encoder_cases.py), which follow the table's
    before = [e for e in before if not (e.get("encoder") or e.get("lm")) and e["name"] not in appended]
    specs = case_specs()
    assert [s.name for s in specs[:len(before) - TAIL]] == [e["name"] for e in before[:len(before) - TAIL]]
    added = specs[len(before) - TAIL:-TAIL]  # matrix rows appended before the chosen cases
    assert added and all(s.config.ode_solver == "kutta3" or s.config.norm_type == "scale_norm" for s in added)
    old = [s for s in specs if any(s.name == e["name"] for e in before)]
    assert len(old) == len(before)
    golden.write_golden(tmp_path, cases=[build_case(s) for s in old + added[:2]])
    manifest = {e["name"]: e for e in golden.read_manifest(tmp_path)["cases"]}
    for e in before:
        assert manifest[e["name"]] == e, e["name"]  # same entry: config, e32 and the file's sha256
        assert (tmp_path / e["file"]).read_bytes() == (regenerated / e["file"]).read_bytes()


def test_adding_an_option_appends_cases_named_by_it(monkeypatch):
    """An option (a config field added as a factor, its default first) appends rows; existing
    names and configs are unchanged. dropout stands in: the spec evaluates without it."""
    from odeattn.conformance.cases import matrix

    before = case_specs()
    monkeypatch.setitem(matrix.EXTRA_FACTORS, "dropout", [0.0, 0.25])
    after = case_specs()
    assert [(s.name, s.config) for s in after[:len(before) - TAIL]] == [(s.name, s.config) for s in before[:len(before) - TAIL]]
    added = after[len(before) - TAIL:-TAIL]
    assert added and all(s.name.endswith("_dropout-0.25") and s.config.dropout == 0.25 for s in added)


def test_base_rows_then_the_rows_of_each_step_of_the_history():
    """The base cover first (options at their defaults); every later row holds an option off its
    default or a value the history added; and what ode_ref registers is exactly base + history."""
    base, now = pairwise(BASE_FACTORS), rows()
    defaults = {name: values[0] for name, values in EXTRA_FACTORS.items()}
    assert now[:len(base)] == [{**r, **defaults} for r in base]
    added = [step for step in HISTORY if not isinstance(step, str)]
    assert all(any(r[name] != d for name, d in defaults.items()) or any(r[f] == v for f, v in added) for r in now[len(base):])
    # every RK tableau in the matrix; the multistep solvers have their cases (cases.MULTISTEP_CASES)
    assert set(R.TABLEAUS) == set(BASE_FACTORS["ode_solver"]) | {v for f, v in added if f == "ode_solver"}
    assert {dict(fields)["ode_solver"] for _, fields, *_ in MULTISTEP_CASES} == set(MULTISTEP)
    assert set(R.NORM_TYPES) == set(BASE_FACTORS["norm_type"]) | {v for f, v in added if f == "norm_type"}

def test_the_fair_check_s_early_stop_at_an_exact_tie_gives_the_full_check_s_answer(monkeypatch):
    """fair_forwards ends at the float64 forward's first activation level within TIE_FLOOR of a
    tie (no trajectories); run in full (both forwards, every level), the check decides alike on
    every input: an early stop is unfair there too (a tie, or ill-conditioned, checked first)."""
    from odeattn.conformance.cases import fair

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", use_bitnet=True, ode_steps=2)
    draws = []
    for seed in range(40):  # small BitLinear decoders: exact ties are common (a first token's output is its own v)
        x = np.random.default_rng(seed).normal(size=(2, 5, 8)) * (1.0, 1e-2, 1e2)[seed % 3]
        draws.append((R.init_params(cfg, seed=seed, perturb_norms=True), x))
    early = [fair.fair_forwards(cfg, params, x, None) for params, x in draws]
    monkeypatch.setattr(fair._LevelProbe, "_stop_at_tie", lambda self, margin: None)
    full = [fair.fair_forwards(cfg, params, x, None) for params, x in draws]
    assert [r is None for r, *_ in early] == [r is None for r, *_ in full]
    stopped = [i for i, (_, traj64, _) in enumerate(early) if traj64 is None]
    assert stopped and all(early[i][0].startswith("activation near a rounding tie") and full[i][0] is not None for i in stopped)
    assert any(r is None for r, *_ in early) and any(r is not None and traj64 is not None for r, traj64, _ in early)

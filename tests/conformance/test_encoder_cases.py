"""The encoder cases (conformance/cases/encoder_cases.py): a pairwise cover of the valid pairs, twelve
rows named once, the successors' rows setting every field of theirs, and the golden files of every
one loaded with its kind."""

import itertools

import ode_ref as R
from odeattn.conformance.cases.encoder_cases import (ENCODER_ROWS, FACTORS, FAMILY_PROFILES, SUCCESSOR_ROWS, TEMPORAL_ROWS, covered_pairs,
                                                     encoder_inputs, row_name)
from odeattn.conformance.golden import load_cases

VALUES = {"family": list(R.FAMILIES), "profile": list(R.PROFILES), "pre": [False, True], "padding": [False, True],
          "layers": [1, 2]}


def test_every_valid_pair_of_two_factors_is_covered():
    valid = {((a, va), (b, vb)) for a, b in itertools.combinations(FACTORS, 2) for va in VALUES[a] for vb in VALUES[b]}
    valid.discard((("family", "euler"), ("profile", "released")))  # no released euler block
    assert covered_pairs() == valid
    assert {(r[0], r[1]) for r in ENCODER_ROWS} == set(FAMILY_PROFILES) and len(FAMILY_PROFILES) == 11


def test_twelve_rows_each_named_once():
    names = [row_name(r) for r in ENCODER_ROWS]
    assert len(ENCODER_ROWS) == 12 and len(set(names)) == 12
    assert names[0] == "encoder_euler_paper_post_nopad_l1_b2t5h2c8f12"


def test_the_successor_rows_set_each_new_value_beside_both_norms_and_paddings():
    """Every ema family, the Macaron layer under both halves' profiles and the corrector appear;
    the corrector and the Macaron layer each under pre- and post-norm, and padded and not."""
    configs = [(encoder_inputs(r, 0, 0)[0], r) for r in SUCCESSOR_ROWS]
    assert {c.family for c, _ in configs} >= set(R.EMA_FAMILIES)
    assert {c.macaron_profile for c, _ in configs if c.macaron} == {"paper", "released"}
    assert {c.alpha_type for c, _ in configs} == {"scalar", "vector"} and any(c.layer_wise for c, _ in configs)
    for field in ("macaron", "corrector"):
        assert {(c.encoder_normalize_before, r[3]) for c, r in configs if getattr(c, field)} >= {(False, True), (True, False)}
    assert len({row_name(r) for r in ENCODER_ROWS + SUCCESSOR_ROWS}) == len(ENCODER_ROWS) + len(SUCCESSOR_ROWS)


def test_the_temporal_rows_step_at_several_counts_padded_and_not():
    """qkvflow's stack at one and several steps, padded and not, its two fields each off their
    defaults, and no name shared with another row."""
    configs = [(encoder_inputs(r, 0, 0)[0], r) for r in TEMPORAL_ROWS]
    assert all(c.temporal for c, _ in configs) and {r[3] for _, r in configs} == {True, False}
    assert 1 in {c.encoder_layers for c, _ in configs} and max(c.encoder_layers for c, _ in configs) >= 3
    assert len({c.sinusoidal_dim for c, _ in configs}) == 3
    names = {row_name(r) for r in ENCODER_ROWS + SUCCESSOR_ROWS + TEMPORAL_ROWS}
    assert len(names) == len(ENCODER_ROWS) + len(SUCCESSOR_ROWS) + len(TEMPORAL_ROWS)


def test_the_golden_encoder_cases_load_with_their_config():
    cases, rows = [c for c in load_cases() if c.kind.name == "encoder"], ENCODER_ROWS + SUCCESSOR_ROWS + TEMPORAL_ROWS
    assert [c.name for c in cases] == [row_name(r) for r in rows]
    for case, row in zip(cases, rows):
        assert isinstance(case.config, R.ODEEncoderConfig) and case.config.family == row[0]
        assert list(case.quantities()) == ["z"] and set(case.e32) == {"z"}
        assert (case.padding_mask is not None) == row[3] and case.kind.name != "block"
        assert list(case.params) == list(R.encoder_param_shapes(case.config))

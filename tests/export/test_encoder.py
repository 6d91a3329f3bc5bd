"""The encoder stack exported to ONNX (odeattn.export.encoder) against the spec, in ONNX Runtime
and the reference evaluator, within the suite's float32 tolerance rule; its inputs checked as
the spec checks them."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx import helper

import ode_ref as R
from odeattn.conformance.cases.encoder_cases import FAMILY_PROFILES
from odeattn.conformance.cases.kinds import ENCODER
from odeattn.conformance.cases.tolerance import relative_error, tolerance
from odeattn.export import runtime
from odeattn.export.encoder import encoder_config, export_encoder_model, run_encoder_model

C, H, FF = 8, 2, 12


def inputs(family, profile, pre, seed=0):
    cfg = R.ODEEncoderConfig(C, H, FF, encoder_layers=2, family=family, profile=profile, encoder_normalize_before=pre)
    params = R.init_encoder_params(cfg, seed, perturb=True)
    x = np.random.default_rng(seed).normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    return cfg, params, x, mask


@pytest.mark.parametrize("family, profile", FAMILY_PROFILES)
def test_onnxruntime_equals_the_spec(family, profile):
    cfg, params, x, mask = inputs(family, profile, pre=family in ("rk2", "rk3", "rk2_gated"))
    model = export_encoder_model(cfg, params)
    assert encoder_config(model) == cfg
    want = R.ode_encoder(params, x, cfg, mask)
    got = run_encoder_model(model, runtime.session(model), x.astype(np.float32), mask)
    assert got.dtype == np.float32
    assert relative_error(got, want) <= tolerance(ENCODER.float32_errors(cfg, params, x, mask, {"z": want})["z"], "float32")


def test_the_time_dependent_stack_in_onnxruntime_equals_the_spec():
    """qkvflow's stack: e(t) a constant per step, the causal mask from the input's length (Range)."""
    cfg = R.ODEEncoderConfig(C, H, FF, encoder_layers=3, encoder_normalize_before=True, time_embed_dim=4, sinusoidal_dim=2)
    params = R.init_encoder_params(cfg, 0, perturb=True)
    model = export_encoder_model(cfg, params)
    session = runtime.session(model)
    for seq in (5, 9):  # one file, any length
        x = np.random.default_rng(seq).normal(size=(2, seq, C))
        mask = np.ones((2, seq), bool)
        mask[1, 3:] = False
        want = R.ode_encoder(params, x, cfg, mask)
        got = run_encoder_model(model, session, x.astype(np.float32), mask)
        assert relative_error(got, want) <= tolerance(ENCODER.float32_errors(cfg, params, x, mask, {"z": want})["z"], "float32")


def test_the_reference_evaluator_and_a_model_without_a_mask():
    cfg, params, x, _ = inputs("rk2_weighted", "released", pre=True)
    model = export_encoder_model(cfg, params, padding_mask=False)
    want = R.ode_encoder(params, x, cfg)
    tol = tolerance(ENCODER.float32_errors(cfg, params, x, None, {"z": want})["z"], "float32")
    assert relative_error(runtime.run_reference(model, x.astype(np.float32))["z"], want) <= tol
    assert relative_error(run_encoder_model(model, runtime.session(model), x.astype(np.float32)), want) <= tol


def test_inputs_are_refused_as_in_the_spec():
    cfg, params, x, mask = inputs("rk4", "paper", pre=False)
    model = export_encoder_model(cfg, params)
    sess = runtime.session(model)
    empty = mask.copy()
    empty[0] = False
    with pytest.raises(ValueError, match=r"padding_mask: expected at least one real token"):
        run_encoder_model(model, sess, x.astype(np.float32), empty)
    with pytest.raises(ValueError, match=r"x: expected shape \(batch, seq, 8\)"):
        run_encoder_model(model, sess, x[..., :4].astype(np.float32), mask)
    weighted, weighted_params, _, _ = inputs("rk2_weighted", "paper", False)
    with pytest.raises(ValueError, match=r"params\['alpha'\]: rk2_weighted has one weight per stage"):
        export_encoder_model(weighted, {**weighted_params, "alpha": np.ones(3)})
    with pytest.raises(ValueError, match=r"model: expected an encoder model"):
        encoder_config(helper.make_model(helper.make_graph([], "g", [], [])))

"""The JAX port of the seed's positional family (backends/jax/positions.py) against the spec: every
encoder, with and without SSMax, in both modes and padded, float64 to 1e-12 and float32 within the
suite's rule; an encoder that is off adds nothing to the traced program; BAM's floor keeps a row
finite. (Cached decoding: tests/backends/test_cache.py; the golden cases: the main job.)"""

import importlib.util

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import ode_ref as R  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

FAMILY = ("sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam")
FLOAT64 = 1e-12  # a port in float64 runs the spec's arithmetic in another library
# each encoder twice: without SSMax in encoder mode, with it in decoder mode; and the seed's SSMax rule
CASES = [(e, False, "encoder", "visible") for e in FAMILY] + [(e, True, "decoder", "visible") for e in FAMILY] + [
    ("bam", True, "encoder", "visible"), ("pape", True, "encoder", "padded"), ("none", True, "decoder", "padded")]


def family_config(encoding, ssmax=False, mode="encoder", length="visible", **fields):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode=mode, ode_solver="heun", ode_steps=2, ode_use_pe=True,
                                 positional_encoding=encoding, use_ssmax=ssmax, ssmax_length=length, layer_idx=3), **fields})


def padded_inputs(cfg, seed=0):
    x = np.random.default_rng(seed).normal(size=(2, 6, cfg.hidden_size))
    mask = np.array([[True] * 5 + [False], [False, False] + [True] * 4])  # right- and left-padded
    return x, mask


@pytest.mark.parametrize("encoding, ssmax, mode, length", CASES,
                         ids=[f"{e}{'-ssmax' if s else ''}-{m}{'-padded-rule' if n == 'padded' else ''}" for e, s, m, n in CASES])
def test_every_encoder_equals_the_spec(encoding, ssmax, mode, length):
    cfg = family_config(encoding, ssmax, mode, length)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    x, mask = padded_inputs(cfg)
    want = R.ode_block(params, x, cfg, mask)
    with jax.enable_x64(True):
        assert relative_error(np.asarray(J.ode_block_jit(params, x, cfg, mask)), want) <= FLOAT64
    p32, x32 = {k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32)
    e32 = relative_error(R.ode_block(p32, x32, cfg, mask), want)
    got = np.asarray(J.ode_block_jit(p32, x32, cfg, mask))
    assert relative_error(got, want) <= tolerance(e32, "float32")
    np.testing.assert_array_equal(got[~mask], x32[~mask])  # padded tokens: unchanged


@pytest.mark.parametrize("encoding", FAMILY)
def test_an_encoder_that_is_off_adds_nothing_to_the_traced_program(encoding):
    """ode_use_pe=False: the same program as no encoder, SSMax asked for or not (it belongs to the
    encoder); the parameters are the same too (none of the encoder's)."""
    programs = []
    for cfg in (R.ODEConfig(hidden_size=8, num_heads=2), family_config(encoding, True, hidden_size=8, num_heads=2,
                                                                       ode_use_pe=False, ode_steps=1, ode_solver="rk4")):
        cfg = R.ODEConfig(**{**cfg.to_dict(), "ode_steps": 1, "ode_solver": "rk4", "mode": "encoder"})
        params = {k: v.astype(np.float32) for k, v in R.init_params(cfg).items()}
        programs.append(str(jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(params, np.zeros((1, 3, 8), np.float32))))
    assert programs[0] == programs[1]


def test_bam_s_floor_keeps_a_row_that_sees_one_key_finite():
    """A very negative beta overflows the |.| = 0 entry (the seed's NaN in decoder mode, where the
    first token sees only itself): floored at the spec's BAM_FLOOR, as the spec does, in float32
    and float64 alike."""
    cfg = family_config("bam", mode="decoder")
    params = R.init_params(cfg, seed=2)
    params["pos_encoder.theta_beta"] = np.full(3, -200.0)
    x, mask = padded_inputs(cfg, seed=2)
    want = R.ode_block(params, x, cfg, mask)
    assert np.isfinite(want).all()
    with jax.enable_x64(True):
        assert relative_error(np.asarray(J.ode_block_jit(params, x, cfg, mask)), want) <= FLOAT64
    got = np.asarray(J.ode_block_jit({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), cfg, mask))
    assert np.isfinite(got).all()


def test_hope_s_table_follows_layer_idx():
    """layer_idx is part of hope's table (g = 1 + 0.05 layer_idx): two layers, two programs, each
    equal to the spec."""
    x, mask = padded_inputs(family_config("hope"))
    with jax.enable_x64(True):
        outs = []
        for layer in (0, 7):
            cfg = family_config("hope", layer_idx=layer)
            params = R.init_params(cfg, seed=3)
            got = np.asarray(J.ode_block_jit(params, x, cfg, mask))
            assert relative_error(got, R.ode_block(params, x, cfg, mask)) <= FLOAT64
            outs.append(got)
    assert relative_error(outs[0], outs[1]) > 1e-6


def test_every_jax_and_onnx_path_refuses_a_pape_checkpoint_of_the_wrong_shape():
    """A PaPE ab.weight of another shape: the spec's error naming the key, in the JAX block, the
    Flax converter and the export, before anything runs."""
    cfg = family_config("pape")
    params = {k: v.astype(np.float32) for k, v in R.init_params(cfg).items()}
    params["pos_encoder.ab.weight"] = np.zeros((12, 12), np.float32)
    message = r"^params\['pos_encoder.ab.weight'\]: expected shape \(24, 12\); got \(12, 12\)"
    calls = [lambda: J.ode_block(params, np.zeros((1, 3, 12), np.float32), cfg)]
    if importlib.util.find_spec("flax") is not None:
        from odeattn.backends import flax as F

        calls.append(lambda: F.from_state_dict(cfg, params))
    if importlib.util.find_spec("onnx") is not None:
        from odeattn.export.block import export_model

        calls.append(lambda: export_model(cfg, params))
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()

"""The Flax encoder (odeattn.backends.flax.encoder) against the spec: the forward to 1e-12 in
float64, the released keys and init, the converters, dropout on the `dropout` rng, under jit."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from odeattn.backends.flax import ODEEncoder  # noqa: E402
from odeattn.backends.flax.encoder import from_state_dict, to_state_dict  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402

CFG = R.ODEEncoderConfig(8, 2, 12, encoder_layers=2, family="rk2_gated", encoder_normalize_before=True, dropout=0.3)


def inputs(cfg=CFG):
    params = R.init_encoder_params(cfg, 0, perturb=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    return params, x, mask


def test_the_forward_equals_the_spec_in_float64_under_jit():
    params, x, mask = inputs()
    with jax.enable_x64(True):
        apply = jax.jit(lambda v, x, m: ODEEncoder(config=CFG).apply(v, x, m))
        z = np.asarray(apply(from_state_dict(CFG, params), x, mask))
    assert relative_error(z, R.ode_encoder(params, x, CFG, mask)) < 1e-12


def test_the_time_dependent_stack_s_init_and_forward():
    """qkvflow's stack: f_weight and f_bias 0, f_b 1e-4 N(0, 1), matrices Xavier; the forward the spec's."""
    cfg = R.ODEEncoderConfig(8, 2, 12, encoder_layers=2, encoder_normalize_before=True, time_embed_dim=4, sinusoidal_dim=2)
    params, x, mask = inputs(cfg)
    with jax.enable_x64(True):
        init = ODEEncoder(config=cfg, param_dtype=jnp.float64).init(jax.random.key(0), x, mask)["params"]
        z = np.asarray(ODEEncoder(config=cfg).apply(from_state_dict(cfg, params), x, mask))
    assert list(init) == list(R.encoder_param_shapes(cfg))
    assert not np.asarray(init["block.attn_ln.f_weight"]).any() and 0 < np.abs(init["block.mlp.c_proj.f_b"]).max() < 1e-3
    assert relative_error(z, R.ode_encoder(params, x, cfg, mask)) < 1e-12


def test_init_holds_the_released_keys_and_init():
    cfg = R.ODEEncoderConfig(64, 4, 256, family="rk2_weighted")
    variables = ODEEncoder(config=cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 3, 64)))
    shapes = {k: tuple(v.shape) for k, v in variables["params"].items()}
    assert shapes == R.encoder_param_shapes(cfg)
    p = variables["params"]
    assert float(jnp.abs(p["layers.0.fc1.weight"]).max()) <= (6 / (256 + 64)) ** 0.5
    assert float(jnp.abs(p["layers.0.fc1.bias"]).max()) == 0 and bool((p["alpha"] == 1).all())
    assert bool((p["layers.0.layer_norms.1.weight"] == 1).all())
    pc = R.ODEEncoderConfig(8, 2, 12, encoder_layers=2, family="rk4_ema", alpha_type="vector", encoder_history_type=R.CORRECTOR,
                            macaron=True)
    p = ODEEncoder(config=pc).init(jax.random.PRNGKey(0), jnp.ones((1, 3, 8)))["params"]
    assert {k: tuple(v.shape) for k, v in p.items()} == R.encoder_param_shapes(pc)
    assert bool((p["alpha"] == 0.5).all()) and np.array_equal(np.asarray(p["history.weight_c"]), R.init_encoder_params(pc, dtype=np.float32)["history.weight_c"])


def test_the_converters_check_and_copy():
    params = {k: v.astype(np.float32) for k, v in inputs()[0].items()}
    back = to_state_dict(from_state_dict(CFG, params))
    assert list(back) == list(params) and all(np.array_equal(np.asarray(back[k]), params[k]) for k in params)
    with pytest.raises(ValueError, match=r"missing \['gate_linear.bias'\]"):
        from_state_dict(CFG, {k: v for k, v in params.items() if k != "gate_linear.bias"})


def test_dropout_draws_on_the_dropout_rng():
    params, x, mask = inputs()
    variables = from_state_dict(CFG, {k: v.astype(np.float32) for k, v in params.items()})
    x32 = x.astype(np.float32)
    run = lambda key: np.asarray(ODEEncoder(config=CFG).apply(variables, x32, mask, deterministic=False,  # noqa: E731
                                                             rngs={"dropout": key}))
    a, b = run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(2))
    assert np.abs(a - b).max() > 1e-2 and np.array_equal(a, run(jax.random.PRNGKey(1)))
    evaluation = np.asarray(ODEEncoder(config=CFG).apply(variables, x32, mask))
    assert relative_error(evaluation, R.ode_encoder(params, x, CFG, mask)) < 1e-5

"""The JAX encoder (odeattn.backends.jax.encoder) against the spec: float64 to 1e-12, float32
within the suite's tolerance rule, jax.grad against central differences of the spec, dropout
drawn at every stage evaluation, and the spec's refusals."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from ode_ref.encoder_backward import ode_encoder_vjp  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402
from odeattn.conformance.cases.encoder_cases import central_difference  # noqa: E402
from odeattn.conformance.cases.kinds import ENCODER  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

C, H, FF = 8, 2, 12


def config(family="rk2", profile="paper", pre=False, layers=2, **more):
    return R.ODEEncoderConfig(C, H, FF, encoder_layers=layers, family=family, profile=profile,
                              encoder_normalize_before=pre, **more)


def inputs(cfg, seed=0):
    params = R.init_encoder_params(cfg, seed, perturb=True)
    x = np.random.default_rng(seed).normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    return params, x, mask


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("family, profile", [("euler", "paper"), ("rk3", "released"), ("rk2_gated", "paper"),
                                             ("rk2_weighted", "released")])
def test_equal_to_the_spec(family, profile, x64):
    """Post-norm, four families (every family and profile, both placements: the conformance cases,
    each a compilation)."""
    cfg = config(family, profile)
    params, x, mask = inputs(cfg)
    want = R.ode_encoder(params, x, cfg, mask)
    assert relative_error(np.asarray(J.ode_encoder(params, x, cfg, mask)), want) < 1e-12
    got32 = np.asarray(J.ode_encoder({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), cfg, mask))
    assert got32.dtype == np.float32
    assert relative_error(got32, want) <= tolerance(ENCODER.float32_errors(cfg, params, x, mask, {"z": want})["z"], "float32")


def test_the_time_dependent_stack_equals_the_spec(x64):
    """qkvflow's stack (ode_ref/temporal.py): the same stages over jax.numpy, float64 (its float32 is
    the conformance cases')."""
    cfg = config("euler", pre=True, layers=3, time_embed_dim=4, sinusoidal_dim=2)
    params, x, mask = inputs(cfg)
    assert relative_error(np.asarray(J.ode_encoder(params, x, cfg, mask)), R.ode_encoder(params, x, cfg, mask)) < 1e-12


@pytest.mark.parametrize("family, profile, pre", [("rk2_gated", "paper", True), ("rk3", "released", False)])
def test_grad_against_central_differences_of_the_spec(family, profile, pre, x64):
    """jax.grad of <z_bar, ode_encoder> along a random direction of x and every parameter against
    the spec's central difference (step 1e-6; the bound's analysis: tests/backends/torch/test_encoder.py)."""
    cfg = config(family, profile, pre)
    params, x, mask = inputs(cfg)
    rng = np.random.default_rng(7)
    z_bar = rng.normal(size=x.shape)
    direction = {k: rng.normal(size=np.shape(v)) for k, v in {"x": x, **params}.items()}
    grads = jax.grad(lambda p, x: (J.ode_encoder(p, x, cfg, jnp.asarray(mask)) * z_bar).sum(), argnums=(0, 1))(params, x)
    grads = {"x": grads[1], **grads[0]}
    derivative = sum(float((np.asarray(grads[k]) * direction[k]).sum()) for k in direction)
    fd = central_difference(cfg, params, x, mask, z_bar, direction)
    assert abs(derivative - fd) <= 1e-8 * abs(fd)


def test_dropout_draws_anew_at_every_stage_evaluation():
    """With a key, two calls of rk2's one layer in a block draw different masks: the output then
    differs from both the evaluation run and a run whose every stage reuses one mask."""
    cfg = config("rk2", layers=1, dropout=0.5)
    params, x, mask = inputs(cfg)
    p32, x32 = {k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32)
    key = jax.random.PRNGKey(0)
    stages = J.encoder.JaxEncoderStages(cfg, key)
    stages.encoder({k: jnp.asarray(v) for k, v in p32.items()}, jnp.asarray(x32), jnp.asarray(mask))
    assert stages.draws == 4  # two dropouts a layer call, two stage evaluations
    trained = np.asarray(J.ode_encoder(p32, x32, cfg, mask, dropout_rng=key))
    assert np.abs(trained - np.asarray(J.ode_encoder(p32, x32, cfg, mask))).max() > 1e-2
    np.testing.assert_array_equal(trained, np.asarray(J.ode_encoder(p32, x32, cfg, mask, dropout_rng=key)))


def test_bad_input_is_refused_as_in_the_spec():
    cfg = config("rk2_weighted")
    params, x, mask = inputs(cfg)
    p32, x32 = {k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32)
    empty = mask.copy()
    empty[0] = False
    with pytest.raises(ValueError, match=r"padding_mask: expected at least one real token"):
        J.ode_encoder(p32, x32, cfg, empty)
    with pytest.raises(ValueError, match=r"params\['alpha'\]: rk2_weighted has one weight per stage"):
        J.ode_encoder({**p32, "alpha": np.ones(3, np.float32)}, x32, cfg, mask)
    with pytest.raises(TypeError, match=r"x: got float64 but JAX's x64 mode is off"):
        J.ode_encoder(p32, x, cfg, mask)


@pytest.mark.parametrize("family, profile, pre, more", [
    ("rk2_weighted", "paper", False, {}), ("rk4", "released", True, {}),
    ("rk2_ema", "released", True, dict(alpha_type="vector", encoder_history_type=R.CORRECTOR, macaron=True)),
    ("euler", "paper", True, dict(time_embed_dim=4, sinusoidal_dim=2))])
def test_grad_equals_the_specs_backward_pass(family, profile, pre, more, x64):
    """jax.grad of <z_bar, ode_encoder> against ode_ref.encoder_backward's, float64, every array
    (one successors' config: PCformer's corrector pre-norm over a Macaron layer; qkvflow's stack):
    bounded at 1e-12."""
    cfg = config(family, profile, pre, **more)
    params, x, mask = inputs(cfg)
    z_bar = np.random.default_rng(7).normal(size=x.shape)
    grads = jax.grad(lambda p, x: (J.ode_encoder(p, x, cfg, jnp.asarray(mask)) * z_bar).sum(), argnums=(0, 1))(params, x)
    x_bar, params_bar = ode_encoder_vjp(params, x, cfg, z_bar, mask)
    assert relative_error(np.asarray(grads[1]), x_bar) < 1e-12
    for name in params:
        assert relative_error(np.asarray(grads[0][name]), params_bar[name]) < 1e-12, name

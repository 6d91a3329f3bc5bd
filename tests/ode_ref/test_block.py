import numpy as np
import pytest

import ode_ref as R


def make(rng, **kw):
    cfg = R.ODEConfig(**{**dict(hidden_size=12, num_heads=3), **kw})
    return cfg, R.init_params(cfg, seed=2, perturb_norms=True), rng.normal(size=(2, 6, 12))


def test_euler_one_step_is_x_plus_f(rng):
    cfg, p, x = make(rng, ode_solver="euler", ode_steps=1)
    np.testing.assert_array_equal(R.ode_block(p, x, cfg), x + 1.0 * R.ode_func(p, 0.0, x, cfg))


def test_classical_rk4_matches_the_seed_formula(rng):
    cfg, p, x = make(rng, ode_solver="rk4", ode_steps=2)
    f = lambda z: R.ode_func(p, 0.0, z, cfg)  # noqa: E731  (f ignores t)
    z, dt = x, 0.5
    for _ in range(2):
        k1 = f(z)
        k2 = f(z + dt / 2 * k1)
        k3 = f(z + dt / 2 * k2)
        k4 = f(z + dt * k3)
        z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    np.testing.assert_allclose(R.ode_block(p, x, cfg), z, rtol=1e-14, atol=1e-14)


def test_trajectory_runs_from_x_to_z1_and_float32_computes_in_float32(rng):
    cfg, p, x = make(rng, ode_steps=3)
    z1, traj = R.ode_block(p, x, cfg, return_trajectory=True)
    assert traj.shape == (4, 2, 6, 12) and np.array_equal(traj[0], x) and np.array_equal(traj[-1], z1)
    z32 = R.ode_block(p, x.astype(np.float32), cfg)
    assert z32.dtype == np.float32 and z1.dtype == np.float64
    assert np.abs(z32 - z1).max() < 1e-5  # float32 math, not float64 math rounded at the end
    assert np.abs(z32 - z1).max() > 0


@pytest.mark.parametrize("norm", R.NORM_TYPES)
@pytest.mark.parametrize("bitnet", [False, True])
@pytest.mark.parametrize("mode", R.MODES)
def test_padded_positions_keep_their_state_and_no_nan(rng, norm, bitnet, mode):
    cfg, p, x = make(rng, norm_type=norm, use_bitnet=bitnet, mode=mode)
    pm = np.array([[False, False, True, True, True, False], [True] * 6])  # left and right padding
    z = R.ode_block(p, x, cfg, pm)
    assert np.isfinite(z).all()
    np.testing.assert_array_equal(z[~pm], x[~pm])
    # padded keys are never attended: changing a padded token changes no real token's output
    x2 = x.copy()
    x2[0, 0] += 100.0
    x2[0, 5] -= 50.0
    np.testing.assert_array_equal(R.ode_block(p, x2, cfg, pm)[pm], z[pm])


@pytest.mark.parametrize("norm", R.NORM_TYPES)
@pytest.mark.parametrize("bitnet", [False, True])
def test_a_decoder_token_ignores_later_tokens_and_an_encoder_one_does_not(rng, norm, bitnet):
    cfg, p, x = make(rng, norm_type=norm, use_bitnet=bitnet, mode="decoder")
    z = R.ode_block(p, x, cfg)
    for j in range(1, 6):
        x2 = x.copy()
        x2[:, j:] = rng.normal(size=x2[:, j:].shape) * 10
        np.testing.assert_array_equal(R.ode_block(p, x2, cfg)[:, :j], z[:, :j])
    enc = R.ODEConfig(**{**cfg.to_dict(), "mode": "encoder"})
    assert not np.array_equal(R.ode_block(p, x2, enc)[:, :1], R.ode_block(p, x, enc)[:, :1])


def test_large_inputs_stay_finite(rng):
    for norm in R.NORM_TYPES:
        cfg, p, x = make(rng, norm_type=norm)
        assert np.isfinite(R.ode_block(p, x * 1e4, cfg)).all()
        s = np.full((1, 1, 1, 3), 1e4)  # softmax inputs of magnitude 1e4 directly
        assert np.isfinite(R.softmax(s)).all()


def test_a_single_token_single_head_odd_width_block_is_finite(rng):
    cfg = R.ODEConfig(hidden_size=7, num_heads=1, mode="decoder", norm_type="prms_norm")
    x = rng.normal(size=(1, 1, 7))
    z = R.ode_block(R.init_params(cfg), x, cfg)
    assert z.shape == (1, 1, 7) and np.isfinite(z).all()


# ---- errors name the argument, the expectation and what was received (ODEConfig's: test_config.py)

@pytest.mark.parametrize("call, error, message", [
    pytest.param(lambda p, x, cfg: R.ode_block(p, x[0], cfg),
                 ValueError, r"x: expected shape \(batch, seq, 12\) .*; got \(6, 12\)", id="x-without-batch"),
    pytest.param(lambda p, x, cfg: R.ode_block(p, x[..., :10], cfg),
                 ValueError, r"x: expected shape \(batch, seq, 12\) .*; got \(2, 6, 10\)", id="x-of-another-width"),
    pytest.param(lambda p, x, cfg: R.ode_block(p, x.astype(np.int64), cfg),
                 TypeError, "x: expected dtype float32 or float64; got int64", id="integer-x"),
    pytest.param(lambda p, x, cfg: R.ode_block(p, x.tolist(), cfg),
                 TypeError, "x: expected a numpy.ndarray; got list", id="x-as-a-list"),
    pytest.param(lambda p, x, cfg: R.ode_block(p, x, cfg, np.ones((2, 5), bool)),
                 ValueError, r"padding_mask: expected shape \(2, 6\) \(batch, seq\); got \(2, 5\)",
                 id="padding-mask-of-another-length"),
    pytest.param(lambda p, x, cfg: R.ode_block(p, x, cfg, np.ones((2, 6), np.int64)),
                 TypeError, "padding_mask: expected a bool numpy.ndarray .*; got int64", id="integer-padding-mask"),
])
def test_a_bad_input_is_refused_naming_it(rng, call, error, message):
    cfg, p, x = make(rng)
    with pytest.raises(error, match=message):
        call(p, x, cfg)


def _other_attention(p, x, cfg):
    other = R.ODEConfig(hidden_size=12, num_heads=4)
    R.ode_block(p, x, cfg, attention=R.SelfAttention(other))


@pytest.mark.parametrize("call, message", [
    pytest.param(lambda p, x, cfg: R.ode_block({k: v for k, v in p.items() if k != "ode_func.norm.bias"}, x, cfg),
                 r"missing \['ode_func.norm.bias'\], unexpected \[\]", id="missing-parameter"),
    pytest.param(lambda p, x, cfg: R.ode_block({**p, "ode_func.qkv.bias": np.zeros(36)}, x, cfg),
                 r"unexpected \['ode_func.qkv.bias'\]", id="unexpected-parameter"),
    pytest.param(lambda p, x, cfg: R.ode_block({**p, "ode_func.out_proj.weight": np.zeros((12, 11))}, x, cfg),
                 r"params\['ode_func.out_proj.weight'\]: expected shape \(12, 12\); got \(12, 11\)",
                 id="parameter-of-another-shape"),
    pytest.param(lambda p, x, cfg: R.ode_block({**p, "ode_func.norm.weight": np.ones(12, np.int64)}, x, cfg),
                 r"params\['ode_func.norm.weight'\]: expected a floating dtype; got int64", id="integer-parameter"),
    pytest.param(_other_attention, "attention: its config", id="attention-of-another-config"),
])
def test_bad_parameters_or_attention_are_refused_by_name(rng, call, message):
    cfg, p, x = make(rng)
    with pytest.raises(ValueError, match=message):
        call(p, x, cfg)


def test_a_public_call_normalises_its_config_once(monkeypatch, rng):
    seen = []
    original = R.ODEConfig.from_any.__func__

    def counting(cls, obj):
        seen.append(type(obj).__name__)
        return original(cls, obj)

    monkeypatch.setattr(R.ODEConfig, "from_any", classmethod(counting))
    config = {"hidden_size": 8, "num_heads": 2, "ode_solver": "rk4", "ode_steps": 3}
    R.ode_block(R.init_params(R.ODEConfig(**config)), rng.normal(size=(1, 4, 8)), config)
    assert seen.count("dict") == 1  # the dict, once; later calls get the ODEConfig back at once


def test_every_path_takes_the_same_inputs_decided_once():
    """NumPy integers in a config are integers; parameters must be arrays; float16 is refused."""
    cfg = R.ODEConfig(hidden_size=np.int64(8), num_heads=np.int32(2), ode_steps=np.int64(2), use_bitnet=np.bool_(False))
    assert cfg == R.ODEConfig(hidden_size=8, num_heads=2) and type(cfg.hidden_size) is int
    params = R.init_params(cfg)
    with pytest.raises(ValueError, match=r"params\['ode_func.qkv.weight'\]: expected an array; got list"):
        R.ode_block({**params, "ode_func.qkv.weight": params["ode_func.qkv.weight"].tolist()}, np.zeros((1, 2, 8)), cfg)
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64; got float16"):
        R.ode_block(params, np.zeros((1, 2, 8), np.float16), cfg)

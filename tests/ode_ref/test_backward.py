"""ode_block_vjp, the spec's hand-written backward pass, against central finite differences of
ode_block with Richardson extrapolation, on every norm, solver, mode, encoding and padding (a
pairwise cover; BitLinear has no derivative to difference: its straight-through estimator is
checked against torch and JAX autograd by the conformance suite's grad cases)."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases.matrix import OPTION_FIELDS, pairwise

FACTORS = {
    "norm_type": list(R.NORM_TYPES),
    "ode_solver": list(R.SOLVERS),
    "mode": ["encoder", "decoder"],
    "positions": ["none", "rope", "alibi"],
    "padding": [False, True],
}
ROWS = pairwise(FACTORS)
# The error measure of a directional derivative g . d (d standard normal): |fd - g . d| / ||g||_2,
# the typical size of g . d (a relative error of g . d alone blows up when d happens to be nearly
# orthogonal to g). Differences at eps, eps/2, eps/4 extrapolated twice: truncation O(eps^6).
# eps = 3e-4 balances it against rounding (~1e-16 |L| / eps). d_model 32: prms_norm's statistic
# then has 2 channels; over 1 (d_model 8) a stage state passes near zero, where f is so curved that
# no step gives differences good to 1e-8. The worst error over the cover is 2.9e-9.
EPS = 3e-4
TOL = 1e-8


def directional(loss, theta, direction):
    """The derivative of loss along direction at theta: central differences at EPS, EPS/2, EPS/4,
    Richardson-extrapolated twice (the h^2 and h^4 error terms cancelled)."""
    def central(h):
        return (loss(theta + h * direction) - loss(theta - h * direction)) / (2 * h)
    d1, d2, d4 = central(EPS), central(EPS / 2), central(EPS / 4)
    return (16 * (4 * d4 - d2) / 3 - (4 * d2 - d1) / 3) / 15


def case(row, seed=0):
    cfg = R.ODEConfig(hidden_size=32, num_heads=2, ode_steps=2, **{k: row[k] for k in ("norm_type", "ode_solver", "mode")},
                      **OPTION_FIELDS["positions"](row["positions"]))
    rng = np.random.default_rng(seed)
    params = R.init_params(cfg, seed=seed, perturb_norms=True)
    x = rng.normal(size=(2, 5, 32))
    mask = None
    if row["padding"]:
        mask = np.ones((2, 5), bool)
        mask[1, :2] = False
    return cfg, params, x, mask, rng.normal(size=x.shape), rng


@pytest.mark.parametrize("row", ROWS, ids=lambda r: "-".join(str(v) for v in r.values()))
def test_vjp_equals_finite_differences(row):
    cfg, params, x, mask, z1_bar, rng = case(row)
    x_bar, params_bar = R.ode_block_vjp(params, x, cfg, z1_bar, mask)
    assert set(params_bar) == set(params) and all(params_bar[k].shape == np.shape(params[k]) for k in params)

    def loss_x(xx):
        return float(np.sum(R.ode_block(params, xx, cfg, mask) * z1_bar))

    d = rng.normal(size=x.shape)
    assert abs(np.sum(x_bar * d) - directional(loss_x, x, d)) <= TOL * np.linalg.norm(x_bar)
    for name in params:
        d = rng.normal(size=np.shape(params[name]))

        def loss_p(value, name=name):
            return float(np.sum(R.ode_block({**params, name: value}, x, cfg, mask) * z1_bar))

        assert abs(np.sum(params_bar[name] * d) - directional(loss_p, params[name], d)) <= TOL * np.linalg.norm(params_bar[name]), name


def test_vjp_refuses_a_cotangent_of_another_shape():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    params, x = R.init_params(cfg), np.zeros((1, 3, 8))
    with pytest.raises(ValueError, match=r"z1_bar: expected x's shape \(1, 3, 8\) and dtype float64; got \(1, 4, 8\) float64"):
        R.ode_block_vjp(params, x, cfg, np.zeros((1, 4, 8)))
    with pytest.raises(ValueError, match=r"z1_bar: expected shape \(batch, seq, 8\)"):
        R.ode_block_vjp(params, x, cfg, np.zeros((1, 3, 7)))


@pytest.mark.parametrize("encoding", ["bam", "pape_ri", "rope"])
def test_each_gradient_has_its_parameter_s_dtype(encoding):
    """In float32, every gradient is float32, BAM's thetas too (worked in float64, as their forward)."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, positional_encoding=encoding,
                      bam_learn_mu=encoding == "bam", use_ssmax=True, pape_num_positions=2 if encoding == "pape_ri" else 1)
    params = {k: v.astype(np.float32) for k, v in R.init_params(cfg, seed=0, perturb_norms=True).items()}
    x = np.random.default_rng(0).normal(size=(1, 5, 8)).astype(np.float32)
    x_bar, params_bar = R.ode_block_vjp(params, x, cfg, x.copy())
    assert x_bar.dtype == np.float32 and {k: v.dtype for k, v in params_bar.items()} == {k: np.dtype(np.float32) for k in params}


def test_each_norms_vjp_equals_finite_differences():
    """Every norm's VJP alone, every parameter included (the block test sees them through f)."""
    rng = np.random.default_rng(1)
    x, y_bar = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 3, 8))
    for norm in R.NORM_TYPES:
        params = {k: v for k, v in R.init_params(R.ODEConfig(hidden_size=8, num_heads=2, norm_type=norm), seed=2,
                                                  perturb_norms=True).items() if k.startswith("ode_func.norm.")}
        params = {k[len("ode_func.norm."):]: v for k, v in params.items()}
        x_bar, bars = R.norms.apply_norm_vjp(norm, params, x, y_bar)
        d = rng.normal(size=x.shape)
        want = directional(lambda xx: float(np.sum(R.apply_norm(norm, params, xx) * y_bar)), x, d)
        assert abs(np.sum(x_bar * d) - want) <= TOL * np.linalg.norm(x_bar), norm
        for name, value in params.items():
            d = rng.normal(size=np.shape(value))
            want = directional(lambda v: float(np.sum(R.apply_norm(norm, {**params, name: v}, x) * y_bar)), value, d)
            assert abs(np.sum(bars[name] * d) - want) <= TOL * np.linalg.norm(bars[name]), (norm, name)


FAMILY_VJP_ROWS = [  # (encoding, SSMax, mode, padding, extra fields): every encoding, with and without SSMax
    ("sinusoidal_rotary", False, "decoder", True, {}), ("hope", True, "encoder", False, {}),
    ("pape", False, "encoder", True, {}), ("pape_efficient", True, "decoder", True, {}),
    ("pape_ri", True, "encoder", True, dict(pape_num_positions=2)), ("pape_ri", False, "decoder", False, {}),
    ("bam", True, "decoder", True, dict(bam_learn_mu=True)), ("bam", False, "encoder", False, {}),
    ("alibi", True, "encoder", True, dict(ssmax_length="padded")), ("none", True, "decoder", False, {}),
    ("sinusoidal_rotary", True, "encoder", True, {}), ("hope", False, "decoder", True, dict(hope_damping=0.1)),
]


@pytest.mark.parametrize("row", FAMILY_VJP_ROWS, ids=lambda r: f"{r[0]}-{'ssmax' if r[1] else 'plain'}-{r[2]}-{r[3]}")
def test_the_hand_written_backward_equals_finite_differences(row):
    """The seed's positional family: x_bar and every parameter's gradient, the encoder's included."""
    encoding, ssmax, mode, padding, extra = row
    c = R.ODEConfig(hidden_size=16, num_heads=2, ode_use_pe=True, positional_encoding=encoding, use_ssmax=ssmax,
                    mode=mode, ode_solver="heun", ode_steps=2, pape_num_parabolas=2, layer_idx=1, **extra)
    p = R.init_params(c, seed=12, perturb_norms=True)
    rng = np.random.default_rng(3)
    x, pm = rng.normal(size=(2, 5, 16)), None
    if padding:
        pm = np.ones((2, 5), bool)
        pm[0, :2] = False
    z1_bar = rng.normal(size=x.shape)
    x_bar, p_bar = R.ode_block_vjp(p, x, c, z1_bar, pm)
    assert set(p_bar) == set(p)

    def loss(params, xx):
        return float(np.sum(R.ode_block(params, xx, c, pm) * z1_bar))

    d = rng.normal(size=x.shape)
    assert abs(np.sum(x_bar * d) - directional(lambda xx: loss(p, xx), x, d)) <= TOL * np.linalg.norm(x_bar)
    for name in p:
        d = rng.normal(size=np.shape(p[name]))
        want = directional(lambda v, name=name: loss({**p, name: v}, x), p[name], d)
        assert abs(np.sum(p_bar[name] * d) - want) <= TOL * np.linalg.norm(p_bar[name]), name

"""The worked example of a new encoder (docs/development.md): ALiBi with a scale, alibi_scale.
Written once, in ode_ref/positions.py; every port runs it through the spec's alibi_bias, so each
equals the spec here with no code of its own: PyTorch and JAX in float64, Flax, and the ONNX
export in float32 within the suite's rule."""

import importlib.util

import numpy as np
import pytest

import ode_ref as R
from ode_ref import positions as P
from odeattn.conformance.cases.tolerance import relative_error, tolerance

FLOAT64 = 1e-12  # a port in float64 runs the spec's arithmetic in another library
CFG = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="heun", ode_steps=2, ode_use_pe=True,
                  positional_encoding="alibi", alibi_scale=0.25)


def inputs():
    params = R.init_params(CFG, seed=4, perturb_norms=True)
    x = np.random.default_rng(4).normal(size=(2, 6, 12))
    mask = np.array([[True] * 5 + [False], [False, False] + [True] * 4])
    return params, x, mask


def test_the_scale_multiplies_every_slope():
    pq, pk = np.arange(5)[None], np.arange(5)[None]
    plain = R.ODEConfig(**{**CFG.to_dict(), "alibi_scale": 1.0})
    scaled = P.alibi_bias(pq, pk, CFG, np.float64)
    assert np.array_equal(scaled, 0.25 * P.alibi_bias(pq, pk, plain, np.float64))  # 0.25: exact
    params, x, mask = inputs()
    assert relative_error(R.ode_block(params, x, CFG, mask), R.ode_block(params, x, plain, mask)) > 1e-3


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True])
def test_a_bad_scale_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^alibi_scale: "):
        R.ODEConfig(hidden_size=4, num_heads=2, alibi_scale=value)


def test_torch_equals_the_spec():
    torch = pytest.importorskip("torch")
    from odeattn.backends import torch as T

    params, x, mask = inputs()
    block = T.ODEAttentionBlock(CFG).double()
    block.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    got = block(torch.from_numpy(x), padding_mask=torch.from_numpy(mask)).detach().numpy()
    assert relative_error(got, R.ode_block(params, x, CFG, mask)) <= FLOAT64


def test_jax_and_flax_equal_the_spec():
    jax = pytest.importorskip("jax")
    from odeattn.backends import jax as J

    params, x, mask = inputs()
    want = R.ode_block(params, x, CFG, mask)
    with jax.enable_x64(True):
        assert relative_error(np.asarray(J.ode_block(params, x, CFG, mask)), want) <= FLOAT64
        if importlib.util.find_spec("flax") is not None:
            from odeattn.backends import flax as F

            block = F.ODEAttentionBlock(config=CFG)
            assert relative_error(np.asarray(block.apply(F.from_state_dict(CFG, params), x, padding_mask=mask)), want) <= FLOAT64


def test_the_onnx_export_equals_the_spec():
    pytest.importorskip("onnxruntime")
    from odeattn.export.block import export_model
    from odeattn.export.runtime import session

    params, x, mask = inputs()
    z = session(export_model(CFG, params)).run(["z"], {"x": x.astype(np.float32), "padding_mask": mask})[0]
    want = R.ode_block(params, x, CFG, mask)
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), CFG, mask), want)
    assert relative_error(z, want) <= tolerance(e32, "float32")

"""Padded tokens may hold any bits: NaN or Inf there never reaches a real token, in any path."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.adapters import BUILTIN, make_backend, missing_requirements
from odeattn.conformance.worker import collect_outputs

PATHS = [n for n in ("spec", "torch", "jax", "onnxruntime", "onnxruntime-opset23") if not missing_requirements(n)]


@pytest.mark.parametrize("mode", R.MODES)
@pytest.mark.parametrize("path", PATHS)
def test_non_finite_padded_tokens_stay_in_their_rows(path, mode):
    backend = make_backend(BUILTIN[path].reference)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode=mode, use_bitnet=True, norm_type="dynamic_tanh", ode_steps=2)
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    mask = np.array([[True, True, False, False], [False, True, True, True]])  # right- and left-padded
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(dtype)
    dirty = x.copy()
    dirty[0, 2], dirty[0, 3, :4], dirty[1, 0] = np.nan, np.inf, -np.inf
    clean = np.where(mask[:, :, None], x, 0).astype(dtype)
    got = collect_outputs(backend, cfg, params, dirty, mask, dtype)
    want = collect_outputs(backend, cfg, params, clean, mask, dtype)
    for quantity in got:
        real_got, real_want = got[quantity][..., mask, :], want[quantity][..., mask, :]
        assert np.isfinite(real_got).all(), (path, quantity)
        np.testing.assert_array_equal(real_got, real_want)

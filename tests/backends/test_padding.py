"""Padded tokens may hold any bits: NaN or Inf there never reaches a real token, in any path (the
tiled JAX attention and cached decoding: tests/backends/test_causality.py)."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.adapters import missing_requirements
from odeattn.conformance.cases.kinds import BLOCK

PATHS = [n for n in ("spec", "torch", "jax", "onnxruntime", "onnxruntime-opset23") if not missing_requirements(n)]
BITNET_PATHS = [n for n in ("onnxruntime-integer",) if not missing_requirements(n)]  # use_bitnet blocks only


# the encodings whose terms read the padded tokens' neighbours: none, PaPE (of the query's state) with SSMax, BAM
ENCODINGS = {"none": {}, "pape+ssmax": dict(ode_use_pe=True, positional_encoding="pape", use_ssmax=True),
             "bam": dict(ode_use_pe=True, positional_encoding="bam")}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("mode", R.MODES)
@pytest.mark.parametrize("path", PATHS + BITNET_PATHS)
def test_non_finite_padded_tokens_stay_in_their_rows(path, mode, encoding, builtin_adapter):
    backend = builtin_adapter(path)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode=mode, use_bitnet=True, norm_type="dynamic_tanh", ode_steps=2,
                      **ENCODINGS[encoding])
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    mask = np.array([[True, True, False, False], [False, True, True, True]])  # right- and left-padded
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(dtype)
    dirty = x.copy()
    dirty[0, 2], dirty[0, 3, :4], dirty[1, 0] = np.nan, np.inf, -np.inf
    clean = np.where(mask[:, :, None], x, 0).astype(dtype)
    got = BLOCK.call(backend, cfg, params, dirty, mask, dtype, {}, {})
    want = BLOCK.call(backend, cfg, params, clean, mask, dtype, {}, {})
    for quantity in got:
        real_got, real_want = got[quantity][..., mask, :], want[quantity][..., mask, :]
        assert np.isfinite(real_got).all(), (path, quantity)
        np.testing.assert_array_equal(real_got, real_want)


@pytest.mark.parametrize("path", PATHS + ["onnx-reference"])
def test_huge_finite_float32_inputs_give_exact_norms(path, builtin_adapter):
    """|x| up to the largest float32, and tokens of equal huge values: the norms' statistics are
    taken on x / s (a power of two <= 2^126), so nothing overflows or divides 0 by 0, in every
    path; f(0, x) agrees with the float64 spec within the suite's tolerance."""
    from odeattn.conformance.cases.tolerance import relative_error, tolerance

    backend = builtin_adapter(path)
    for norm in R.NORM_TYPES:
        cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type=norm, use_bitnet=norm == "layer_norm")
        params = R.init_params(cfg, 1, perturb_norms=True)
        x = np.random.default_rng(2).normal(size=(2, 4, 8)) * np.array([1e20, 1e30, 3e37, 1.0])[None, :, None]
        x[0, 3] = np.float32(2.0**70)  # one token of equal values (centred values 0)
        x[1, 3, :2] = np.finfo(np.float32).max, 1.5 * 2.0**127  # the top of the float32 range
        want = R.ode_func(params, 0.0, x, cfg)
        e32 = relative_error(R.ode_func({k: v.astype(np.float32) for k, v in params.items()}, 0.0, x.astype(np.float32), cfg), want)
        got = BLOCK.call(backend, cfg, {k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), None,
                         "float32" if "float32" in backend.dtypes else "float64", {}, {})["f0"]
        assert np.isfinite(got).all(), (path, norm)
        assert relative_error(got, want) <= tolerance(e32, "float32"), (path, norm, relative_error(got, want), e32)


ENCODER_PATHS = [n for n in ("spec", "torch", "jax", "flax", "onnxruntime") if not missing_requirements(n)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's, on the padded tokens' own NaN arithmetic
@pytest.mark.parametrize("pre", [False, True])
@pytest.mark.parametrize("path", ENCODER_PATHS)
def test_non_finite_padded_tokens_stay_in_their_rows_in_the_encoder(path, pre, builtin_adapter):
    """The encoder stack: a padded key's value is held at 0 (its weight is 0, but 0 * NaN is NaN),
    so NaN or Inf in padded tokens leaves every real token bit for bit as in the clean run,
    through two blocks of each stage count, both norm placements."""
    backend = builtin_adapter(path)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    mask = np.array([[True, True, False, False], [False, True, True, True]])  # right- and left-padded
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(dtype)
    dirty = x.copy()
    dirty[0, 2], dirty[0, 3, :4], dirty[1, 0] = np.nan, np.inf, -np.inf
    for family in ("rk2_gated", "rk4"):
        cfg = R.ODEEncoderConfig(8, 2, 12, encoder_layers=2, family=family, encoder_normalize_before=pre)
        params = {k: v.astype(dtype) for k, v in R.init_encoder_params(cfg, 3, perturb=True).items()}
        got = backend.run_encoder(cfg, params, dirty, mask, dtype)[mask]
        assert np.isfinite(got).all(), (path, family)
        np.testing.assert_array_equal(got, backend.run_encoder(cfg, params, x, mask, dtype)[mask])


@pytest.mark.parametrize("path", ENCODER_PATHS)
def test_subnormal_inputs_follow_the_declared_flush(path, builtin_adapter):
    """An input made only of float32 subnormals: torch and ONNX Runtime keep them and equal the spec
    on it; JAX and Flax (XLA flushes subnormals to zero: their adapters' flushes_subnormals) equal the
    spec on the flushed input, the zero input, and are 1.0 off the spec on the input itself."""
    from odeattn.conformance.cases.tolerance import flush_subnormals, relative_error, tolerance

    backend = builtin_adapter(path)
    flushes = getattr(backend, "flushes_subnormals", False)  # an adapter without the attribute keeps subnormals
    assert flushes == (path in ("jax", "flax"))
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type="rms_norm", ode_steps=2)
    params = R.init_params(cfg, 1, perturb_norms=True, dtype=np.float32)
    x = (np.random.default_rng(3).normal(size=(2, 4, 8)) * 1e-39).astype(np.float32)
    assert (np.abs(x) < np.finfo(np.float32).tiny).all() and (x != 0).all()
    got = np.asarray(backend.run_block(cfg, params, x, None, "float32"))
    e32 = relative_error(R.ode_block(params, x, cfg), R.ode_block(params, x.astype(np.float64), cfg))
    reference = flush_subnormals(x) if flushes else x
    assert relative_error(got, R.ode_block(params, reference.astype(np.float64), cfg)) <= tolerance(e32, "float32")
    assert (relative_error(got, R.ode_block(params, x.astype(np.float64), cfg)) == 1.0) == flushes

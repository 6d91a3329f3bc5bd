"""The PyTorch port's norms: torch's fused kernels where they are exact, the written-out formula
where they overflowed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_fused_norm_kernels_kept_only_where_they_did_not_overflow(norm, monkeypatch):
    """Eager layer_norm and rms_norm keep torch's fused kernel's output unless its sum of squares
    overflowed (in float32 from |x| ~ 1e19 at most; the kernel then returns 0 or NaN) or x holds a
    NaN, and run the written-out formula there, for those tokens only: the others keep the
    kernel's bits, whatever another token holds. Either way they agree with the spec's formula: in
    float64 to a few roundings (measured: at most 4.3e-16 relative over 200 draws), in float32
    within the suite's float32 floor of 32 roundings (tolerance(0, "float32"); measured, outputs of
    order 1: at most 10.2 roundings over 200 draws, kept or not).
    """
    from odeattn.backends.torch import norms as N

    kept = []
    fused = N.fused
    monkeypatch.setattr(N, "fused", lambda *a: kept.append((y := fused(*a)) is not None and y[1] is None) or y)
    params = {"weight": torch.rand(8, dtype=torch.float64) + 0.5}
    if norm == "layer_norm":
        params["bias"] = torch.randn(8, dtype=torch.float64)
    x = torch.randn(3, 8, dtype=torch.float64)
    x = x / x.abs().max()  # max|x| = 1 exactly
    for dtype, scale, fused_kept, rtol in ((torch.float64, 1.0, True, 1e-14), (torch.float64, 1e30, True, 1e-14),
                                           (torch.float32, 1e18, True, 32 * 2**-24),
                                           (torch.float32, 1e20, False, 32 * 2**-24),
                                           (torch.float64, float("nan"), False, None)):
        kept.clear()
        got = N.NORMS[norm]((x * scale).to(dtype), **{k: v.to(dtype) for k, v in params.items()})
        assert kept == [fused_kept], (dtype, scale)
        want = R.norms.NORMS[norm]((x * scale).to(dtype).double().numpy(), **{k: v.to(dtype).double().numpy()
                                                                             for k, v in params.items()})
        if scale == scale:  # not NaN
            np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=rtol)
        else:
            assert torch.isnan(got).all()
    for bad in (1e20, float("nan"), float("inf")):  # one token falls back; the other two keep the kernel's bits
        mixed = x.to(torch.float32).clone()
        mixed[1] *= bad
        p32 = {k: v.to(torch.float32) for k, v in params.items()}
        got, alone = N.NORMS[norm](mixed, **p32), N.NORMS[norm](mixed[[0, 2]], **p32)
        assert torch.equal(got[[0, 2]], alone), bad


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_pow2_scale_is_the_spec_s_at_every_exponent_eager_and_compiled(dtype):
    """pow(2, e) (exp2 is outside the Core ATen opset) at every power of two of the dtype, 1.5 times
    each, its largest float and 0: the spec's s bit for bit (frexp and ldexp, in NumPy; bfloat16's
    in float32, which holds every bfloat16 power of two), in eager mode and under torch.compile."""
    import ml_dtypes

    from odeattn.backends.torch.norms import Norms

    info = ml_dtypes.finfo(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    powers = np.ldexp(1.0, np.arange(info.minexp - info.nmant, info.maxexp))
    x = np.concatenate([powers, 1.5 * powers[:-1], [float(info.max), 0.0]])
    x = torch.as_tensor(np.stack([x, -x / 4], axis=-1)).to(getattr(torch, dtype))
    want = R.norms.pow2_scale(x.double().numpy().astype(np.float32 if dtype == "bfloat16" else dtype))
    for run in (Norms().pow2_scale, torch.compile(Norms().pow2_scale)):
        got = run(x)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got.double().numpy(), want.astype(np.float64))

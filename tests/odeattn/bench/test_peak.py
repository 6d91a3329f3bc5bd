"""What the libraries allow: the products alone and ONNX Runtime's projections (odeattn.bench.peak)."""

import numpy as np
import pytest

from odeattn.bench import (CHAIN_ARGS, PEAK_LIBS, PRODUCT_LIBS, ort_projections, peak_kernels, product_chain, product_kernels,
                           product_operands)
from odeattn.conformance.cases.tolerance import relative_error


def test_every_library_runs_the_same_product_chain():
    """The products-alone timings run one computation in every library: product_chain in NumPy is
    the reference, and each library's result agrees within float32 rounding of its sums, each
    library summing in its own order (measured: at most 6.8e-7 relative); the bound leaves room
    for other CPUs' kernels, and a product wired to the wrong operand differs by O(1)."""
    for module in ("torch", "onnxruntime", "jax"):
        pytest.importorskip(module)
    ops = product_operands((1, 16, 32, 4))
    want = product_chain(*(ops[k] for k in CHAIN_ARGS), 16)
    import torch

    libs = dict(product_kernels((1, 16, 32, 4), 16, torch.get_num_threads(), print))
    assert set(libs) == set(PRODUCT_LIBS)
    for lib, fn in libs.items():
        got = fn()
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            assert relative_error(np.asarray(g), w) <= 256 * 2.0**-24, lib


def test_ort_projections_sum_every_evaluation_in_both_forms():
    """Float and integer projections of 3 evaluations: each result is 3 times one evaluation's
    product (the integer one exactly, levels less the zero point 128 times the ternary weights)."""
    pytest.importorskip("onnxruntime")
    shape = (1, 4, 8, 2)
    for integer in (False, True):
        once, thrice = (ort_projections(shape, e, 1, integer=integer)() for e in (1, 3))
        for a, b in zip(once, thrice):
            assert a.dtype == (np.int32 if integer else np.float32) and a.shape in ((4, 24), (4, 8))
            if integer:
                assert np.array_equal(3 * a, b)
            else:
                np.testing.assert_allclose(b, 3 * a, rtol=1e-6)


def test_the_limit_takes_every_installed_float32_gemm():
    """The peak's probe times every library of PEAK_LIBS here (CI installs them all), each one the
    same product: a library left out, or one wired to other operands, is caught."""
    for module in ("torch", "onnxruntime", "jax"):
        pytest.importorskip(module)
    import torch

    kernels = peak_kernels([(8, 16, 24)], 1, print)
    libs = [lib for lib, _, _ in kernels]
    assert sorted(libs) == sorted(PEAK_LIBS if torch.backends.mkldnn.is_available() else set(PEAK_LIBS) - {"onednn"})
    got = {lib: np.asarray(out[0] if isinstance(out, list) else out) for lib, _, fn in kernels for out in [fn()]}
    for lib, c in got.items():  # 16 products per entry: float32 roundings of their sums apart at most
        assert c.shape == (8, 24) and relative_error(c, got["numpy"]) <= 16 * 2.0**-24, lib

"""The JAX port's norms (backends/jax/norms.py): what it writes again, against the spec's."""

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from ode_ref import norms as R  # noqa: E402
from odeattn.backends.jax import norms as J  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_pow2_scale_from_the_exponent_bits_is_the_spec_s_bit_for_bit(dtype):
    """Every power of two of the dtype, 1.5 times each, its largest float, 0, Inf and NaN, compiled:
    the spec's s (frexp and ldexp, in NumPy; bfloat16's in float32, which holds every bfloat16
    power of two and has the same top, 2^126)."""
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    info = ml_dtypes.finfo(np_dtype)
    powers = np.ldexp(1.0, np.arange(info.minexp - info.nmant, info.maxexp))
    with np.errstate(over="ignore"):  # float64's 1.5 * 2^1023: Inf, which is in the list anyway
        x = np.concatenate([powers, 1.5 * powers, [float(info.max), 0.0, np.inf, -np.inf, np.nan]]).astype(np_dtype)
    # max|x| is each row's first entry; the NaN row's max came back from XLA as -Inf in float64 on
    # the CI machine, so the sign bit's mask is tested there (without it, s was 2^1022)
    x = np.stack([x, -x / 4], axis=-1)
    with jax.enable_x64(dtype == "float64"):
        got = jax.jit(J.pow2_scale)(jnp.asarray(x))
    assert got.dtype == np_dtype and got.shape == (len(x), 1)
    want = R.pow2_scale(x.astype(np.float32) if dtype == "bfloat16" else x).astype(np.float64)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), want)
    assert sorted(set(np.log2(want[:, 0]))) == list(range(0, info.maxexp - 1))  # every s from 1 to 2^top is met

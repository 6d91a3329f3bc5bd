"""The half-precision policy (ode_ref.precision): the rounding, the points it rounds at, and the
size of the error it makes."""

import numpy as np
import pytest

import ode_ref as R
from ode_ref.precision import HALF_DTYPES, HalfPrecisionAttention, half_block, round_to
from ode_ref.variants import LocalWindowAttention


def special_values():
    """Random magnitudes over float32's range, the specials, and every kind of tie for bfloat16."""
    rng = np.random.default_rng(0)
    wide = rng.normal(size=20000) * 10.0 ** rng.integers(-40, 39, 20000)
    ties = ((np.arange(4096, dtype=np.uint32) << np.uint32(17)) | np.uint32(0x8000)).view(np.float32)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45, 65504.0, 65520.0, 1e5]
    with np.errstate(over="ignore"):
        return np.concatenate([wide.astype(np.float32), ties, -ties, np.array(specials, np.float32)])


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_round_to_agrees_bit_for_bit_with_the_libraries_conversion(dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = special_values()
    with np.errstate(over="ignore"):
        want = a.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).astype(np.float32)
    got = round_to(a, dtype)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), a[~same][:5]


def test_an_unknown_storage_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype: expected one of float16, bfloat16; got 'float8'"):
        round_to(np.ones(2, np.float32), "float8")
    with pytest.raises(ValueError, match="storage: expected one of float16, bfloat16; got 'int8'"):
        HalfPrecisionAttention(R.ODEConfig(hidden_size=8, num_heads=2), "int8")


class Recording(HalfPrecisionAttention):
    """Records what each rounding point returns."""

    def __init__(self, config, storage):
        super().__init__(config, storage)
        self.rounded = []

    def to_storage(self, a):
        out = super().to_storage(a)
        self.rounded.append(out)
        return out


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_the_state_stays_float32_while_the_stage_values_are_in_storage(dtype):
    """A stage sum of rk4 lands between storage values; every rounded stage value is in storage."""
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, ode_solver="rk4", ode_steps=3, positional_encoding="rope",
                      ode_use_pe=True)
    att = Recording(cfg, dtype)
    x = round_to(np.random.default_rng(1).normal(size=(2, 5, 16)), dtype)
    states = att.integrate(att.prepare(R.init_params(cfg, seed=0), x), x)
    assert all((round_to(a, dtype) == a).all() for a in att.rounded)
    # per evaluation: h, q, k, v, rotated q and k, y, k_i; once: the two weights and the norm's two
    assert len(att.rounded) == 4 + 8 * 4 * 3
    assert not all((round_to(z, dtype) == z).all() for z in states[1:])


@pytest.mark.parametrize("dtype, u", [("float16", 2.0**-11), ("bfloat16", 2.0**-8)])
def test_the_half_run_is_within_a_few_roundings_of_the_float64_block(dtype, u):
    """Measured on this config: 1.1 u (float16) and 0.93 u (bfloat16); a policy with the state in
    storage, or without the float32 sums, would be several u off (bound: 4 u)."""
    cfg = R.ODEConfig(hidden_size=32, num_heads=4, ode_solver="rk4", ode_steps=8, mode="decoder")
    params, x = R.init_params(cfg, seed=1), np.random.default_rng(0).normal(size=(2, 7, 32))
    z = R.ode_block(params, x, cfg)
    err = np.abs(half_block(params, x, cfg, dtype=dtype) - z).max() / np.abs(z).max()
    assert u / 8 < err < 4 * u


def test_a_bfloat16_x_is_taken_as_a_float16_one_is():
    """half_block takes x in either half dtype (and float32, float64), each as the float32 values
    it holds: a bfloat16 x gives the z of the float32 x holding the same values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    params = R.init_params(cfg, seed=0)
    x = np.random.default_rng(3).normal(size=(1, 4, 8)).astype(ml_dtypes.bfloat16)
    for dtype in ("bfloat16", "float16"):
        assert np.array_equal(half_block(params, x, cfg, dtype=dtype), half_block(params, x.astype(np.float32), cfg, dtype=dtype))
    with pytest.raises(TypeError, match=r"^x: expected dtype float16 or bfloat16 or float32 or float64; got int64"):
        half_block(params, x.astype(np.int64), cfg, dtype="float16")


def test_a_variant_keeps_its_stage_under_the_policy():
    cfg = R.ODEConfig(hidden_size=16, num_heads=2)
    params, x = R.init_params(cfg, seed=0), np.random.default_rng(2).normal(size=(1, 6, 16))
    window = LocalWindowAttention(cfg, window=2)
    z_window = R.ode_block(params, x, cfg, attention=window)
    got = half_block(params, x, cfg, dtype="bfloat16", attention=window)
    assert np.abs(got - z_window).max() < 4 * 2.0**-8 * np.abs(z_window).max()
    assert np.abs(got - R.ode_block(params, x, cfg)).max() > 0.05 * np.abs(z_window).max()

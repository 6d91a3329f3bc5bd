"""The example variants (ode_ref/variants.py): each overrides its one stage, and the block
integrates any of them."""

import numpy as np
import pytest

import ode_ref as R


def cfg(**kw):
    base = dict(hidden_size=4, num_heads=2)
    return R.ODEConfig(**{**base, **kw})


def test_variants_override_one_stage(rng):
    c = cfg(hidden_size=8, num_heads=2)
    q, k, v = (rng.normal(size=(1, 3, 2, 4)) for _ in range(3))
    sq = R.ScaledQueryAttention(c, query_scale=2.0, time_gain=0.5)
    q2, k2, v2 = sq.preprocess_qkv(q, k, v, t=0.5, positions=None)
    np.testing.assert_array_equal(q2, q * 2.25)
    assert k2 is k and v2 is v
    win = R.LocalWindowAttention(c, window=2).build_mask(4)
    np.testing.assert_array_equal(win[0, 0].astype(int), [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]])
    with pytest.raises(ValueError, match="window: expected an integer >= 1; got 0"):
        R.LocalWindowAttention(c, window=0)


@pytest.mark.parametrize("variant", [R.ScaledQueryAttention, R.LocalWindowAttention])
def test_block_integrates_a_variant_and_it_changes_the_result(variant, rng):
    c = cfg(hidden_size=8, num_heads=2)
    p, x = R.init_params(c, 3), rng.normal(size=(2, 5, 8))
    base = R.ode_block(p, x, c)
    out = R.ode_block(p, x, c, attention=variant(c))
    assert np.isfinite(out).all() and not np.allclose(out, base)

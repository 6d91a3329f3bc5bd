"""Cached decoding in the spec: prefill on T tokens then k decode steps equals ode_block on the
T + k tokens, the cache's checks, and its immutability."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases.fair import make_inputs
from odeattn.conformance.cases.matrix import pairwise
from odeattn.conformance.cases.tolerance import relative_error, tolerance

T, K = 4, 3  # prompt tokens, decoded tokens
FACTORS = {
    "ode_solver": list(R.SOLVERS),
    "norm_type": list(R.NORM_TYPES),
    "use_bitnet": [False, True],
    "encoding": ["none", "rope", "alibi"],
    "padding": [False, True],
}
ROWS = pairwise(FACTORS)


def config(row) -> R.ODEConfig:
    return R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_steps=2, ode_solver=row["ode_solver"],
                       norm_type=row["norm_type"], use_bitnet=row["use_bitnet"], ode_use_pe=row["encoding"] != "none",
                       positional_encoding="rope" if row["encoding"] == "none" else row["encoding"])


def setup(row, seed):
    cfg = config(row)
    params = R.init_params(cfg, seed=seed, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 3, T + K, seed=seed, padding=row["padding"], decoded=K)
    return cfg, params, x, mask


def decode_all(params, x, cfg, mask, **kw):
    """(the prompt's z, then each decoded token's z) concatenated: (batch, T + K, d_model)."""
    z, cache = R.prefill(params, x[:, :T], cfg, None if mask is None else mask[:, :T], max_len=T + K, **kw)
    out = [z]
    for i in range(T, T + K):
        z_t, cache = R.decode_step(params, x[:, i:i + 1], cache, cfg, **kw)
        out.append(z_t)
    return np.concatenate(out, axis=1), cache


@pytest.mark.parametrize("row", ROWS, ids=lambda r: "-".join(str(v) for v in r.values()))
def test_prefill_then_decode_equals_the_whole_sequence(row):
    """float64: 1e-12 relative (only the order of sums differs); float32: within the suite's
    tolerance, derived from the spec's own float32 error on the whole sequence (tolerance.py)."""
    cfg, params, x, mask = setup(row, seed=len(str(row)))
    want = R.ode_block(params, x, cfg, mask)
    got, _ = decode_all(params, x, cfg, mask)
    assert relative_error(got, want) <= 1e-12
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask), want)
    got32, cache = decode_all(params, x.astype(np.float32), cfg, mask)
    assert got32.dtype == cache.k[0].dtype == np.float32
    assert relative_error(got32, want) <= tolerance(e32, "float32")


def test_the_cache_is_immutable_and_a_step_replays():
    cfg, params, x, mask = setup(ROWS[0], seed=0)
    _, cache = R.prefill(params, x[:, :T], cfg, max_len=T + K)
    before = [a.copy() for a in (*cache.k, *cache.v, cache.padding_mask)]
    z1, c1 = R.decode_step(params, x[:, T:T + 1], cache, cfg)
    z2, c2 = R.decode_step(params, x[:, T:T + 1], cache, cfg)
    np.testing.assert_array_equal(z1, z2)
    assert c1.index == c2.index == cache.index + 1 == T + 1
    for a, b in zip(before, (*cache.k, *cache.v, cache.padding_mask)):
        np.testing.assert_array_equal(a, b)
    zb, _ = R.decode_step(params, 2 * x[:, T:T + 1], cache, cfg)  # a branch from the same prefix
    assert not np.allclose(zb, z1)


def test_the_cache_holds_one_slot_array_per_evaluation_and_its_stated_size():
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="rk4", ode_steps=3)
    params = R.init_params(cfg)
    _, cache = R.prefill(params, np.zeros((2, 5, 12)), cfg, max_len=9)
    assert len(cache.k) == len(cache.v) == 3 * 4 == R.cache.evaluations(cfg)
    assert cache.k[0].shape == (2, 9, 3, 4) and cache.padding_mask.shape == (2, 9)
    assert cache.padding_mask[:, :5].all() and not cache.padding_mask[:, 5:].any() and cache.index == 5
    values = sum(a.size for a in (*cache.k, *cache.v))
    assert values == R.cache.cache_values(cfg, 2, 9) == 2 * 3 * 4 * 2 * 9 * 12


@pytest.mark.parametrize("variant", R.VARIANTS, ids=lambda v: v.__name__)
def test_variants_decode_exactly(variant):
    """Every example variant decodes as it runs on the whole sequence: build_mask gets the cache
    index (LocalWindow, RecentKeys); a stage may read t (ScaledQuery)."""
    cfg, params, x, mask = setup({**ROWS[0], "encoding": "rope", "padding": True}, seed=3)
    att = variant(cfg)
    got, _ = decode_all(params, x, cfg, mask, attention=att)
    assert relative_error(got, R.ode_block(params, x, cfg, mask, attention=att)) <= 1e-12

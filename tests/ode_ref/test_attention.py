import numpy as np

import ode_ref as R
from ode_ref.attention import masked_fill_min, positions_from_padding


def cfg(**kw):
    base = dict(hidden_size=4, num_heads=2)
    return R.ODEConfig(**{**base, **kw})


def test_softmax_stable_at_large_magnitude():
    s = np.array([1e4, 1e4 - 1.0, -1e4])
    out = R.softmax(s)
    e = np.exp([0.0, -1.0, -2e4])
    np.testing.assert_allclose(out, e / e.sum(), rtol=1e-15)
    assert np.isfinite(R.softmax(np.array([1e4, 1e4], np.float32))).all()


def test_masked_fill_uses_finite_minimum_so_full_rows_stay_finite():
    s = np.array([[1.0, 2.0], [3.0, 4.0]])
    mask = np.array([[True, False], [False, False]])
    out = R.softmax(masked_fill_min(s, mask))
    np.testing.assert_array_equal(out, [[1.0, 0.0], [0.5, 0.5]])


def test_project_splits_q_k_v_in_that_order_per_head():
    att = R.SelfAttention(cfg())
    h = np.eye(4)[None, :1]  # one token, h = e_0
    w = np.arange(48.0).reshape(12, 4)  # qkv[i] = h @ w^T = column 0 = 4 i
    q, k, v = att.project(w, h)
    assert q.shape == (1, 1, 2, 2)
    np.testing.assert_array_equal(q.ravel(), [0, 4, 8, 12])
    np.testing.assert_array_equal(k.ravel(), [16, 20, 24, 28])
    np.testing.assert_array_equal(v.ravel(), [32, 36, 40, 44])


def test_attn_equals_the_hand_computed_softmax_of_one_head():
    att = R.SelfAttention(cfg(hidden_size=2, num_heads=1))
    q = np.array([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # (batch 1, seq 2, heads 1, head_dim 2)
    k = np.array([[[[1.0, 0.0]], [[0.0, 0.0]]]])
    v = np.array([[[[1.0, 2.0]], [[3.0, 4.0]]]])
    y = att.attn(q, k, v, np.ones((1, 1, 2, 2), bool))
    w0 = np.exp(2**-0.5) / (np.exp(2**-0.5) + 1)  # query 0 scores (1, 0) * scale
    np.testing.assert_allclose(y[0, 0, 0], [w0 * 1 + (1 - w0) * 3, w0 * 2 + (1 - w0) * 4], rtol=1e-15)
    np.testing.assert_allclose(y[0, 1, 0], [2.0, 3.0], rtol=1e-15)  # equal scores: the mean of v


def test_build_mask_hides_padded_keys_and_the_decoder_adds_the_causal_mask():
    pm = np.array([[True, True, False]])
    enc = R.SelfAttention(cfg()).build_mask(3, pm)
    np.testing.assert_array_equal(enc[0, 0], [[1, 1, 0]] * 3)
    dec = R.SelfAttention(cfg(mode="decoder")).build_mask(3, pm)
    np.testing.assert_array_equal(dec[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert R.SelfAttention(cfg()).build_mask(3).shape == (1, 1, 3, 3)


def test_positions_count_the_real_tokens_before_and_left_padding_gets_minus_one():
    pm = np.array([[False, True, True], [True, True, True]])
    np.testing.assert_array_equal(positions_from_padding(pm, 3), [[-1, 0, 1], [0, 1, 2]])
    np.testing.assert_array_equal(positions_from_padding(None, 3), [[0, 1, 2]])


def test_postprocess_zeroes_padded_queries():
    y = np.ones((1, 2, 2, 2))
    out = R.SelfAttention(cfg()).postprocess_attn(y, np.array([[True, False]]))
    assert out[0, 0].all() and not out[0, 1].any()

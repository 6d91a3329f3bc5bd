"""Positional encodings in JAX; port of ode_ref/positions.py (the frequencies, slopes and hope's
angles are the spec's own float64 constants).

Differences, same values: with x64 off JAX has no float64 at run time, so rope_cos_sin and
hope_tables gather rows of a table that the spec computes in float64 at trace time, for positions
-1 .. bound - 1 (-1: left padding); bound is static (the sequence length, or the cache's max_len).
What reads parameters (bam_bias, ssmax_factor, the PaPE terms) is computed in the state's dtype:
float64 under x64, where it equals the spec's float64 to a few roundings.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ode_ref import positions as spec
from ode_ref.positions import BAM_FLOOR, alibi_slopes


def _table(values: np.ndarray, rows, dtype):
    """values (bound + 1, P), float64 rows for positions -1 .. bound - 1, gathered at rows + 1."""
    return jnp.take(jnp.asarray(values, dtype), rows + 1, axis=0)


def rope_cos_sin(positions, config, dtype, bound: int):
    """(cos, sin), each (batch | 1, seq, P) in dtype, for integer positions in [-1, bound)."""
    cos, sin = spec.rope_cos_sin(np.arange(-1, bound), config, np.float64)
    return _table(cos, positions, dtype), _table(sin, positions, dtype)


def apply_rope(x, cos, sin):
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation."""
    pairs = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = jnp.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return jnp.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)


def alibi_bias(positions_q, positions_k, config, dtype):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(slope_h * |p_i - p_j|)."""
    slopes = jnp.asarray(alibi_slopes(config.num_heads), dtype)[:, None, None]
    distance = jnp.abs(positions_q[:, None, :, None] - positions_k[:, None, None, :]).astype(dtype)
    return -(slopes * distance)


# ---- the rest of the seed's positional family -------------------------------------------------
def hope_tables(positions, config, layer_idx: int, dtype, bound: int):
    """hope's (r cosh a, r sinh a), each (batch | 1, seq, P) in dtype, gathered from the spec's
    float64 tables for positions in [-1, bound) (layer_idx static: it is part of the table)."""
    ch, sh = spec.hope_tables(np.arange(-1, bound), config, layer_idx, np.float64)
    return _table(ch, positions, dtype), _table(sh, positions, dtype)


def apply_hope(x, ch, sh):
    """x (batch, seq, heads, head_dim): per pair (e, o) -> (e ch + o sh, e sh + o ch)."""
    pairs = ch.shape[-1]
    c, s = ch[:, :, None, :], sh[:, :, None, :]
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    mapped = jnp.stack([even * c + odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return jnp.concatenate([mapped, x[..., 2 * pairs:]], axis=-1)


def softplus(x):
    """log(1 + exp(x)) for any finite x."""
    return jnp.logaddexp(jnp.zeros((), x.dtype), x)


def distances(positions_q, positions_k, dtype):
    """(batch | 1, 1, seq_q, seq_k): p_i - p_j in dtype (exact integers)."""
    return (positions_q[:, None, :, None] - positions_k[:, None, None, :]).astype(dtype)


def pape_coefficients(z, ab, position, config):
    """(A, B), each (batch, heads, seq, 1), of the query's raw state z (batch, seq, d_model)."""
    b, t, _ = z.shape
    heads, m = config.num_heads, config.pape_num_parabolas
    coef = (z @ ab.T).reshape(b, t, 2, heads, m)
    w = position.reshape(heads, m)
    a_sum = (softplus(coef[:, :, 0]) * (w * w)).sum(axis=-1)  # (batch, seq, heads)
    b_sum = (coef[:, :, 1] * w).sum(axis=-1)
    return a_sum.transpose(0, 2, 1)[..., None], b_sum.transpose(0, 2, 1)[..., None]


def pape_bias(z, encoder: dict, positions_q, positions_k, config):
    """pape and pape_efficient: (batch, heads, seq_q, seq_k) in z's dtype,
    scale * (B d - A d^2), d = p_i - p_j."""
    a_sum, b_sum = pape_coefficients(z, encoder["ab.weight"], encoder["position.weight"], config)
    d = distances(positions_q, positions_k, z.dtype)
    return (b_sum * d - a_sum * (d * d)) * jnp.asarray(config.scale, z.dtype)


def pape_ri_bias(z, encoder: dict, positions_q, positions_k, config):
    """pape_ri: (batch, heads, seq_q, seq_k) in z's dtype, scale * -n a(i) s_h^2 d^2."""
    a = softplus(z @ encoder["a.weight"].T).transpose(0, 2, 1)[..., None]  # (batch, heads, seq, 1)
    s = encoder["position_scales"]
    d = distances(positions_q, positions_k, z.dtype)
    n = jnp.asarray(config.pape_num_positions, z.dtype)
    return -(n * a * (s * s)) * (d * d) * jnp.asarray(config.scale, z.dtype)


def content_bias(z, encoder: dict, positions_q, positions_k, config):
    """The PaPE family's score term (pape_bias or pape_ri_bias)."""
    fn = pape_ri_bias if config.position_encoding == "pape_ri" else pape_bias
    return fn(z, encoder, positions_q, positions_k, config)


def bam_alpha_beta(theta_alpha, theta_beta):
    """(alpha, beta), each (H,) in the thetas' dtype: alpha = exp(-theta_beta * theta_alpha)."""
    return jnp.exp(-theta_beta * theta_alpha), theta_beta


def bam_mu(encoder: dict, config):
    """(H,): theta_mu when learnable, else bam_mu_init for every head (the spec's float64 constant,
    rounded to the state's dtype where bam_bias uses it)."""
    if config.bam_learn_mu:
        return encoder["theta_mu"]
    return spec.bam_mu(encoder, config)


def bam_bias(encoder: dict, positions_q, positions_k, config, dtype, mu=None):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(|p_j - alpha_h p_i - mu_h| + eps) ** beta_h,
    floored at the spec's BAM_FLOOR (an overflow to -inf included), computed in dtype."""
    theta_alpha, theta_beta = (encoder[k].astype(dtype) for k in ("theta_alpha", "theta_beta"))
    alpha, beta = bam_alpha_beta(theta_alpha, theta_beta)
    mu = jnp.asarray(bam_mu(encoder, config) if mu is None else mu, dtype)
    pq = positions_q.astype(dtype)[:, None, :, None]
    pk = positions_k.astype(dtype)[:, None, None, :]
    h = (slice(None), None, None)
    bias = -((jnp.abs(pk - alpha[h] * pq - mu[h]) + jnp.asarray(config.bam_eps, dtype)) ** beta[h])
    return jnp.maximum(bias, jnp.asarray(BAM_FLOOR, dtype))


def ssmax_lengths(positions_q, positions_k, config, seq_len: int):
    """int (batch | 1, seq_q): SSMax's n per query (the spec's rule, config.ssmax_length)."""
    if config.ssmax_length == "padded":
        return jnp.full((1, positions_q.shape[1]), seq_len)
    if config.mode == "decoder":
        return positions_q + 1
    return jnp.broadcast_to(positions_k[:, -1:] + 1, (positions_k.shape[0], positions_q.shape[1]))


def ssmax_factor(s, lengths, dtype):
    """(batch | 1, heads, seq_q, 1) in dtype: s_h * ln(max(n, 1)), the ln in float32 at least
    (float64 under x64), rounded once to dtype."""
    wide = jnp.promote_types(dtype, jnp.float32)
    log_n = jnp.log(jnp.maximum(lengths, 1).astype(wide)).astype(dtype)
    return s.astype(dtype)[None, :, None, None] * log_n[:, None, :, None]


def ssmax_bias(bias, factor):
    """The score bias times SSMax's factor."""
    return bias * factor


def ssmax_queries(q, factor):
    """q (batch, seq_q, heads, head_dim) times the factor (batch | 1, heads, seq_q, 1)."""
    return q * jnp.swapaxes(factor, 1, 2)

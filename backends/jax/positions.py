"""Positional encodings in JAX: only what differs from ode_ref/positions.py, whose functions the
port's stages run over jax.numpy (apply_rope, alibi_bias, the PaPE terms, ...).

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
from ode_ref.positions import BAM_FLOOR


def gather(tables, positions):
    """Each of tables, (bound + 1, P) rows for positions -1 .. bound - 1, at integer positions
    (batch | 1, seq) in [-1, bound): (batch | 1, seq, P) each."""
    return tuple(jnp.take(t, positions + 1, axis=0) for t in tables)


def rotary_table(config, dtype, bound: int) -> tuple:
    """(cos, sin), NumPy (bound + 1, P): the spec's float64 values for positions -1 .. bound - 1,
    rounded once to dtype."""
    return tuple(np.asarray(t, dtype) for t in spec.rope_cos_sin(np.arange(-1, bound), config, np.float64))


def rope_cos_sin(positions, config, dtype, bound: int):
    """(cos, sin), each (batch | 1, seq, P) in dtype, for integer positions in [-1, bound)."""
    return gather(rotary_table(config, dtype, bound), positions)


# ---- the rest of the seed's positional family -------------------------------------------------
def hope_table(config, layer_idx: int, dtype, bound: int) -> tuple:
    """hope's (r cosh a, r sinh a), NumPy (bound + 1, P), as rotary_table's."""
    return tuple(np.asarray(t, dtype) for t in spec.hope_tables(np.arange(-1, bound), config, layer_idx, np.float64))


def hope_tables(positions, config, layer_idx: int, dtype, bound: int):
    """hope's (r cosh a, r sinh a), each (batch | 1, seq, P) in dtype, gathered from the spec's
    float64 tables for positions in [-1, bound) (layer_idx static: it is part of the table)."""
    return gather(hope_table(config, layer_idx, dtype, bound), positions)


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


def ssmax_factor(s, lengths, dtype):
    """(batch | 1, heads, seq_q, 1) in dtype: s_h * ln(max(n, 1)), the ln in float32 at least
    (float64 under x64), rounded once to dtype."""
    wide = jnp.promote_types(dtype, jnp.float32)
    log_n = jnp.log(jnp.maximum(lengths, 1).astype(wide)).astype(dtype)
    return s.astype(dtype)[None, :, None, None] * log_n[:, None, :, None]

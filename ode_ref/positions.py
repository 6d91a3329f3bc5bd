"""Positional encodings: rotary (RoPE, the seed's convention) and ALiBi, as the seed applies them.

Positions are token indices among the real tokens: cumsum(padding_mask) - 1 (left padding gets
-1, never read), or the cache slot's count of real tokens when decoding. They do not depend on t,
so prepare computes the encodings once per block:

    rope_cos_sin(positions, config, dtype)  (cos, sin), each (batch | 1, seq, P), P = head_dim // 2
    apply_rope(x, cos, sin)                 x (batch, seq, heads, head_dim) rotated pairwise
    alibi_bias(positions_q, positions_k, config, dtype)
                                            (batch | 1, heads, seq_q, seq_k) score bias

Seed convention (not RoFormer/Llama's): the pairs are interleaved, (x[2i], x[2i+1]), with an odd
head_dim's last channel untouched, and frequency i is base ** (-i / (P - 1)), from 1 down to
1 / base (P == 1: frequency 1), not base ** (-2i / head_dim).

Precision, decided here: the angle (p * rope_scaling) * frequency_i and its cos and sin are
computed in float64, then cos and sin are rounded once to the state's dtype. An angle computed in
float32, as the seed computes it in the tensor's dtype, carries an absolute error of about
|angle| * u32 that grows with the context (at p = 2047, over 1000 times float32's unit roundoff
in q and k: tests/ode_ref/test_positions.py). Rounded from float64, cos and sin add a few
roundings to q and k, the order of the projection before them, which the suite's float32
tolerance (derived from the spec's own float32 run of each case, tolerance.py) covers without a
term of its own. Ports without float64 at run time (JAX with x64 off) gather rows of a table this
module computes in float64.

ALiBi: bias[h, i, j] = -(slope_h * |p_i - p_j|), in the state's dtype (the distance is an exact
integer, so one rounding); added to the scaled scores before the mask fill (attention.py), so a
fully masked row stays finite. The slopes are Press and Smith's: 2 ** (-8 (h + 1) / H) for H a
power of two; else the P slopes of the largest power of two P < H, then the even-indexed slopes
of 2P, the first H - P of them.
"""

from __future__ import annotations

import numpy as np


def rotary_frequencies(pairs: int, base: float) -> np.ndarray:
    """float64 (pairs,): base ** (-i / (pairs - 1)) for i < pairs ([1] when pairs == 1): the seed's
    frequencies, shared by rope, sinusoidal_rotary and hope."""
    exponent = -np.arange(pairs) / (pairs - 1) if pairs > 1 else np.zeros(pairs)
    return np.power(base, exponent)


def rotary_base_scaling(config) -> tuple[float, float]:
    """(base, scaling) of the rotation in effect: sinusoidal_rotary's fields, else rope's."""
    if config.position_encoding == "sinusoidal_rotary":
        return config.sinusoidal_base, config.sinusoidal_scale
    return config.rope_base, config.rope_scaling


def rope_frequencies(config) -> np.ndarray:
    """float64 (P,): the rotation's frequencies, P = head_dim // 2 (rotary_frequencies)."""
    return rotary_frequencies(config.head_dim // 2, rotary_base_scaling(config)[0])


def rope_angles(positions, config) -> np.ndarray:
    """float64 (..., P): (p * scaling) * frequency_i for integer positions (...)."""
    p = np.asarray(positions, dtype=np.float64) * rotary_base_scaling(config)[1]
    return p[..., None] * rope_frequencies(config)


def rope_cos_sin(positions, config, dtype):
    """(cos, sin) of the angles, computed in float64 and rounded once to dtype."""
    angles = rope_angles(positions, config)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x, cos, sin, xp=np):
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation
    y[2i] = x[2i] cos - x[2i+1] sin, y[2i+1] = x[2i] sin + x[2i+1] cos; channel 2P (odd head_dim) kept."""
    pairs = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = xp.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return xp.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """float64 (num_heads,): Press and Smith's geometric slopes."""

    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(np.log2(n) - 3)))  # 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    p = 2 ** int(np.floor(np.log2(num_heads)))
    slopes = power_of_two(p)
    if p < num_heads:
        slopes += power_of_two(2 * p)[0::2][: num_heads - p]
    return np.asarray(slopes, dtype=np.float64)


def alibi_bias(positions_q, positions_k, config, dtype, xp=np):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(slope_h * |p_i - p_j|), one rounding; each
    slope times alibi_scale first, in float64."""
    slopes = xp.asarray(alibi_slopes(config.num_heads) * config.alibi_scale, dtype=dtype)[:, None, None]
    distance = xp.astype(xp.abs(positions_q[:, None, :, None] - positions_k[:, None, None, :]), dtype)
    return -(slopes * distance)


def apply_rope_vjp(y_bar, cos, sin):
    """x_bar of apply_rope(x, cos, sin): the inverse rotation (the transpose of a rotation)."""
    return apply_rope(y_bar, cos, -sin)


# ---- the rest of the seed's positional family (docs/positions.md) ----------------------------
# sinusoidal_rotary is RoPE with sinusoidal_base and sinusoidal_scale (rotary_base_scaling): its
# angles are the spec's float64 ones at every position, where the seed reads a float32 table below
# sinusoidal_max_len and computes them beyond it (seed_sinusoidal_table, the seed's float32 step).


def seed_sinusoidal_table(config):
    """The seed's float32 (cos, sin) table of sinusoidal_rotary, each (sinusoidal_max_len, P): its
    angles p * scale * frequency rounded to float32 (p, the scale and the frequencies each in
    float32), then cos and sin in float32. Not used by the spec, which computes float64 angles at
    every position and rounds cos and sin once to the state's dtype: the table's entries differ
    from the spec's by at most about max|angle| * 2^-23 (a few 1e-5 at p = 511; measured in
    tests/ode_ref/test_positions_family.py), and the seed's prefix moves when T crosses max_len."""
    pairs = config.head_dim // 2
    freq = rotary_frequencies(pairs, config.sinusoidal_base).astype(np.float32)
    p = np.arange(config.sinusoidal_max_len, dtype=np.float32) * np.float32(config.sinusoidal_scale)
    angles = p[:, None] * freq[None, :]
    return np.cos(angles), np.sin(angles)


HOPE_ANGLE_LIMIT = 12.0  # the seed clips hope's hyperbolic angle to [-12, 12]
HOPE_LAYER_GAIN = 0.05  # g = 1 + 0.05 * layer_idx


def hope_gain(layer_idx: int) -> float:
    """g = 1 + 0.05 * layer_idx: hope's growth with the layer (the seed's logical_layer_idx)."""
    return 1.0 + HOPE_LAYER_GAIN * layer_idx


def hope_angles(positions, config, layer_idx: int) -> np.ndarray:
    """float64 (..., P): clip(p * frequency_i * g, -12, 12), frequencies of hope_base."""
    freq = rotary_frequencies(config.head_dim // 2, config.hope_base)
    p = np.asarray(positions, dtype=np.float64)[..., None]
    return np.clip(p * freq * hope_gain(layer_idx), -HOPE_ANGLE_LIMIT, HOPE_ANGLE_LIMIT)


def hope_damping(positions, config, layer_idx: int) -> np.ndarray:
    """float64 (..., 1): r = exp(-hope_damping * g * p)."""
    p = np.asarray(positions, dtype=np.float64)[..., None]
    return np.exp(-config.hope_damping * hope_gain(layer_idx) * p)


def hope_tables(positions, config, layer_idx: int, dtype):
    """(r cosh a, r sinh a), each (batch | 1, seq, P): computed in float64, rounded once to dtype.
    Growth: cosh(12) is about 8e4 per factor, so a score of q at i and k at j grows like 1e10 by
    T = 16 (the softmax nearly one-hot); float32 holds it; float16 overflows, so the policy refuses
    it past 12 tokens (precision.check_hope_range)."""
    a, r = hope_angles(positions, config, layer_idx), hope_damping(positions, config, layer_idx)
    return (r * np.cosh(a)).astype(dtype), (r * np.sinh(a)).astype(dtype)


def apply_hope(x, ch, sh, xp=np):
    """x (batch, seq, heads, head_dim), ch and sh (batch | 1, seq, P): per interleaved pair
    (e, o) -> (e ch + o sh, e sh + o ch), the same map on q and on k (channel 2P of an odd
    head_dim kept). The map is symmetric, so it is its own transpose (its VJP). The score of q at i
    and k at j then depends on i + j, not on i - j: hope is not a relative encoding."""
    pairs = ch.shape[-1]
    c, s = ch[:, :, None, :], sh[:, :, None, :]
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    mapped = xp.stack([even * c + odd * s, even * s + odd * c], axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return xp.concatenate([mapped, x[..., 2 * pairs:]], axis=-1)


def softplus(x, xp=np):
    """log(1 + exp(x)), for any finite x (torch's softplus returns x itself above 20, 2e-9 away)."""
    return xp.logaddexp(xp.asarray(0, dtype=x.dtype), x)


def distances(positions_q, positions_k, dtype, xp=np):
    """(batch | 1, 1, seq_q, seq_k): p_i - p_j in dtype (exact integers)."""
    return xp.astype(positions_q[:, None, :, None] - positions_k[:, None, None, :], dtype)


def pape_coefficients(z, ab, position, config, xp=np):
    """(A, B), each (batch, heads, seq, 1), of the query's raw state z (batch, seq, d_model):
    A = sum_m a_m w_m^2 and B = sum_m b_m w_m, with a_m = softplus(row c=0 of ab @ z) and
    b_m = row c=1 (ab (2 H M, d_model), row c*H*M + h*M + m) and the slopes w = position
    (H M, 1), all in z's dtype."""
    b, t, _ = z.shape
    heads, m = config.num_heads, config.pape_num_parabolas
    coef = (z @ ab.T).reshape(b, t, 2, heads, m)
    w = position.reshape(heads, m)
    a_sum = (softplus(coef[:, :, 0], xp) * (w * w)).sum(axis=-1)  # (batch, seq, heads)
    b_sum = (coef[:, :, 1] * w).sum(axis=-1)
    return xp.permute_dims(a_sum, (0, 2, 1))[..., None], xp.permute_dims(b_sum, (0, 2, 1))[..., None]


def pape_bias(z, encoder: dict, positions_q, positions_k, config, xp=np):
    """pape and pape_efficient (one function): (batch, heads, seq_q, seq_k) in z's dtype,
    scale * sum_m (-a_m w_m^2 d^2 + b_m w_m d), d = p_i - p_j, the coefficients of the query's
    state. The seed widens q and k with columns whose dot product is this term (the expansion of
    d^2 in p_i^2, p_i p_j and p_j^2 cancels at long positions); the spec writes it in d, exact.
    pape casts positions to float32 first: exact below 2^24, so no difference."""
    a_sum, b_sum = pape_coefficients(z, encoder["ab.weight"], encoder["position.weight"], config, xp)
    d = distances(positions_q, positions_k, z.dtype, xp)
    return (b_sum * d - a_sum * (d * d)) * xp.asarray(config.scale, dtype=z.dtype)


def pape_ri_bias(z, encoder: dict, positions_q, positions_k, config, xp=np):
    """pape_ri: (batch, heads, seq_q, seq_k) in z's dtype, scale * -n a(i) s_h^2 d^2, with
    a = softplus(a.weight @ z_i) (a.weight (H, d_model)), s = position_scales (1, H, 1, 1) and
    n = pape_num_positions."""
    a = xp.permute_dims(softplus(z @ encoder["a.weight"].T, xp), (0, 2, 1))[..., None]  # (batch, heads, seq, 1)
    s = encoder["position_scales"]
    d = distances(positions_q, positions_k, z.dtype, xp)
    n = xp.asarray(config.pape_num_positions, dtype=z.dtype)
    return -(n * a * (s * s)) * (d * d) * xp.asarray(config.scale, dtype=z.dtype)


def content_bias(z, encoder: dict, positions_q, positions_k, config, xp=np):
    """The PaPE family's score term (pape_bias or pape_ri_bias)."""
    fn = pape_ri_bias if config.position_encoding == "pape_ri" else pape_bias
    return fn(z, encoder, positions_q, positions_k, config, xp)


BAM_FLOOR = -(2.0 ** 100)  # BAM's bias is floored here (docs/specification.md, decisions)


def bam_alpha_beta(theta_alpha, theta_beta):
    """float64 (alpha, beta), each (H,): alpha = exp(-theta_beta * theta_alpha), beta = theta_beta."""
    ta, tb = np.asarray(theta_alpha, dtype=np.float64), np.asarray(theta_beta, dtype=np.float64)
    return np.exp(-tb * ta), tb


def bam_mu(encoder: dict, config) -> np.ndarray:
    """float64 (H,): theta_mu when learnable, else bam_mu_init for every head. The seed keeps the
    fixed mu in a float32 buffer: |mu - float32(mu)| <= 2^-24 |mu| (0 at the default 0)."""
    if config.bam_learn_mu:
        return np.asarray(encoder["theta_mu"], dtype=np.float64)
    return np.full(config.num_heads, config.bam_mu_init)


def bam_bias(encoder: dict, positions_q, positions_k, config, dtype, mu=None):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(|p_j - alpha_h p_i - mu_h| + eps) ** beta_h,
    in float64, floored at BAM_FLOOR, rounded once. mu: bam_mu's, unless given (a seed's float32
    mu). The floor: a very negative beta overflows the |.| = 0 entry to -inf (the seed's NaN in a
    row that sees only that key); floored, that key's weight is exactly 0 beside any other
    visible key, and 1 when it is the only one, the limit of the formula, and the row is finite."""
    alpha, beta = bam_alpha_beta(encoder["theta_alpha"], encoder["theta_beta"])
    mu = bam_mu(encoder, config) if mu is None else np.asarray(mu, dtype=np.float64)
    pq = np.asarray(positions_q, dtype=np.float64)[:, None, :, None]
    pk = np.asarray(positions_k, dtype=np.float64)[:, None, None, :]
    h = (slice(None), None, None)
    with np.errstate(over="ignore"):
        bias = -((np.abs(pk - alpha[h] * pq - mu[h]) + config.bam_eps) ** beta[h])
    return np.maximum(bias, BAM_FLOOR).astype(dtype)


def ssmax_lengths(positions_q, positions_k, config, seq_len: int, xp=np):
    """int (batch | 1, seq_q): SSMax's n per query. ssmax_length "visible" (odeattn's): the keys
    the query sees under the block's mask, padding and causal (decoder: its position + 1; encoder:
    the real tokens, the last key position + 1), the same in a prefix, padded or decoded. "padded"
    (the seed's): seq_len, the padded length, for every row (no cache can reproduce it)."""
    if config.ssmax_length == "padded":
        return xp.full((1, positions_q.shape[1]), seq_len)
    if config.mode == "decoder":
        return positions_q + 1
    return xp.broadcast_to(positions_k[:, -1:] + 1, (positions_k.shape[0], positions_q.shape[1]))


def ssmax_factor(s, lengths, dtype):
    """(batch | 1, heads, seq_q, 1) in dtype: s_h * ln(max(n, 1)) (ln in float64, rounded once;
    a padded query with no visible key gets ln 1 = 0, never -inf). s: the parameter (H,)."""
    log_n = np.log(np.maximum(lengths, 1).astype(np.float64)).astype(dtype)
    return s.astype(dtype)[None, :, None, None] * log_n[:, None, :, None]


def ssmax_bias(bias, factor):
    """The score bias times SSMax's factor: SSMax multiplies every score, the bias included."""
    return bias * factor


def ssmax_queries(q, factor, xp=np):
    """q (batch, seq_q, heads, head_dim) times the factor (batch | 1, heads, seq_q, 1): the scores'
    q . k part rescaled (the bias is rescaled by ssmax_bias); the mask fill follows, so a hidden
    key stays hidden whatever the sign of s."""
    return q * xp.permute_dims(factor, (0, 2, 1, 3))


# ---- the VJPs of the family's parameterised parts (backward.py) --------------------------------
def _sigmoid(x):
    """softplus's derivative, exp(-log(1 + exp(-x))), for any finite x."""
    return np.exp(-np.logaddexp(x.dtype.type(0), -x))


def content_bias_vjp(bias_bar, z, encoder: dict, positions_q, positions_k, config):
    """(z_bar, encoder_bar) of content_bias for its cotangent bias_bar (batch, heads, seq_q, seq_k)."""
    d = distances(positions_q, positions_k, z.dtype)
    g = bias_bar * z.dtype.type(config.scale)
    b, t, _ = z.shape
    heads = config.num_heads
    if config.position_encoding == "pape_ri":
        w = encoder["a.weight"]
        pre, s = z @ w.T, encoder["position_scales"]  # (batch, seq, heads), (1, heads, 1, 1)
        a = softplus(pre).transpose(0, 2, 1)[..., None]
        n = z.dtype.type(config.pape_num_positions)
        gd2 = (g * (d * d)).sum(axis=-1, keepdims=True)  # (batch, heads, seq_q, 1)
        a_bar = -(n * (s * s)) * gd2
        s_bar = (-(n * a) * 2 * s * gd2).sum(axis=(0, 2, 3)).reshape(s.shape)
        pre_bar = a_bar[..., 0].transpose(0, 2, 1) * _sigmoid(pre)
        return pre_bar @ w, {"a.weight": pre_bar.reshape(-1, heads).T @ z.reshape(-1, z.shape[-1]),
                             "position_scales": s_bar}
    m, ab, position = config.pape_num_parabolas, encoder["ab.weight"], encoder["position.weight"]
    coef = (z @ ab.T).reshape(b, t, 2, heads, m)
    w = position.reshape(heads, m)
    a_sum_bar = -(g * (d * d)).sum(axis=-1)[..., None].transpose(0, 2, 1, 3)  # (batch, seq, heads, 1)
    b_sum_bar = (g * d).sum(axis=-1)[..., None].transpose(0, 2, 1, 3)
    c0_bar = a_sum_bar * (w * w) * _sigmoid(coef[:, :, 0])
    c1_bar = b_sum_bar * w
    w_bar = (a_sum_bar * 2 * w * softplus(coef[:, :, 0]) + b_sum_bar * coef[:, :, 1]).sum(axis=(0, 1))
    coef_bar = np.stack([c0_bar, c1_bar], axis=2).reshape(b, t, 2 * heads * m)
    return coef_bar @ ab, {"position.weight": w_bar.reshape(position.shape),
                           "ab.weight": coef_bar.reshape(-1, coef_bar.shape[-1]).T @ z.reshape(-1, z.shape[-1])}


def bam_bias_vjp(bias_bar, encoder: dict, positions_q, positions_k, config):
    """encoder_bar of bam_bias (float64 math) for its cotangent bias_bar: theta_alpha, theta_beta and,
    when learnable, theta_mu. The floored entries and |.|'s kink (sign 0) pass no gradient."""
    alpha, beta = bam_alpha_beta(encoder["theta_alpha"], encoder["theta_beta"])
    mu = bam_mu(encoder, config)
    pq = np.asarray(positions_q, dtype=np.float64)[:, None, :, None]
    pk = np.asarray(positions_k, dtype=np.float64)[:, None, None, :]
    h = (slice(None), None, None)
    r = pk - alpha[h] * pq - mu[h]
    base = np.abs(r) + config.bam_eps
    with np.errstate(over="ignore"):
        power = base ** beta[h]
        g = np.where(-power > BAM_FLOOR, np.asarray(bias_bar, dtype=np.float64), 0.0)
        r_bar = -g * beta[h] * base ** (beta[h] - 1) * np.sign(r)  # d bias / d r
    beta_bar = (-g * power * np.log(base)).sum(axis=(0, 2, 3))
    alpha_bar = (r_bar * -pq).sum(axis=(0, 2, 3))
    ta, tb = (np.asarray(encoder[k], dtype=np.float64) for k in ("theta_alpha", "theta_beta"))
    out = {"theta_alpha": alpha_bar * alpha * -tb, "theta_beta": beta_bar + alpha_bar * alpha * -ta}
    if config.bam_learn_mu:
        out["theta_mu"] = -r_bar.sum(axis=(0, 2, 3))
    return out


def ssmax_factor_vjp(factor_bar, lengths, dtype):
    """s_bar (H,) of ssmax_factor for its cotangent factor_bar (batch | 1, heads, seq_q, 1)."""
    log_n = np.log(np.maximum(lengths, 1).astype(np.float64)).astype(dtype)
    return (factor_bar * log_n[:, None, :, None]).sum(axis=(0, 2, 3))

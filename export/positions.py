"""Positional encodings as ONNX nodes; port of ode_ref/positions.py (the frequencies, slopes and
hope's constants are the spec's own float64 numbers). What the spec computes in float64 from the
positions (the rotary angles, hope's tables, BAM's bias, SSMax's ln n) is computed in double
(ONNX Runtime's Cos, Sin, Exp, Pow and Log take doubles), then cast to float32 once, as the spec
decides; what reads the state (the PaPE terms) is float32, as the spec's float32 run computes it.

Differences, same values: the PaPE Linear weights arrive transposed (d_model, rows), as the
export stores every projection; SSMax's n is (batch | 1, 1) where every query has the same one
(the padded rule, the encoder), which broadcasts to the spec's (batch | 1, seq_q)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ode_ref.positions import (BAM_FLOOR, HOPE_ANGLE_LIMIT, bam_mu, hope_gain, rope_frequencies,
                               rotary_base_scaling, rotary_frequencies)

from .graph import Value


def _double(v: Value) -> Value:
    return v.body.op("Cast", v, to=TensorProto.DOUBLE)


def _float(v: Value) -> Value:
    return v.body.op("Cast", v, to=TensorProto.FLOAT)


def rope_cos_sin(positions: Value, config):
    """(cos, sin), each float32 (batch | 1, seq, P), of the double angles (p * scaling) * frequency."""
    g = positions.body
    p = _double(positions) * g.const(rotary_base_scaling(config)[1], np.float64)
    angles = g.op("Unsqueeze", p, g.ints(-1)) * g.const(rope_frequencies(config), np.float64)
    return tuple(_float(g.op(op, angles)) for op in ("Cos", "Sin"))


def _pairs(x: Value, first: Value, second: Value, sign: float) -> Value:
    """x (batch, seq, heads, head_dim) per interleaved pair (e, o) -> (e first + sign o second,
    e second + o first), on x's first 2P channels viewed (..., P, 2); an odd head_dim's last
    channel is put back unchanged. first, second: (batch | 1, seq, P)."""
    g = x.body
    pairs = g.op("Shape", first, start=2, end=3)  # (1,) int64: P
    two_p = pairs * 2
    body = g.op("Slice", x, g.ints(0), two_p, g.ints(3))
    shape = g.op("Concat", g.ints(0, 0, 0), pairs, g.ints(2), axis=0)
    even, odd = g.op("Split", g.op("Reshape", body, shape), g.ints(1, 1), axis=-1, outputs=2)
    c, s = (g.op("Unsqueeze", a, g.ints(2, 4)) for a in (first, second))  # (batch | 1, seq, 1, P, 1)
    first_half = even * c - odd * s if sign < 0 else even * c + odd * s
    mapped = g.op("Concat", first_half, even * s + odd * c, axis=-1)
    mapped = g.op("Reshape", mapped, g.op("Concat", g.ints(0, 0, 0), two_p, axis=0))
    rest = g.op("Slice", x, two_p, g.ints(np.iinfo(np.int64).max), g.ints(3))  # empty for an even head_dim
    return g.op("Concat", mapped, rest, axis=-1)


def apply_rope(x: Value, cos: Value, sin: Value) -> Value:
    """x (batch, seq, heads, head_dim), cos and sin (batch | 1, seq, P): the interleaved rotation."""
    return _pairs(x, cos, sin, -1.0)


# ---- the rest of the seed's positional family -------------------------------------------------
def hope_tables(positions: Value, config, layer_idx: int):
    """hope's (r cosh a, r sinh a), each float32 (batch | 1, seq, P): a = clip(p * frequency * g,
    -12, 12) and r = exp(-damping * g * p) in double (cosh and sinh as half sums of Exp), cast once."""
    g = positions.body
    p = g.op("Unsqueeze", _double(positions), g.ints(-1))  # (batch | 1, seq, 1)
    freq = rotary_frequencies(config.head_dim // 2, config.hope_base)
    limit = g.const(HOPE_ANGLE_LIMIT, np.float64)
    a = g.op("Min", g.op("Max", p * g.const(freq, np.float64) * g.const(hope_gain(layer_idx), np.float64),
                         g.op("Neg", limit)), limit)
    r = g.op("Exp", g.const(-config.hope_damping * hope_gain(layer_idx), np.float64) * p)
    up, down = g.op("Exp", a), g.op("Exp", g.op("Neg", a))
    half = g.const(0.5, np.float64)
    return _float(r * ((up + down) * half)), _float(r * (g.op("Sub", up, down) * half))


def apply_hope(x: Value, ch: Value, sh: Value) -> Value:
    """x (batch, seq, heads, head_dim): per pair (e, o) -> (e ch + o sh, e sh + o ch)."""
    return _pairs(x, ch, sh, 1.0)


def softplus(x: Value) -> Value:
    """log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): finite for any finite x, and accurate where
    exp(-|x|) is small (x far below 0, where softplus(x) is about exp(x) itself)."""
    g = x.body
    return g.op("Max", x, g.const(0.0)) + log1p(g.op("Exp", g.op("Neg", g.op("Abs", x))))


def log1p(e: Value) -> Value:
    """log(1 + e) for 0 <= e <= 1 (softplus's exp(-|x|)), to a few units of roundoff (ONNX has no
    Log1p): log(u) * e / (u - 1) with u = 1 + e rounded, which cancels u's rounding (Goldberg,
    1991), and e itself where u rounds to 1. Log(1 + e) alone loses the digits of e that 1 + e
    drops: some for any e < 1, all of them at e <= 2^-24."""
    g = e.body
    u = g.const(1.0) + e
    d = u - g.const(1.0)  # exact: u is within [1, 2] (Sterbenz)
    rounds_to_one = d == g.const(0.0)
    return g.op("Where", rounds_to_one, e, g.op("Log", u) * (e / g.op("Where", rounds_to_one, g.const(1.0), d)))


def distances(positions_q: Value, positions_k: Value) -> Value:
    """float32 (batch | 1, 1, seq_q, seq_k): p_i - p_j (exact integers)."""
    g = positions_q.body
    return _float(g.op("Sub", g.op("Unsqueeze", positions_q, g.ints(1, 3)), g.op("Unsqueeze", positions_k, g.ints(1, 2))))


def _heads_first(a: Value) -> Value:
    """(batch, seq, heads) -> (batch, heads, seq, 1)."""
    g = a.body
    return g.op("Unsqueeze", g.op("Transpose", a, perm=[0, 2, 1]), g.ints(-1))


def pape_coefficients(z: Value, ab_t: Value, position: Value, config):
    """(A, B), each float32 (batch, heads, seq, 1), of the raw state z (batch, seq, d_model);
    ab_t: ab.weight transposed (d_model, 2 H M); position: position.weight (H M, 1)."""
    g, heads, m = z.body, config.num_heads, config.pape_num_parabolas
    coef = g.op("Reshape", g.op("MatMul", z, ab_t), g.ints(0, 0, 2, heads, m))
    c0, c1 = (g.op("Squeeze", a, g.ints(2)) for a in g.op("Split", coef, g.ints(1, 1), axis=2, outputs=2))
    w = g.op("Reshape", position, g.ints(heads, m))
    a_sum = g.op("ReduceSum", softplus(c0) * (w * w), g.ints(-1), keepdims=0)  # (batch, seq, heads)
    b_sum = g.op("ReduceSum", c1 * w, g.ints(-1), keepdims=0)
    return _heads_first(a_sum), _heads_first(b_sum)


def pape_bias(z: Value, encoder: dict, positions_q: Value, positions_k: Value, config) -> Value:
    """pape and pape_efficient: float32 (batch, heads, seq_q, seq_k), scale * (B d - A d^2)."""
    a_sum, b_sum = pape_coefficients(z, encoder["ab.weight"], encoder["position.weight"], config)
    d = distances(positions_q, positions_k)
    return z.body.op("Sub", b_sum * d, a_sum * (d * d)) * config.scale


def pape_ri_bias(z: Value, encoder: dict, positions_q: Value, positions_k: Value, config) -> Value:
    """pape_ri: float32 (batch, heads, seq_q, seq_k), scale * -n a(i) s_h^2 d^2; encoder's
    a.weight transposed (d_model, H)."""
    g = z.body
    a = _heads_first(softplus(g.op("MatMul", z, encoder["a.weight"])))  # (batch, heads, seq, 1)
    s = encoder["position_scales"]
    d = distances(positions_q, positions_k)
    return g.op("Neg", g.const(float(config.pape_num_positions)) * a * (s * s)) * (d * d) * config.scale


def content_bias(z: Value, encoder: dict, positions_q: Value, positions_k: Value, config) -> Value:
    """The PaPE family's score term (pape_bias or pape_ri_bias)."""
    fn = pape_ri_bias if config.position_encoding == "pape_ri" else pape_bias
    return fn(z, encoder, positions_q, positions_k, config)


def bam_alpha_beta(theta_alpha: Value, theta_beta: Value):
    """double (alpha, beta), each (H,): alpha = exp(-theta_beta * theta_alpha), beta = theta_beta."""
    ta, tb = _double(theta_alpha), _double(theta_beta)
    return ta.body.op("Exp", ta.body.op("Neg", tb * ta)), tb


def bam_bias(encoder: dict, positions_q: Value, positions_k: Value, config) -> Value:
    """float32 (batch | 1, heads, seq_q, seq_k): -(|p_j - alpha_h p_i - mu_h| + eps) ** beta_h in
    double, floored at the spec's BAM_FLOOR, cast once; mu: theta_mu, or the spec's bam_mu."""
    g = positions_q.body
    alpha, beta = bam_alpha_beta(encoder["theta_alpha"], encoder["theta_beta"])
    mu = _double(encoder["theta_mu"]) if config.bam_learn_mu else g.const(bam_mu(encoder, config), np.float64)
    per_head = lambda a: g.op("Unsqueeze", a, g.ints(1, 2))  # noqa: E731  (H,) -> (H, 1, 1)
    pq = g.op("Unsqueeze", _double(positions_q), g.ints(1, 3))
    pk = g.op("Unsqueeze", _double(positions_k), g.ints(1, 2))
    gap = g.op("Abs", g.op("Sub", g.op("Sub", pk, per_head(alpha) * pq), per_head(mu)))
    power = g.op("Pow", gap + g.const(config.bam_eps, np.float64), per_head(beta))
    return _float(g.op("Max", g.op("Neg", power), g.const(BAM_FLOOR, np.float64)))


def ssmax_lengths(positions_q: Value, positions_k: Value, config, seq_len: Value) -> Value:
    """int64 SSMax's n per query (the spec's rule, config.ssmax_length): decoder, (batch | 1,
    seq_q); the padded rule and the encoder, (1, 1) and (batch | 1, 1), the same for every query."""
    g = positions_q.body
    if config.ssmax_length == "padded":
        return g.op("Reshape", seq_len, g.ints(1, 1))
    if config.mode == "decoder":
        return positions_q + 1
    # the last key's position, (batch | 1, 1): the Reshape (0: dimension 0 as it is) states the 1,
    # which a compiler that takes an unknown dimension as never broadcasting (IREE's ONNX import) needs
    last = g.op("Slice", positions_k, g.ints(-1), g.ints(np.iinfo(np.int64).max), g.ints(1))
    return g.op("Reshape", last, g.ints(0, 1)) + 1


def ssmax_factor(s: Value, lengths: Value) -> Value:
    """float32 (batch | 1, heads, seq_q | 1, 1): s_h * ln(max(n, 1)), the ln in double, cast once."""
    g = s.body
    log_n = _float(g.op("Log", _double(g.op("Max", lengths, g.const(1, np.int64)))))
    return g.op("Unsqueeze", s, g.ints(0, 2, 3)) * g.op("Unsqueeze", log_n, g.ints(1, 3))


def ssmax_bias(bias: Value, factor: Value) -> Value:
    """The score bias times SSMax's factor."""
    return bias * factor


def ssmax_queries(q: Value, factor: Value) -> Value:
    """q (batch, seq_q, heads, head_dim) times the factor (batch | 1, heads, seq_q | 1, 1)."""
    return q * q.body.op("Transpose", factor, perm=[0, 2, 1, 3])

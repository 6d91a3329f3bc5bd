"""BitLinear as ONNX nodes; port of ode_ref/bitlinear.py.

The weights are quantised once, at export, with the spec's own function (ternarize_weight in
float32): the file stores W's ternary values transposed, as int8. Activations are quantised in
the graph at every evaluation, as the spec does. Two forms of the product (export_model's
`bitlinear`):

float (default): the file also stores the float32 scale w_s; the graph computes W_q^T =
ternary^T / w_s once, before the steps, and every projection is a float MatMul of x_q = levels /
a_s with it, as the spec writes it.

integer: every projection is an integer product, exact, then one float scale per token:

    y = (levels @ ternary^T) * (m * c),   m = max(max|x_n|, eps) (per token),  c = 1 / (127 w_s)

which is the spec's y = (levels / a_s) @ (ternary / w_s)^T with a_s = 127 / m. The levels go to
MatMulInteger as uint8 (levels + 128) with zero point 128, against the int8 ternary^T: ONNX
Runtime's CPU kernel takes int8 x int8 too, but on x86 that combination runs about 7x slower than
uint8 x int8 (a 4096 x 512 x 512 product), and both are exact. The file stores c (a float32
scalar per projection, no w_s) and no float copy of W.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ode_ref.bitlinear import ACT_MAX, QUANT_EPS, weight_scale

from .graph import Value
from .norms import layer_norm

ZERO_POINT = 128  # int8 levels -128..127 as uint8 0..255
MAX_INTEGER_WIDTH = 2**24 // 128  # |levels @ ternary^T| <= 128 * width: exact in int32 and in float32 below 2^24


def check_form(bitlinear, config) -> None:
    """ValueError naming `bitlinear` unless its form applies to this config: 'integer' only for a
    BitLinear block (use_bitnet) whose products stay exact in float32 (width <= MAX_INTEGER_WIDTH).
    Which forms there are is export.options' BITLINEAR_FORMS, checked when the options are built."""
    if bitlinear == "integer" and not config.use_bitnet:
        raise ValueError("bitlinear: 'integer' runs BitLinear's projections as integer kernels; expected a config "
                         "with use_bitnet=true; got use_bitnet=false")
    if bitlinear == "integer" and config.hidden_size > MAX_INTEGER_WIDTH:
        raise ValueError(f"bitlinear: 'integer' needs hidden_size <= {MAX_INTEGER_WIDTH} (its int32 sums, up to "
                         f"128 x hidden_size, must convert to float32 exactly); got {config.hidden_size}")


def product_scale(w) -> np.float32:
    """c = 1 / (127 w_s) for the weight w (out, in): the integer form's scale of the product,
    before the per-token factor m. Computed from w in float64 with the spec's weight_scale and
    rounded to float32 once: one rounding of max(mean|W|, eps) / 127 for the weights the file
    was exported from (the float form's w_s carries the float32 mean's own error besides)."""
    return np.float32(1.0 / (ACT_MAX * weight_scale(np.asarray(w, np.float64))))


def quantize_weight(ternary_t: Value, scale: Value) -> Value:
    """W_q^T = float(ternary^T) / w_s, (in, out): the ternary values and w_s come from the spec's
    ternarize_weight at export time (export.block)."""
    return ternary_t.body.op("Cast", ternary_t, to=TensorProto.FLOAT) / scale


def _scaled(x: Value, *, width: int):
    """(x_n a_s, a_s, m = max(max|x_n|, eps)), per token: what both forms round to levels."""
    g = x.body
    x_n = layer_norm(x, g.const(np.ones(width)), g.const(np.zeros(width)))
    m = g.op("Max", g.reduce("ReduceMax", g.op("Abs", x_n)), g.const(QUANT_EPS))
    scale = ACT_MAX / m
    return x_n * scale, scale, m


def quantize_activation(x: Value, *, width: int) -> Value:
    g = x.body
    v, scale, _ = _scaled(x, width=width)
    return g.op("Clip", g.op("Round", v), g.const(-128.0), g.const(127.0)) / scale


def integer_levels(x: Value, *, width: int):
    """(levels + 128 as uint8, m (..., 1) float32): the integer form's quantised input, computed
    once for every product that reads x. One QuantizeLinear with scale 1 and zero point 128 is
    saturate(round(v) + 128) to 0..255, round half to even: exactly clip(round(v), -128, 127) +
    128, without the float passes of Round, Clip, Add and Cast."""
    g = x.body
    v, _, m = _scaled(x, width=width)
    return g.op("QuantizeLinear", v, g.const(1.0), g.const(ZERO_POINT, np.uint8)), m


def integer_product(levels_u8: Value, ternary_t: Value, m: Value, c: Value) -> Value:
    """levels_u8, m: from integer_levels, ternary_t: (in, out) int8, c: the product's scale (a
    scalar) -> (..., out) float32.

    Where it rounds: MatMulInteger sums (levels_u8 - 128) * ternary in int32, exactly; the Cast to
    float32 is exact (|sum| <= 128 * in < 2^24, check_form); so y = sum * (m * c) rounds three
    times, each at most half an ulp: c (once, at export: product_scale), m * c and the product.
    m itself is computed as the float form computes it. The spec's float32 run rounds levels /
    a_s and ternary / w_s per element and every partial sum of the product besides.

    ONNX Runtime fuses out_proj's MatMulInteger, Cast and Mul into one MatMulIntegerToFloat, which
    rounds sum * c, then that times m: three roundings as well. The q, k, v products share one m * c
    (its common-subexpression elimination merges their three), which that fusion does not take: they
    run as written. Fused, a product of the large bench shape (4096 x 512 x 512) takes about 10%
    less time."""
    g = levels_u8.body
    acc = g.op("MatMulInteger", levels_u8, ternary_t, g.const(ZERO_POINT, np.uint8))
    return g.op("Cast", acc, to=TensorProto.FLOAT) * (m * c)


def integer_bitlinear(x: Value, ternary_t: Value, c: Value, *, width: int) -> Value:
    """x: (..., in), ternary_t: (in, out) int8, c: the product's scale -> (..., out)."""
    levels, m = integer_levels(x, width=width)
    return integer_product(levels, ternary_t, m, c)


def bitlinear(x: Value, w_q_t: Value, *, width: int) -> Value:
    """x: (..., in), w_q_t: (in, out) quantised and transposed -> (..., out)."""
    return x.body.op("MatMul", quantize_activation(x, width=width), w_q_t)


def linear(x: Value, w_t: Value) -> Value:
    """x: (..., in), w_t: (in, out) -> (..., out); no bias."""
    return x.body.op("MatMul", x, w_t)

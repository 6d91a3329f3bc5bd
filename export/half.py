"""Half precision in the export: ode_ref.precision's policy over the export's stages.

A block exported in a storage dtype S (float16 or bfloat16) stores its parameters as S
initializers (BitLinear's int8 ternary weights and float32 scales as they are: the scales are
float32 in the policy) and computes in float32 between the policy's rounding points, each a
Cast to S then a Cast back to float32 (MixedPrecision's to_storage). Its input x and output z are
typed S; with keep_io_types they are float32, x rounded to S on entry and z(1) on exit.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ode_ref.precision import MixedPrecision, round_to

from .graph import Body, Value
from .options import check_export_dtype

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of an export dtype: float16 is NumPy's, bfloat16 ml_dtypes'."""
    if check_export_dtype(dtype) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def stored_params(params: dict, dtype: str) -> dict:
    """params rounded to dtype (float32 arrays holding dtype values), what the export derives its
    initializers from: BitLinear ternarises the rounded weights, as the spec's policy does."""
    return {k: round_to(v, dtype) for k, v in params.items()}


def as_storage(initializers: dict, dtype: str, exact) -> dict:
    """The initializers in dtype, except those named in exact (int8 ternary weights, BitLinear's
    float32 scales) and the integer ones, kept as they are. Values are already dtype values."""
    half = numpy_dtype(dtype)
    return {k: v if k in exact or v.dtype.kind != "f" else v.astype(half) for k, v in initializers.items()}


class HalfIO:
    """How a block model meets its caller in `dtype`: the io element type, x on entry (a float32
    Value holding dtype values) and a state on exit (rounded to dtype, in the io type). float32:
    the export as it was, no node added. dtype and keep_io_types: an ExportOptions's, which
    checked them (export.options)."""

    def __init__(self, dtype: str = "float32", keep_io_types: bool = False):
        self.dtype, self.keep_io_types = dtype, keep_io_types
        self.half = self.dtype != "float32"
        self.elem = ONNX_TYPES["float32" if keep_io_types else self.dtype]

    def entry(self, main: Body, x: Value) -> Value:
        if not self.half:
            return x
        if self.keep_io_types:
            x = main.op("Cast", x, to=ONNX_TYPES[self.dtype])
        return main.op("Cast", x, to=TensorProto.FLOAT)

    def exit(self, main: Body, value: Value) -> Value:
        if not self.half:
            return value
        value = main.op("Cast", value, to=ONNX_TYPES[self.dtype])
        return main.op("Cast", value, to=TensorProto.FLOAT) if self.keep_io_types else value


class ExportMixedPrecision(MixedPrecision):
    """The policy over the export's SelfAttention: to_storage is Cast(to S) then Cast(to float32);
    a parameter stored as an S initializer needs the second Cast only, and the exact ones (int8
    ternary weights, float32 BitLinear scales) none. A tuple (W_qkv's blocks) is rounded per item."""

    stored: frozenset = frozenset()  # the S initializers' names
    exact: frozenset = frozenset()  # initializers kept as they are

    def to_storage(self, a):
        if isinstance(a, tuple):
            return tuple(self.to_storage(v) for v in a)
        g = a.body
        if a.name in self.exact:
            return a
        if a.name not in self.stored:
            a = g.op("Cast", a, to=ONNX_TYPES[self.storage])
        return g.op("Cast", a, to=TensorProto.FLOAT)


def half_export_attention(attention, storage: str, stored, exact):
    """The export's attention (block.export_attention's: the spec's stages or a variant's) under
    the policy in storage; stored, exact: initializer names (ExportMixedPrecision)."""
    cls = type(f"Half{type(attention).__name__}", (ExportMixedPrecision, type(attention)), {})
    half = cls.__new__(cls)
    half.__dict__.update(vars(attention), storage=storage, stored=frozenset(stored), exact=frozenset(exact))
    return half

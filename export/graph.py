"""A small builder for ONNX graphs and local functions, with symbolic values.

A Value is a name in a Body (the main graph or a local function's body). Values support
``a + b``, ``a - b``, ``a * b`` and ``float * a`` (an int constant is int64: ``index + 1``), which is all ode_ref.rk.rk_step needs: the exported
solver is the spec's stepper run on symbolic values. Every other node is made with
``body.op("OpType", *inputs, **attributes)``; scalar constants become Constant nodes (deduplicated
per body), so a local function's body is self-contained.
"""

from __future__ import annotations

import itertools

import numpy as np
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class Value:
    __slots__ = ("body", "name")

    def __init__(self, body: "Body", name: str):
        self.body, self.name = body, name

    def _lift(self, other):
        """A Value, or a constant: float32 for a float, int64 for a Python int (an index)."""
        if isinstance(other, Value):
            return other
        return self.body.const(other, np.int64 if isinstance(other, int) and not isinstance(other, bool) else np.float32)

    def __add__(self, other):
        return self.body.op("Add", self, self._lift(other))

    __radd__ = __add__

    def __sub__(self, other):
        return self.body.op("Sub", self, self._lift(other))

    def __rsub__(self, other):
        return self.body.op("Sub", self._lift(other), self)

    def __mul__(self, other):
        return self.body.op("Mul", self, self._lift(other))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self.body.op("Div", self, self._lift(other))

    def __rtruediv__(self, other):
        return self.body.op("Div", self._lift(other), self)


class Body:
    """Nodes of the main graph or of one local function, with fresh names and constants."""

    def __init__(self, prefix: str, opset: int):
        self.prefix, self.opset = prefix, opset
        self._ids = itertools.count()  # per body: the same export gives the same names, and bytes
        self.nodes: list = []
        self._consts: dict = {}

    def fresh(self, hint: str) -> str:
        return f"{self.prefix}{hint}_{next(self._ids)}"

    def op(self, op_type: str, *inputs, outputs: int = 1, **attrs):
        """Add a node; returns a Value (or a tuple of Values when outputs > 1)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        ins = ["" if v is None else v.name for v in inputs]
        self.nodes.append(helper.make_node(op_type, ins, names, name=names[0], **attrs))
        vals = tuple(Value(self, n) for n in names)
        return vals if outputs > 1 else vals[0]

    def const(self, value, dtype=np.float32) -> Value:
        """A Constant node holding value (a scalar or an array), made once per body and value."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh("const")
            self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(arr, name)))
            self._consts[key] = Value(self, name)
        return self._consts[key]

    def ints(self, *values) -> Value:
        return self.const(list(values), np.int64)

    def reduce(self, op_type: str, x: Value, axis: int = -1) -> Value:
        """op_type over one axis, keepdims; axes is an attribute before opset 18 (ReduceSum: 13)."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, x, self.ints(axis), keepdims=1)
        return self.op(op_type, x, axes=[axis], keepdims=1)


class Function(Body):
    """A local function: body(inputs...) -> outputs, called from other bodies by name."""

    DOMAIN = "odeattn"

    def __init__(self, name: str, input_names, opset: int):
        super().__init__(prefix="", opset=opset)
        self.name = name
        self.inputs = [Value(self, n) for n in input_names]
        self.outputs: list = []

    def proto(self):
        return helper.make_function(
            self.DOMAIN, self.name, [v.name for v in self.inputs], [v.name for v in self.outputs],
            self.nodes, [helper.make_opsetid("", self.opset), helper.make_opsetid(self.DOMAIN, 1)],
        )

    def call(self, body: Body, *inputs):
        """A node in `body` calling this function (unnamed: it repeats once per step)."""
        name = body.fresh("s")
        body.nodes.append(helper.make_node(self.name, [v.name for v in inputs], [name], domain=self.DOMAIN))
        return Value(body, name)

"""A small builder for ONNX graphs and local functions, with symbolic values.

A Value is a name in a Body (the main graph or a local function's body). Values support
``a + b``, ``a - b``, ``a * b`` and ``float * a`` (an int constant is int64: ``index + 1``), which is all ode_ref.rk.rk_step needs: the exported
solver is the spec's stepper run on symbolic values. Every other node is made with
``body.op("OpType", *inputs, **attributes)``; scalar constants become Constant nodes (deduplicated
per body), so a local function's body is self-contained.

For a variant's stages (ode_ref/variants.py) a Value also answers the other operators (/ ** abs,
comparisons, & | ~), the NumPy functions of ELEMENTWISE and REDUCTIONS (np.sqrt(v), np.where(c,
a, b), v.sum(axis=-1, keepdims=True), called directly or through the namespace XP), and refuses
any other NumPy function by name (NotImplementedError).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class Value:
    __slots__ = ("body", "name")

    def __init__(self, body: "Body", name: str):
        self.body, self.name = body, name

    def _lift(self, other):
        """A Value, or a constant: float32 for a float (and float arrays), int64 for a Python int
        (an index), bool for a bool."""
        if isinstance(other, Value):
            return other
        kind = np.asarray(other).dtype.kind
        return self.body.const(other, np.int64 if kind in "iu" else np.bool_ if kind == "b" else np.float32)

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

    # ---- for a variant's stages: the other operators, and NumPy's functions -------------------
    def __pow__(self, other):
        return self.body.op("Pow", self, self._lift(other))

    def __neg__(self):
        return self.body.op("Neg", self)

    def __abs__(self):
        return self.body.op("Abs", self)

    def __invert__(self):
        return self.body.op("Not", self)

    def __lt__(self, other):
        return self.body.op("Less", self, self._lift(other))

    def __le__(self, other):
        return self.body.op("LessOrEqual", self, self._lift(other))

    def __gt__(self, other):
        return self.body.op("Greater", self, self._lift(other))

    def __ge__(self, other):
        return self.body.op("GreaterOrEqual", self, self._lift(other))

    def __eq__(self, other):  # a graph value compares elementwise, as an array does
        return self.body.op("Equal", self, self._lift(other))

    def __ne__(self, other):
        return self.body.op("Not", self.body.op("Equal", self, self._lift(other)))

    __hash__ = object.__hash__  # still a dict key by identity

    def __and__(self, other):
        return self.body.op("And", self, self._lift(other))

    __rand__ = __and__

    def __or__(self, other):
        return self.body.op("Or", self, self._lift(other))

    __ror__ = __or__

    def sum(self, axis=None, keepdims=False):
        return apply("sum", self, axis=axis, keepdims=keepdims)

    __iter__ = None  # not iterable (as before __getitem__): unpacking a Value is a TypeError

    def __getitem__(self, key):
        """v[:, None, :, None]: new axes (Unsqueeze) between whole ones; any other index is refused."""
        key = key if isinstance(key, tuple) else (key,)
        if not all(k is None or k == slice(None) for k in key):
            raise NotImplementedError(f"indexing by {key!r}: this export takes only ':' and None")
        axes = [i for i, k in enumerate(key) if k is None]
        return self if not axes else self.body.op("Unsqueeze", self, self.body.ints(*axes))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """np.sqrt(v), ndarray * v, ...: the ufunc as its ONNX op, or refused by name."""
        if method != "__call__" or kwargs:
            raise NotImplementedError(f"np.{ufunc.__name__}.{method}: has no ONNX form in this export")
        return apply(ufunc.__name__, *inputs)

    def __array_function__(self, func, types, args, kwargs):
        """np.where(c, a, b), np.sum(v, axis=...): as ONNX ops, or refused by name."""
        return apply(func.__name__, *args, **kwargs)


# NumPy's name -> the ONNX op, for the functions a variant may call on Values
ELEMENTWISE = {
    "add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "true_divide": "Div", "power": "Pow",
    "negative": "Neg", "abs": "Abs", "absolute": "Abs", "sqrt": "Sqrt", "exp": "Exp", "log": "Log", "tanh": "Tanh",
    "maximum": "Max", "minimum": "Min", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
    "greater_equal": "GreaterOrEqual", "equal": "Equal", "logical_and": "And", "bitwise_and": "And",
    "logical_or": "Or", "bitwise_or": "Or", "logical_not": "Not", "invert": "Not", "where": "Where",
}
REDUCTIONS = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "amax": "ReduceMax", "min": "ReduceMin", "amin": "ReduceMin"}


def ir_version(opsets) -> int:
    """The oldest IR version the opsets allow (8 at least: model-local functions), not the onnx
    package's newest, so that every runtime that reads the opset loads the file."""
    return max(8, helper.find_min_ir_version_for(opsets, ignore_unknown=True))


def apply(name: str, *args, axis=None, keepdims=False):
    """The NumPy function `name` on Values (and constants) as ONNX nodes. NotImplementedError
    naming the function if it has no entry in ELEMENTWISE or REDUCTIONS. A reduction's axis may
    be given by position too: np.sum(v, -1)."""
    if name in REDUCTIONS and len(args) == 2 and axis is None:
        args, axis = args[:1], args[1]
    values = [a for a in args if isinstance(a, Value)]
    if name in REDUCTIONS and len(args) == 1 and values:
        body, x = values[0].body, values[0]
        axes = [] if axis is None else list(axis) if isinstance(axis, (tuple, list)) else [axis]
        if name == "sum" or body.opset >= 18:
            out = body.op(REDUCTIONS[name], x, body.ints(*axes) if axes else None, keepdims=int(keepdims))
        else:
            out = body.op(REDUCTIONS[name], x, keepdims=int(keepdims), **({"axes": axes} if axes else {}))
        return out
    if name not in ELEMENTWISE or not values or (name not in REDUCTIONS and (axis is not None or keepdims)):
        known = ", ".join(sorted({*ELEMENTWISE, *REDUCTIONS}))
        raise NotImplementedError(f"np.{name}: has no ONNX form in this export (it has: {known})")
    body = values[0].body
    return body.op(ELEMENTWISE[name], *(values[0]._lift(a) for a in args))


class _Namespace:
    """XP: the export's array namespace (SelfAttention.xp): XP.sqrt(v), XP.sum(v, axis=-1, keepdims=True).
    The graph computes in float32: astype casts to it (or to int64, bool), asarray makes a constant."""

    @staticmethod
    def astype(v: Value, dtype) -> Value:
        return v.body.op("Cast", v, to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    @staticmethod
    def asarray(value, dtype=None) -> np.ndarray:
        """A constant as NumPy holds it: an operation with a Value lifts it into the graph."""
        return np.asarray(value, dtype=dtype)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in ELEMENTWISE and name not in REDUCTIONS:
            raise NotImplementedError(f"xp.{name}: has no ONNX form in this export")
        return lambda *args, **kwargs: apply(name, *args, **kwargs)


XP = _Namespace()


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
            if arr.shape == () and arr.dtype == np.float32:  # value_float: a few bytes, not a named tensor
                self.nodes.append(helper.make_node("Constant", [], [name], value_float=float(arr)))
            else:
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


def inline(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with every local function call replaced by the function's nodes (onnx.inliner),
    metadata kept, form: inlined. export_model's default form (export.block); deploy.inline."""
    from onnx.inliner import inline_local_functions

    out = inline_local_functions(model)
    onnx.helper.set_model_props(out, {**{p.key: p.value for p in model.metadata_props}, "form": "inlined"})
    # a constant fed to a function input the body never reads (f's time, where no stage reads t) is
    # left unread once inlined: dropped, so that no runtime warns of an unused initializer
    read = {name for node in out.graph.node for name in node.input} | {o.name for o in out.graph.output}
    kept = [n for n in out.graph.node if n.op_type != "Constant" or any(o in read for o in n.output)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out

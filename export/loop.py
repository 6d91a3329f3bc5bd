"""The Loop form of the block: one ONNX file for any number of steps (export_model's steps_input).

    inputs:  x, padding_mask as the default form; steps int64 [] (default: the config's
             ode_steps, an initializer of the same name, so a feed may leave it out), clamped
             to [1, MAX_STEPS] by the graph (step_count); runtime.check_steps refuses others
    output:  z float32 [batch, seq, d_model] = z(1) after `steps` steps of size 1 / steps

The main graph holds the parameters, the mask and the positions (prepared once, as in the default
form), dt = 1 / steps (in double) and one Loop node whose trip count is `steps`. Its body is one
step: ode_ref.rk.rk_step run on symbolic values, each stage's evaluation of f written out in the
body (no local functions), reading the weights and the prepared values from the outer graph by
name. The file and the session's creation therefore cost the same at every step count.

The step's scalars are what the spec computes as Python floats, in float64: t_k = k / steps, the
stage times t_k + c_i dt and the factors dt a_ij and dt b_i, each rounded to float32 once where it
meets a state (Scalar), as NumPy rounds a Python float meeting a float32 array.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ode_ref.config import MAX_STEPS

from .graph import Body, Value

STEPS = "steps"  # the trip count's input and initializer
BODY = "step/"  # the prefix of every name in the Loop's body: none shadows an outer one


class Scalar:
    """A double scalar Value: a step time or size. Scalar * float and Scalar + Scalar stay double;
    Scalar * Value (a float32 tensor) casts the scalar to float32 first; as_float() is that cast."""

    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value

    def _double(self, other) -> Value:
        return other.value if isinstance(other, Scalar) else self.value.body.const(other, np.float64)

    def as_float(self) -> Value:
        return self.value.body.op("Cast", self.value, to=TensorProto.FLOAT)

    def __add__(self, other):
        return Scalar(self.value.body.op("Add", self.value, self._double(other)))

    __radd__ = __add__

    def __mul__(self, other):
        if isinstance(other, Value):
            return self.as_float() * other
        return Scalar(self.value.body.op("Mul", self.value, self._double(other)))

    __rmul__ = __mul__


def steps_initializer(default: int):
    """The steps input's default, an int64 scalar initializer named as the input."""
    return numpy_helper.from_array(np.array(default, np.int64), STEPS)


def steps_info():
    return helper.make_tensor_value_info(STEPS, TensorProto.INT64, [])


def step_count(main: Body) -> tuple[Value, Value]:
    """(the trip count, int64, and the same as a double), once in the main graph: the steps input
    clamped to [1, MAX_STEPS]. ONNX has no operator that fails a run, so the graph clamps what
    it is fed (0 or less takes one step, more than MAX_STEPS takes MAX_STEPS) and every runner of
    the project refuses such a value before the run (export.runtime.check_steps)."""
    trip = main.op("Clip", Value(main, STEPS), main.const(1, np.int64), main.const(MAX_STEPS, np.int64))
    return trip, main.op("Cast", trip, to=TensorProto.DOUBLE)


def step_size(steps_double: Value) -> Value:
    """dt = 1 / steps (double), once in the main graph."""
    return steps_double.body.op("Div", steps_double.body.const(1.0, np.float64), steps_double)


def outer(body: Body, value: Value) -> Value:
    """An outer graph's value as the body reads it: by its name."""
    return Value(body, value.name)


def step_time(body: Body, k: Value, steps_double: Value) -> Scalar:
    """t_k = k / steps, double, from the iteration number k (int64)."""
    return Scalar(body.op("Div", body.op("Cast", k, to=TensorProto.DOUBLE), outer(body, steps_double)))


def loop_over_steps(main: Body, x: Value, make_step, state_dims, *, trip: Value, trajectory: bool = False):
    """z after `trip` (step_count) iterations of make_step(body, k, z) -> the next z, a Loop node in main
    from z = x; with trajectory, also the state after each step, [steps, *state_dims] (a scan
    output). Returns (z, trajectory or None)."""
    body = Body(BODY, main.opset)
    k, cond, z = (Value(body, BODY + name) for name in ("k", "cond", "z"))
    z_next = make_step(body, k, z)
    body.nodes.append(helper.make_node("Identity", [cond.name], [BODY + "cond_out"], name=BODY + "cond_out"))
    body.nodes.append(helper.make_node("Identity", [z_next.name], [BODY + "z_out"], name=BODY + "z_out"))
    state = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, state_dims)  # noqa: E731
    outputs = [helper.make_tensor_value_info(BODY + "cond_out", TensorProto.BOOL, []), state(BODY + "z_out")]
    if trajectory:
        body.nodes.append(helper.make_node("Identity", [z_next.name], [BODY + "scan"], name=BODY + "scan"))
        outputs.append(state(BODY + "scan"))
    graph = helper.make_graph(body.nodes, "ode_step", [helper.make_tensor_value_info(k.name, TensorProto.INT64, []),
                                                       helper.make_tensor_value_info(cond.name, TensorProto.BOOL, []),
                                                       state(z.name)], outputs)
    out = main.op("Loop", trip, main.const(True, np.bool_), x, outputs=1 + trajectory, body=graph)
    return (out[0], out[1]) if trajectory else (out, None)

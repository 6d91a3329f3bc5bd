"""The export's positional terms at the level of one function: its softplus (PaPE's a(i)), run in
ONNX Runtime and ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from odeattn.export.graph import Body, Value
from odeattn.export.positions import softplus

ort = pytest.importorskip("onnxruntime")


def test_softplus_is_accurate_far_below_zero_where_it_is_about_exp_x():
    """log(1 + exp(x)) within 8 float32 roundings of float64's at every x from -87 (exp(x) still a
    normal float32) to 100. The measured worst is 5.8 (the reference evaluator; 5.1 in ONNX
    Runtime; NumPy's float32 logaddexp 1.9): exp, log, a division and a product, each rounded, and
    8 the next power of two. Log(1 + exp(x)) alone is 0 below x = -17, where 1 + exp(x) rounds to
    1: the whole value lost (a fuzz finding: pape_ri with SSMax at x = 100 N(0, 1) was 39 times the
    spec's own float32 error at f0)."""
    g = Body("", 17)
    out = softplus(Value(g, "x"))
    graph = helper.make_graph(g.nodes, "softplus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(out.name, TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    x = np.concatenate([np.linspace(-87, 100, 18701), -np.logspace(-30, np.log10(87), 601),
                        np.logspace(-30, 2, 601), [0.0]]).astype(np.float32)
    want = np.logaddexp(0.0, x.astype(np.float64))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got in (session.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0]):
        assert got.dtype == np.float32 and np.max(np.abs(got - want) / want) <= 8 * 2.0**-24

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def bfloat16_tanh():
    """make(path=None) -> a model x bfloat16 [batch, seq, 8] -> z = Tanh(x) in bfloat16 (saved at
    path if given): an operator ONNX Runtime's CPU provider has no bfloat16 kernel for (nor MatMul,
    Add, Exp, Sqrt: measured, ONNX Runtime 1.32), where a half export computes in float32."""
    def make(path=None):
        import onnx
        from onnx import TensorProto, helper

        vi = helper.make_tensor_value_info
        graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["z"])], "g", [vi("x", TensorProto.BFLOAT16, ["b", "t", 8])],
                                  [vi("z", TensorProto.BFLOAT16, ["b", "t", 8])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        if path is not None:
            onnx.save(model, path)
        return model
    return make

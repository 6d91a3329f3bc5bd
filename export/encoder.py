"""The ODE Transformer's encoder stack as one ONNX model; port of ode_ref/encoder.py.

    inputs:  x float32 [batch, seq, C]; padding_mask bool [batch, seq], True = real token (unless omitted)
    output:  z float32 [batch, seq, C]

The layer, block and stack are the spec's own code (ode_ref.encoder.ODEEncoderStages) run on
symbolic values (export/graph.py); this file supplies the primitives as ONNX nodes. Every layer
evaluation is written out in the main graph (stages x layers of them); the parameters are
initializers under the released state_dict keys, stored once, in float32 (those the graph reads). The model's metadata
holds the config (encoder_config). run_encoder_model feeds it after the spec's input checks.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ode_ref as R
from ode_ref.block import check_flag
from ode_ref.encoder import ODEEncoderStages, check_encoder_input
from ode_ref.encoder_config import ODEEncoderConfig

from . import runtime
from .attention import causal_mask
from .graph import Body, Value, ir_version
from .norms import layer_norm

OPSET = 17


class OnnxEncoderStages(ODEEncoderStages):
    """The spec's stages with ONNX primitives on graph Values."""

    def key_mask(self, padding_mask):
        return None if padding_mask is None else padding_mask.body.op("Unsqueeze", padding_mask, padding_mask.body.ints(1, 2))

    def fill_padded_keys(self, scores, key_mask):
        g = scores.body
        return scores if key_mask is None else g.op("Where", key_mask, scores, g.const(-np.inf))

    def hold_padded_values(self, v, key_mask):
        g = v.body
        if key_mask is None:
            return v
        seen = g.op("Cast", g.reduce("ReduceMax", g.op("Cast", key_mask, to=TensorProto.INT32), -2), to=TensorProto.BOOL)
        return g.op("Where", self.transpose_last(seen), v, g.const(0.0))

    def split_qkv(self, qkv):
        c = self.config.encoder_embed_dim
        return qkv.body.op("Split", qkv, qkv.body.ints(c, c, c), axis=-1, outputs=3)

    def item(self, a, i: int):
        return a.body.op("Gather", a, a.body.const(i, np.int64), axis=0)

    def linear(self, x, weight, bias):
        g = x.body
        return g.op("MatMul", x, g.op("Transpose", weight, perm=[1, 0])) + bias

    def layer_norm(self, x, weight, bias):
        return layer_norm(x, weight, bias)

    def softmax(self, scores):
        return scores.body.op("Softmax", scores, axis=-1)

    def relu(self, x):
        return x.body.op("Relu", x)

    def matmul(self, a, b):
        return a.body.op("MatMul", a, b)

    def transpose_last(self, a):
        return a.body.op("Transpose", a, perm=[0, 1, 3, 2])

    def split_heads(self, a):
        g, cfg = a.body, self.config
        heads = g.op("Reshape", a, g.ints(0, 0, cfg.encoder_attention_heads, cfg.head_dim))  # (batch, seq, heads, head_dim)
        return g.op("Transpose", heads, perm=[0, 2, 1, 3])

    def merge_heads(self, a):
        g = a.body
        return g.op("Reshape", g.op("Transpose", a, perm=[0, 2, 1, 3]), g.ints(0, 0, self.config.encoder_embed_dim))

    def sigmoid(self, x):
        return x.body.op("Sigmoid", x)

    def concat(self, a, b):
        return a.body.op("Concat", a, b, axis=-1)

    def constant(self, value, like):
        return like.body.const(value)

    def reshape(self, a, shape):
        return a.body.op("Reshape", a, a.body.ints(*shape))

    def causal_triangle(self, x):
        return causal_mask(x.body.op("Shape", x, start=1, end=2))


def export_encoder_model(config, params, *, padding_mask: bool = True) -> onnx.ModelProto:
    """The encoder stack for (config, params) as an onnx.ModelProto (float32, opset 17)."""
    padding_mask = check_flag("padding_mask", padding_mask)
    cfg = ODEEncoderConfig.from_any(config)
    R.check_encoder_params(params, cfg)
    main = Body("", OPSET)
    x = Value(main, "x")
    mask = Value(main, "padding_mask") if padding_mask else None
    weights = {name: Value(main, name) for name in params}
    z = OnnxEncoderStages(cfg).encoder(weights, x, mask)
    main.nodes.append(helper.make_node("Identity", [z.name], ["z"]))
    c = cfg.encoder_embed_dim
    read = {name for node in main.nodes for name in node.input}  # post-norm, PCformer's W and LNp are never read
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", c])]
    if padding_mask:
        inputs.append(helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, ["batch", "seq"]))
    graph = helper.make_graph(
        main.nodes, "ode_encoder", inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq", c])],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in params.items() if k in read])
    opsets = [helper.make_opsetid("", OPSET)]
    model = helper.make_model(graph, producer_name="odeattn", producer_version=R.__version__, opset_imports=opsets,
                              ir_version=ir_version(opsets))
    helper.set_model_props(model, {"odeattn_version": R.__version__, "encoder_config": json.dumps(cfg.to_dict(), sort_keys=True)})
    return model


def encoder_config(model: onnx.ModelProto) -> ODEEncoderConfig:
    """The config an encoder model was exported from (its metadata); ValueError if it has none."""
    props = {p.key: p.value for p in model.metadata_props}
    if "encoder_config" not in props:
        raise ValueError("model: expected an encoder model (metadata encoder_config, export_encoder_model's); it has none")
    return ODEEncoderConfig.from_any(json.loads(props["encoder_config"]))


def run_encoder_model(model: onnx.ModelProto, sess, x, padding_mask=None) -> np.ndarray:
    """z of an encoder model in an onnxruntime session (runtime.session), its inputs checked as the
    spec checks them (a sequence of no real token refused), then as the model declares them."""
    check_encoder_input(np.asarray(x), encoder_config(model), None if padding_mask is None else np.asarray(padding_mask))
    return runtime.run(model, sess, x, padding_mask, outputs=["z"])["z"]

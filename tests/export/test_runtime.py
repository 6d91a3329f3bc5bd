"""Running an exported block (export/runtime.py): the feed checked against the model's inputs, the
model file checked on loading, and onnx's reference evaluator agreeing with ONNX Runtime."""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402
from odeattn.export.block import export_model  # noqa: E402
from odeattn.export.runtime import ModelError, load_model, make_feed, run, run_reference, session  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", norm_type="dynamic_tanh", ode_steps=3), **kw})


def test_reference_evaluator_agrees_with_onnxruntime():
    c = cfg(use_bitnet=False, norm_type="derf", ode_solver="heun")
    model = export_model(c, R.init_params(c, 2, perturb_norms=True))
    x = np.random.default_rng(2).normal(size=(2, 5, 12)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], bool)
    assert relative_error(run_reference(model, x, mask)["z"], run(model, session(model), x, mask)["z"]) < 1e-5


X = np.zeros((1, 2, 12), np.float32)


@pytest.mark.parametrize("prepare, error, message", [
    pytest.param(lambda model: (model, np.zeros((1, 2, 12))),
                 TypeError, "x: expected dtype float32; got float64", id="float64-x"),
    pytest.param(lambda model: (model, np.zeros((1, 2, 10), np.float32)),
                 ValueError, r"x: expected shape \[batch, seq, 12\] with batch, seq >= 1; got \[1, 2, 10\]", id="x-of-another-width"),
    pytest.param(lambda model: (model, X, np.ones((1, 3), bool)),
                 ValueError, r"padding_mask: expected shape \[1, 2\] \(batch, seq\); got \[1, 3\]",
                 id="padding-mask-of-another-length"),
    pytest.param(lambda model: (model, X, np.ones((1, 2), np.int64)),
                 TypeError, "padding_mask: expected dtype bool; got int64", id="integer-padding-mask"),
    pytest.param(lambda model: (_renamed_input(model), X),
                 ValueError, r"model inputs: expected 'x'; the model declares \['input', 'padding_mask'\]", id="model-input-renamed"),
    pytest.param(lambda model: (export_model(cfg(), R.init_params(cfg()), padding_mask=False), X, np.ones((1, 2), bool)),
                 ValueError, "exported without a padding_mask input", id="mask-for-a-model-without-one"),
])
def test_feed_errors_name_the_input(prepare, error, message):
    """prepare(the exported block) -> (the model to feed, make_feed's arrays)."""
    c = cfg()
    model, *arrays = prepare(export_model(c, R.init_params(c)))
    with pytest.raises(error, match=message):
        make_feed(model, *arrays)


def _renamed_input(model):
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.input[0].name = "input"
    return renamed


def _junk(d):
    (d / "junk.onnx").write_bytes(b"\x08\x07garbage")
    return d / "junk.onnx"


def _truncated(d):
    c = cfg()
    (d / "t.onnx").write_bytes(export_model(c, R.init_params(c)).SerializeToString()[:500])
    return d / "t.onnx"


def _json_config(d):
    (d / "config.json").write_text(json.dumps(cfg().to_dict()))
    return d / "config.json"


def _invalid_graph(d):
    """A file that parses as a ModelProto but fails onnx.checker (a node of no known operator)."""
    graph = onnx.helper.make_graph([onnx.helper.make_node("NoSuchOp", ["x"], ["z"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                   [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    (d / "bad_graph.onnx").write_bytes(model.SerializeToString())
    return d / "bad_graph.onnx"


@pytest.mark.parametrize("make_file, message", [
    pytest.param(lambda d: d / "none.onnx", "model: no such file", id="missing-file"),
    pytest.param(_junk, "junk.onnx': not an ONNX model", id="not-onnx"),
    pytest.param(_truncated, "t.onnx': not an ONNX model", id="truncated-model"),
    pytest.param(_json_config, "config.json': not an ONNX model", id="json-config-given-as-the-model"),
    pytest.param(_invalid_graph, "bad_graph.onnx': not a valid ONNX model (ValidationError: ", id="model-failing-the-checker"),
])
def test_a_missing_or_corrupt_model_is_refused_in_one_line_naming_the_file(tmp_path, make_file, message):
    """One line naming the file: no protobuf or JSON parser's dump of what it read."""
    path = make_file(tmp_path)
    with pytest.raises(ModelError) as info:
        load_model(path)
    text = str(info.value)
    assert message in text and len(text.splitlines()) == 1, text
    assert "Available Fields" not in text and "Error parsing message" not in text


Y = np.zeros((2, 3, 12), np.float32)


def _feed(**changes):
    """A good feed of the prefill model of cfg(), with changes (None: left out)."""
    feed = {"x": Y, "padding_mask": np.ones((2, 3), bool), "max_len": np.array(3, np.int64), **changes}
    return {k: v for k, v in feed.items() if v is not None}


@pytest.mark.parametrize("feed, error, message", [
    pytest.param(_feed(x=np.zeros((2, 3, 10), np.float32)), ValueError, r"^x: expected shape \[batch, seq, 12\]; got \[2, 3, 10\]",
                 id="x-of-another-width"),
    pytest.param(_feed(x=Y.astype(np.float64)), TypeError, "^x: expected dtype float32; got float64", id="float64-x"),
    pytest.param(_feed(padding_mask=np.ones((2, 4), bool)), ValueError,
                 r"^padding_mask: expected shape \[batch, seq\] with seq = 3, as in x; got \[2, 4\]", id="mask-of-another-length"),
    pytest.param(_feed(padding_mask=np.ones((2, 3), np.int64)), TypeError, "^padding_mask: expected dtype bool; got int64",
                 id="integer-mask"),
    pytest.param(_feed(max_len=np.array([3])), ValueError, r"^max_len: expected shape \[\]; got \[1\]", id="max-len-not-a-scalar"),
    pytest.param(_feed(max_len=np.array(3, np.int32)), TypeError, "^max_len: expected dtype int64; got int32", id="int32-max-len"),
    pytest.param(_feed(x=np.zeros((0, 3, 12), np.float32), padding_mask=np.ones((0, 3), bool)), ValueError,
                 "^x: expected shape .* with batch >= 1; got \\[0, 3, 12\\]", id="empty-batch"),
    pytest.param(_feed(max_len=None), ValueError, "^max_len: the model takes this input", id="input-missing"),
    pytest.param(_feed(extra=Y), ValueError, "^extra: the model has no such input", id="input-unknown"),
])
def test_check_feed_names_the_input(feed, error, message):
    """The prefill and decode-step models' feeds (export.decode.OnnxDecoder) are checked against
    the model's declared inputs, as make_feed checks a block model's."""
    from odeattn.export.block import export_prefill_model
    from odeattn.export.runtime import check_feed, declared_inputs

    c = cfg()
    declared = declared_inputs(export_prefill_model(c, R.init_params(c)))
    assert check_feed(declared, _feed()).keys() == {"x", "padding_mask", "max_len"}
    with pytest.raises(error, match=message):
        check_feed(declared, feed)

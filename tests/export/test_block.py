"""The exported graph: validity, structure, shapes and masks (running it: test_runtime.py; the
torch.onnx route: test_from_torch.py).
(Agreement with the spec on every golden case runs in the main job, which CI runs whole (.ci/run)
and the suite on a sample (tests/odeattn/commands/test_conformance.py), through the onnxruntime,
onnxruntime-opset23 and onnx-reference backends.)"""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402
from odeattn.export.block import check, check_export, export_model  # noqa: E402
from odeattn.export.runtime import run, session  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", norm_type="dynamic_tanh", ode_steps=3), **kw})


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("norm", R.NORM_TYPES)
@pytest.mark.parametrize("bitnet", [False, True])
@pytest.mark.parametrize("mode", R.MODES)
def test_every_export_passes_the_checker_with_full_shape_inference(opset, norm, bitnet, mode):
    c = cfg(norm_type=norm, use_bitnet=bitnet, mode=mode, ode_solver="rk38")
    model = export_model(c, R.init_params(c, perturb_norms=True), opset=opset)
    check(model)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    out = inferred.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in out] == ["batch", "seq", 12]
    ops = {n.op_type for f in model.functions for n in f.node} | {n.op_type for n in model.graph.node}
    assert ("Attention" in ops) == (opset == 23)
    # norms are elementary nodes on x / s (exact for every finite float32), never the fused ops,
    # whose one epsilon per tensor cannot be eps / s^2 per token
    assert not ops & {"LayerNormalization", "RMSNormalization"}


def test_metadata_holds_the_config_and_each_weight_is_stored_once():
    c = cfg(use_bitnet=True, ode_steps=5)
    model = export_model(c, R.init_params(c, perturb_norms=True))
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["config"]) == c.to_dict() and meta["ode_solver"] == "rk4" and meta["odeattn_version"] == R.__version__
    inits = {i.name: i for i in model.graph.initializer}
    assert sorted(inits) == sorted([
        "ode_func.qkv.q_ternary_t", "ode_func.qkv.k_ternary_t", "ode_func.qkv.v_ternary_t", "ode_func.qkv.scale",
        "ode_func.out_proj.ternary_t", "ode_func.out_proj.scale", "ode_func.norm.alpha", "ode_func.norm.beta"])
    ternary = np.concatenate([onnx.numpy_helper.to_array(inits[f"ode_func.qkv.{b}_ternary_t"]) for b in "qkv"], axis=1)
    assert ternary.dtype == np.int8 and set(np.unique(ternary)) <= {-1, 0, 1} and ternary.shape == (12, 36)
    w = R.init_params(c, perturb_norms=True)["ode_func.qkv.weight"].astype(np.float32)
    np.testing.assert_array_equal(ternary.T, R.ternarize_weight(w)[0])  # the spec's quantisation, whole tensor
    assert sum(n.op_type == "ode_step" for n in export_model(c, R.init_params(c, perturb_norms=True), functions=True).graph.node) == 5


def test_the_functions_form_s_file_size_does_not_grow_with_steps():
    """With functions=True a step costs the file one call node (the names it passes), whatever the width: the weights
    and the function bodies are stored once."""
    per_step = {}
    for width in (64, 128):
        sizes = {}
        for steps in (1, 16):
            c = R.ODEConfig(hidden_size=width, num_heads=4, ode_steps=steps)
            sizes[steps] = len(export_model(c, R.init_params(c), functions=True).SerializeToString())
        per_step[width] = (sizes[16] - sizes[1]) / 15
    # a step costs about 200 B at both widths: the call node names the four projection weights (see
    # test_inlined_projections_read_initializers) and the step's time t, a value_float Constant.
    # The bound is what matters: anything width-sized stored per step would cost at least one 64 x
    # 64 float32 block, 16 kB
    assert per_step[64] == per_step[128] < 300, per_step


def test_inlined_projections_read_initializers():
    """In the default (inlined) export every projection MatMul takes its weight initializer
    directly (no Identity alias between them): what onnxruntime's quantisation tool looks for."""
    c = cfg(use_bitnet=False, ode_solver="heun", ode_steps=2)
    model = export_model(c, R.init_params(c))
    assert not model.functions
    inits = {i.name for i in model.graph.initializer}
    weights = [n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    # 4 projections (q, k, v, out) per evaluation, 2 stages x 2 steps
    assert len(weights) == 4 * 2 * 2 and set(weights) == {f"ode_func.qkv.{b}_weight_t" for b in "qkv"} | {"ode_func.out_proj.weight_t"}


@pytest.mark.parametrize("padding_mask", [False, True])
def test_opset23_runs_one_attention_node_per_evaluation_on_3d_projections(tmp_path, padding_mask):
    """Opset 23's attention is the form measured fastest (export/attention.py, SelfAttention.attn):
    one Attention node per evaluation on 3D q, k, v from their projections (each through one
    select: poison_queries' on q, hide_nonfinite's on k and v), its output into the out projection
    (no Reshape, Transpose or Softmax anywhere), the additive mask built once in the main graph;
    and ONNX Runtime keeps that node through its optimisations."""
    from onnx.inliner import inline_local_functions

    c = R.ODEConfig(hidden_size=16, num_heads=4, ode_solver="heun", ode_steps=2)  # 2 x 2 evaluations
    model = inline_local_functions(export_model(c, R.init_params(c), opset=23, padding_mask=padding_mask))
    nodes = model.graph.node
    producer = {o: n for n in nodes for o in n.output}
    attention = [n for n in nodes if n.op_type == "Attention"]
    assert len(attention) == 4 and not {n.op_type for n in nodes} & {"Reshape", "Transpose", "Softmax"}
    for n in attention:
        selects = [producer[i] for i in n.input[:3]]  # Where(poison, NaN, q), Where(non-finite, 0, k), likewise v
        assert [a.op_type for a in selects] == ["Where"] * 3
        projections = [producer[a.input[2]] for a in selects]
        assert [a.op_type for a in projections] == ["MatMul"] * 3
        assert [a.input[1] for a in projections] == [f"ode_func.qkv.{b}_weight_t" for b in "qkv"]
        y = n.output[0]
        if padding_mask:  # postprocess_attn zeroes the padded rows: one Where, then the projection
            (where,) = [m for m in nodes if y in m.input]
            assert where.op_type == "Where"
            y = where.output[0]
        assert [m.input[1] for m in nodes if y in m.input] == ["ode_func.out_proj.weight_t"]
        assert (len(n.input) == 4 and n.input[3] != "") == padding_mask
    masks = {producer[n.input[3]].name for n in attention} if padding_mask else set()
    assert len(masks) == int(padding_mask)  # one mask for every evaluation
    optimized = tmp_path / "optimized.onnx"
    session(model, optimized_path=optimized)
    ops = [n.op_type for n in onnx.load(optimized).graph.node]
    assert ops.count("Attention") == 4 and "Softmax" not in ops


@pytest.mark.parametrize("opset", [17, 23])
def test_one_export_runs_at_every_batch_and_seq(opset):
    c = cfg(use_bitnet=False, norm_type="layer_norm", ode_solver="rk4")
    params = R.init_params(c, 3, perturb_norms=True)
    model = export_model(c, params, opset=opset)
    sess = session(model)
    rng = np.random.default_rng(0)
    for batch in (1, 5):
        for seq in (1, 37, 300):
            x = rng.normal(size=(batch, seq, 12))
            mask = np.ones((batch, seq), bool)
            mask[0, : seq // 3] = False
            z = run(model, sess, x.astype(np.float32), mask)["z"]
            want = R.ode_block(params, x, c, mask)
            e32 = relative_error(R.ode_block(params, x.astype(np.float32), c, mask), want)
            assert relative_error(z, want) <= tolerance(e32, "float32"), (batch, seq)
            np.testing.assert_array_equal(z[~mask], x.astype(np.float32)[~mask])  # padded: unchanged


@pytest.mark.parametrize("bitnet", [False, True])
def test_decoder_causality_in_the_graph(bitnet):
    c = cfg(use_bitnet=bitnet)
    model = export_model(c, R.init_params(c, 1, perturb_norms=True), padding_mask=False)
    sess = session(model)
    x = np.random.default_rng(1).normal(size=(2, 9, 12)).astype(np.float32)
    z = run(model, sess, x)["z"]
    for j in (1, 4, 8):
        x2 = x.copy()
        x2[:, j:] += 3.0
        np.testing.assert_array_equal(run(model, sess, x2)["z"][:, :j], z[:, :j])


@pytest.mark.parametrize("kwargs, message", [
    pytest.param(dict(opset=19), "opset: expected one of \\(17, 23\\); got 19", id="unknown-opset"),
    pytest.param(dict(attention=R.LocalWindowAttention(cfg(ode_steps=5))), r"attention: its config .* differs from config",
                 id="variant-of-another-config"),
])
def test_export_refuses_an_unknown_opset_or_a_variant_of_another_config(kwargs, message):
    c = cfg()
    with pytest.raises(ValueError, match=message):
        export_model(c, R.init_params(c), **kwargs)


@pytest.mark.parametrize("graph, fields, kwargs, message", [
    pytest.param("block", {}, dict(opset=19), "^opset: expected one of \\(17, 23\\); got 19", id="block-at-an-unknown-opset"),
    pytest.param("block", {}, dict(bitlinear="integer"), "^bitlinear: 'integer' runs BitLinear's projections",
                 id="integer-form-of-a-float-block"),
    pytest.param("prefill", dict(mode="encoder"), {}, "^mode: cached decoding needs mode='decoder'", id="prefill-of-an-encoder"),
    pytest.param("decode_step", {}, dict(opset=23), "^opset: the prefill and decode-step models are exported at opset 17",
                 id="decode-step-at-opset-23"),
    pytest.param("decode_step", dict(use_bitnet=True), dict(bitlinear="integer"),
                 "^bitlinear: the decode_step model has the float form only", id="integer-form-of-the-decode-step-model"),
    pytest.param("encoder", {}, {}, "^graph: expected one of block, prefill, decode_step; got 'encoder'", id="unknown-graph"),
])
def test_check_export_refuses_before_building_what_the_export_refuses(graph, fields, kwargs, message):
    c = cfg(**fields)
    with pytest.raises(ValueError, match=message):
        check_export(c, R.init_params(c), graph=graph, **kwargs)


@pytest.mark.parametrize("graph", ["block", "prefill", "decode_step"])
def test_check_export_passes_what_the_export_builds(graph):
    check_export(cfg(), R.init_params(cfg()), graph=graph)


def test_weight_work_is_outside_the_steps():
    """Weights are quantised at export and dequantised once in the main graph; each evaluation of
    f rounds activations twice (once for q, k and v together, once for out_proj), nothing more."""
    c = cfg(use_bitnet=True, ode_steps=4)
    model = export_model(c, R.init_params(c), functions=True)
    func = {f.name: f for f in model.functions}
    main_ops = [n.op_type for n in model.graph.node]
    assert main_ops.count("Cast") >= 4 and "Round" not in main_ops  # 3 qkv blocks + out_proj, dequantised once
    assert [n.op_type for n in func["ode_func"].node].count("Round") == 2
    assert {n.op_type for n in func["ode_step"].node} <= {"ode_func", "Add", "Mul", "Constant"}
    assert "Cast" not in {n.op_type for n in func["ode_func"].node}


def test_export_is_deterministic():
    c = cfg(use_bitnet=True, ode_steps=3)
    params = R.init_params(c, 1)
    first = export_model(c, params).SerializeToString()
    export_model(cfg(), R.init_params(cfg()))  # another export in between
    assert export_model(c, params).SerializeToString() == first


BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "And", "Or", "Equal", "Greater", "Less",
                "GreaterOrEqual", "LessOrEqual"}


@pytest.mark.parametrize("encoding", ["hope", "alibi", "pape_ri", "rope"])
@pytest.mark.parametrize("mask", [True, False])
def test_every_broadcast_stretches_only_a_dimension_shape_inference_sizes_as_1(encoding, mask):
    """IREE's ONNX import takes a dimension that shape inference (data_prop, as export.iree_program
    runs it) leaves unsized as one that never broadcasts: where such a dimension is 1 at run time
    against a larger one, it reads past the array. So every broadcast in the block's file, run at
    batch 2 with left padding, stretches only dimensions stated as 1; SSMax in encoder mode, whose
    per-row length once came from a Slice, included."""
    from onnx import helper, shape_inference

    c = cfg(mode="encoder", ode_use_pe=True, positional_encoding=encoding, use_ssmax=True, ode_steps=1)
    model = shape_inference.infer_shapes(export_model(c, R.init_params(c, 0), padding_mask=mask), data_prop=True)
    known = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
             for v in [*model.graph.value_info, *model.graph.input]}
    inner = [v for v in model.graph.value_info if v.type.tensor_type.elem_type]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(v.name, v.type.tensor_type.elem_type, None) for v in inner)
    x = np.random.default_rng(0).normal(size=(2, 5, 12)).astype(np.float32)
    feed = {"x": x, **({"padding_mask": np.array([[True] * 5, [False] * 3 + [True] * 2])} if mask else {})}
    shapes = {**{k: np.shape(v) for k, v in feed.items()},
              **dict(zip((v.name for v in inner), (np.shape(a) for a in session(model).run(None, feed))))}
    for node in model.graph.node:
        if node.op_type not in BROADCASTING:
            continue
        out = shapes[node.output[0]]
        for name in (n for n in node.input if n in shapes):  # not an initializer: its dimensions are stated
            shape, stated = shapes[name], known[name]
            for axis in range(1, len(shape) + 1):
                if shape[-axis] == 1 and out[-axis] > 1:
                    assert stated[-axis] == 1, f"{node.op_type} {node.name}: {name}'s {-axis} axis"

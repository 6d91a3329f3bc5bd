"""The standard ONNX tools on each form of the export: the default (every step written out), the
local functions (functions=True) and the Loop form (steps_input=True): onnxruntime's quantize_dynamic, its
ORT-format conversion, onnx.checker's full check, strict shape inference, and onnxruntime's
transformers optimizer. Where a tool cannot handle a form, the test holds what it does there."""

import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402
from odeattn.export.block import export_model  # noqa: E402
from odeattn.export.deploy import int8_error_bound, loop_body, quantize_int8, transformer_fusions  # noqa: E402
from odeattn.export.runtime import run, session  # noqa: E402

CFG = R.ODEConfig(hidden_size=16, num_heads=4, mode="decoder", ode_solver="rk4", ode_steps=2, ode_use_pe=True)
PARAMS = R.init_params(CFG, seed=0, perturb_norms=True)
X = np.random.default_rng(0).normal(size=(2, 6, 16)).astype(np.float32)
MASK = np.array([[True] * 6, [True] * 4 + [False] * 2])


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("export/test_tools")


@pytest.fixture(scope="session")
def forms():
    return {"functions": export_model(CFG, PARAMS, functions=True), "inlined": export_model(CFG, PARAMS),
            "loop": export_model(CFG, PARAMS, steps_input=True)}


def _nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)


def test_quantize_dynamic_quantises_every_projection_of_the_default_and_loop_forms(forms, tmp_path):
    """The tool as a deployer calls it. The Loop form needs its EnableSubgraph option; the
    functions form's projections are inside local functions, which it does not read: nothing is
    quantised there (the export says so when it writes one)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    found = {}
    for name, model in forms.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
        quantize_dynamic(tmp_path / f"{name}.onnx", tmp_path / f"{name}.q.onnx", weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], extra_options={"EnableSubgraph": name == "loop"})
        found[name] = sum(n.op_type == "MatMulInteger" for n in _nodes(onnx.load(tmp_path / f"{name}.q.onnx").graph))
    assert found == {"functions": 0, "inlined": 4 * 4 * 2, "loop": 4 * 4}  # q, k, v, out x 4 stages (x 2 steps unrolled)


def test_quantize_dynamic_on_the_default_export_quantises_it_and_stays_within_its_derived_bound(tmp_path):
    """What a deployer does with the file they were given: onnxruntime's quantize_dynamic, called
    as docs/export.md says, on a plain export. Every projection becomes a MatMulInteger on int8
    weights fed by a DynamicQuantizeLinear, the file is smaller, and z stays within the bound
    derived from the quantisation steps (deploy.int8_error_bound). Called without reduce_range, on
    an AVX2 CPU without VNNI, the error is 2e-2 to 7e-2, over the bound: ONNX Runtime's kernel
    saturates there, which the bound does not model (docs/export.md says to pass it)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cfg = R.ODEConfig(hidden_size=128, num_heads=4, ode_solver="rk4", ode_steps=2)
    params = R.init_params(cfg, seed=0)
    onnx.save(export_model(cfg, params), tmp_path / "block.onnx")
    quantize_dynamic(tmp_path / "block.onnx", tmp_path / "block.int8.onnx", weight_type=QuantType.QInt8, reduce_range=True)
    q = onnx.load(tmp_path / "block.int8.onnx")
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("MatMulInteger") == 4 * 4 * 2 and ops.count("DynamicQuantizeLinear") == 2 * 4 * 2  # (qkv, out) x 4 stages x 2 steps
    # the four weights, 85 % of the float file at D 128, are stored in a quarter of their bytes
    assert (tmp_path / "block.int8.onnx").stat().st_size < 0.6 * (tmp_path / "block.onnx").stat().st_size
    x = np.random.default_rng(0).normal(size=(2, 8, 128))
    err = relative_error(run(q, session(q), x.astype(np.float32))["z"], R.ode_block(params, x, cfg))
    bound = int8_error_bound(cfg, params, x)
    print(f"int8 error {err:.3g}, bound {bound:.3g}")
    assert 1e-4 < err <= bound, (err, bound)  # quantised (far above float32's 1e-7), and within the derivation


def test_the_loop_form_s_int8_file_passes_the_checker_and_runs_at_any_step_count(forms):
    q = quantize_int8(forms["loop"])
    onnx.checker.check_model(q, full_check=True)  # the quantiser's Loop is put back after what its body reads
    assert sum(n.op_type == "MatMulInteger" for n in loop_body(q).node) == 16
    assert not any("weight_t" in t.name and t.data_type == onnx.TensorProto.FLOAT and not t.name.endswith("_scale")
                   for t in q.graph.initializer)
    sess = session(q)
    for steps in (1, 2, 8):
        at = R.ODEConfig(**{**CFG.to_dict(), "ode_steps": steps})
        err = relative_error(run(q, sess, X, MASK, steps=steps)["z"], R.ode_block(PARAMS, X.astype(np.float64), at, MASK))
        assert 1e-5 < err < 1e-2, (steps, err)  # lossy, as the inlined form's int8 (test_deploy.py)


def test_every_form_passes_the_full_check_and_strict_shape_inference(forms):
    """Every value computed in the graph (and in the Loop's body) has its type and a full shape,
    batch and seq symbolic. The default form's function bodies are typed when they are called:
    the check is on the main graph there."""
    for name, model in forms.items():
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)

        def unshaped(graph):
            known = {v.name: v.type.tensor_type for v in [*graph.value_info, *graph.output, *graph.input]}
            bad = [o for n in graph.node for o in n.output
                   if o not in known or not known[o].HasField("shape")
                   or not all(d.dim_param or d.HasField("dim_value") for d in known[o].shape.dim)]
            return bad + [o for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for o in unshaped(a.g)]

        assert unshaped(inferred.graph) == [], name
        z = {v.name: v for v in inferred.graph.value_info}
        state = [v for v in z.values() if [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] == ["batch", "seq", 16]]
        assert state or name == "functions", name  # the dynamic axes reach the intermediates


def test_every_form_converts_to_the_ort_format(forms, tmp_path):
    for name, model in forms.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
    done = subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(tmp_path),
                           "--output_dir", str(tmp_path / "ort"), "--optimization_style", "Fixed"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted(f for f in os.listdir(tmp_path / "ort") if f.endswith(".ort"))
    assert written == ["functions.ort", "inlined.ort", "loop.ort"], written
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "ort" / "loop.ort"), providers=["CPUExecutionProvider"])
    z = sess.run(["z"], {"x": X, "padding_mask": MASK, "steps": np.array(3, np.int64)})[0]
    np.testing.assert_array_equal(z, run(forms["loop"], session(forms["loop"]), X, MASK, steps=3)["z"])


def test_the_transformers_optimizer_runs_on_every_form_without_its_layer_norm_fusion(forms, tmp_path):
    """With transformer_fusions() (every fusion but the layer norms', which cannot express the
    block's norms and whose matcher fails on them), each form optimises and gives the same z."""
    from onnxruntime.transformers import optimizer

    for name, model in forms.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
        optimized = optimizer.optimize_model(str(tmp_path / f"{name}.onnx"), model_type="bert", num_heads=0, hidden_size=0,
                                             opt_level=0, optimization_options=transformer_fusions())
        optimized.save_model_to_file(str(tmp_path / f"{name}.opt.onnx"))
        out = onnx.load(tmp_path / f"{name}.opt.onnx")
        assert not {"LayerNormalization", "SimplifiedLayerNormalization"} & {n.op_type for n in _nodes(out.graph)}
        got = session(out).run(["z"], {"x": X, "padding_mask": MASK})[0]
        np.testing.assert_allclose(got, run(model, session(model), X, MASK)["z"], rtol=0, atol=1e-6, err_msg=name)

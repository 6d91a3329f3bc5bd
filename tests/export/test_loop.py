"""The Loop form (export_model(..., steps_input=True), export/loop.py): one file for any number of
steps, equal to the spec at each count within the suite's float32 rule, its feed checked."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.fair import make_inputs  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402
from odeattn.export.block import check, check_export, export_model  # noqa: E402
from odeattn.export.decode import SessionRun  # noqa: E402
from odeattn.export.deploy import loop_body  # noqa: E402
from odeattn.export.runtime import make_feed, run, run_reference, session  # noqa: E402

STEP_COUNTS = (1, 2, 3, 4, 8, 16)
# every solver, with the options in turn: positions (the seed's family among them), mode, BitLinear
SOLVERS = [
    ("euler", dict(ode_use_pe=True)),
    ("midpoint", dict(mode="decoder", use_bitnet=True, ode_use_pe=True, positional_encoding="pape", use_ssmax=True)),
    ("heun", dict(ode_use_pe=True, positional_encoding="alibi", norm_type="rms_norm")),
    ("ralston", dict(mode="decoder", norm_type="derf", ode_use_pe=True, positional_encoding="hope", layer_idx=1)),
    ("rk4", dict(use_bitnet=True, norm_type="prms_norm", ode_use_pe=True)),
    ("rk38", dict(mode="decoder", norm_type="flash_norm", ode_use_pe=True, positional_encoding="alibi")),
    ("rk2_gated", dict(mode="decoder", ode_use_pe=True, norm_type="dynamic_tanh")),
    ("euler", dict(ode_use_pe=True, positional_encoding="bam", use_ssmax=True, ssmax_length="padded", bam_learn_mu=True)),
]


def within_float32(got, cfg, params, x, mask, steps, variant=None) -> bool:
    """The suite's rule at `steps`: the tolerance derived from the spec's own float32 error there."""
    at = R.ODEConfig(**{**cfg.to_dict(), "ode_steps": steps})
    attention = None if variant is None else variant(at)
    want = R.ode_block(params, x, at, mask, attention=attention)
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), at, mask, attention=attention), want)
    return relative_error(got, want) <= tolerance(e32, "float32")


@pytest.mark.parametrize("solver, fields", SOLVERS, ids=[s + ("-" + f["positional_encoding"] if "positional_encoding" in f
                                                                   else "") for s, f in SOLVERS])
def test_one_file_equals_the_spec_at_every_step_count(solver, fields):
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, ode_solver=solver, ode_steps=4, **fields)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 2, 6, seed=1, padding=True)
    model = export_model(cfg, params, steps_input=True)
    sess = session(model)
    x32 = x.astype(np.float32)
    for steps in STEP_COUNTS:
        z = run(model, sess, x32, mask, steps=steps)["z"]
        assert within_float32(z, cfg, params, x, mask, steps), (solver, steps)
        np.testing.assert_array_equal(z[~mask], x32[~mask])  # padded tokens: unchanged
    assert within_float32(run(model, sess, x32, mask)["z"], cfg, params, x, mask, 4)  # the default: ode_steps


@pytest.mark.parametrize("variant", R.VARIANTS, ids=lambda v: v.__name__)
def test_each_variant_exports_in_the_loop_form(variant):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="rk2_gated", ode_steps=2, ode_use_pe=True)
    params = R.init_params(cfg, seed=2, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 2, 6, seed=2, padding=True)
    model = export_model(cfg, params, attention=variant(cfg), steps_input=True)
    sess = session(model)
    for steps in (1, 5):
        z = run(model, sess, x.astype(np.float32), mask, steps=steps)["z"]
        assert within_float32(z, cfg, params, x, mask, steps, variant), steps


@pytest.mark.parametrize("solver", ["ab2", "momentum"])
def test_a_multistep_solver_is_refused_by_the_loop_form_naming_the_option(solver):
    """Its body is one RK step; a multistep solver carries its past evaluations: refused as the
    conformance adapters refuse it (export/options.loop_refusal), not exported wrong."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver=solver, ode_steps=3)
    with pytest.raises(ValueError, match=rf"^steps_input: the Loop form's body is one RK step; ode_solver '{solver}' "
                                         r"carries its past evaluations from step to step \(export the default form\)$"):
        export_model(cfg, R.init_params(cfg), steps_input=True)


@pytest.mark.parametrize("opset", [17, 23])
def test_the_loop_form_passes_the_checker_and_strict_shape_inference(opset):
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="rk4", ode_steps=4, ode_use_pe=True)
    model = export_model(cfg, R.init_params(cfg), opset=opset, steps_input=True, diagnostics=True)
    check(model)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in inferred.graph.output}
    assert dims == {"z": ["batch", "seq", 12], "f0": ["batch", "seq", 12], "trajectory": ["steps", "batch", "seq", 12]}
    steps = next(i for i in model.graph.input if i.name == "steps")
    assert steps.type.tensor_type.elem_type == onnx.TensorProto.INT64 and not steps.type.tensor_type.shape.dim
    default = next(t for t in model.graph.initializer if t.name == "steps")
    assert onnx.numpy_helper.to_array(default) == 4 and default.data_type == onnx.TensorProto.INT64


def test_weights_live_once_in_the_outer_graph_and_the_file_holds_one_step():
    """No local functions; one Loop node; its body stores no tensor and its projections read the
    outer initializers by name; so the file is the same size at 1 and at 64 steps (only the
    default's digits in the metadata differ)."""
    sizes = {}
    for steps in (1, 64):
        cfg = R.ODEConfig(hidden_size=16, num_heads=4, ode_solver="rk4", ode_steps=steps)
        model = export_model(cfg, R.init_params(cfg), steps_input=True)
        sizes[steps] = len(model.SerializeToString())
    assert abs(sizes[64] - sizes[1]) <= 2, sizes
    assert not model.functions and [n.op_type for n in model.graph.node].count("Loop") == 1
    body = loop_body(model)
    inits = {t.name for t in model.graph.initializer}
    assert not body.initializer and not any(a.t.dims and a.t.dims[0] >= 16 for n in body.node for a in n.attribute)
    weights = [n.input[1] for n in body.node if n.op_type == "MatMul" and n.input[1] in inits]
    assert len(weights) == 4 * 4  # q, k, v, out x 4 stages, each step
    assert {n.op_type for n in model.graph.node if n.op_type == "Cast"} and "Round" not in {n.op_type for n in body.node}


def test_the_trajectory_and_f0_and_the_reference_evaluator():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=2)
    params = R.init_params(cfg, seed=4, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 2, 5, seed=4, padding=True)
    model = export_model(cfg, params, steps_input=True, diagnostics=True)
    out = run(model, session(model), x.astype(np.float32), mask, steps=3)
    at3 = R.ODEConfig(**{**cfg.to_dict(), "ode_steps": 3})
    _, want = R.ode_block(params, x, at3, mask, return_trajectory=True)
    assert out["trajectory"].shape == (3, 2, 5, 8)
    assert relative_error(out["trajectory"], want[1:]) < 1e-5 and relative_error(out["f0"], R.ode_func(params, 0.0, x, cfg, mask)) < 1e-5
    with np.errstate(divide="ignore"):  # the norms' Log(max|x|) of a padded (zero) token is -inf by design
        ref = run_reference(model, x.astype(np.float32), mask, steps=3)
    assert relative_error(ref["z"], out["z"]) < 1e-5


@pytest.mark.parametrize("steps, error, message", [
    pytest.param(0, ValueError, r"^steps: expected an integer in \[1, 65536\]; got 0$", id="zero"),
    pytest.param(-3, ValueError, r"^steps: expected an integer in \[1, 65536\]; got -3$", id="negative"),
    pytest.param(np.array([2]), ValueError, r"^steps: expected a scalar \(shape \[\]\); got shape \[1\]$", id="not-a-scalar"),
    pytest.param(2.0, TypeError, r"^steps: expected an integer in \[1, 65536\]; got 2.0 \(float64\)$", id="float"),
    pytest.param(True, TypeError, r"^steps: expected an integer in \[1, 65536\]; got True", id="bool"),
    pytest.param(65537, ValueError, r"^steps: expected an integer in \[1, 65536\]; got 65537$", id="past-the-maximum"),
    pytest.param(2**63, ValueError, rf"^steps: expected an integer in \[1, 65536\]; got {2**63}$", id="past-int64"),
    pytest.param(np.uint64(2**63), ValueError, rf"^steps: expected an integer in \[1, 65536\]; got {2**63}$", id="uint64"),
    pytest.param(np.array(2**64 - 1, np.uint64), ValueError, rf"^steps: expected an integer in \[1, 65536\]; got {2**64 - 1}$",
                 id="uint64-array"),
])
def test_a_bad_step_count_is_refused_by_name(steps, error, message):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    model = export_model(cfg, R.init_params(cfg), steps_input=True)
    with pytest.raises(error, match=message):
        make_feed(model, np.zeros((1, 2, 8), np.float32), steps=steps)


@pytest.mark.parametrize("value, error, message", [
    pytest.param(np.array(0, np.int64), ValueError, r"^steps: expected an integer in \[1, 65536\]; got 0$", id="zero"),
    pytest.param(np.array(2, np.int32), TypeError, r"^steps: expected dtype int64; got int32$", id="int32"),
    pytest.param(np.array([2], np.int64), ValueError, r"^steps: expected shape \[\]; got \[1\]$", id="not-a-scalar"),
])
def test_a_raw_feed_s_steps_is_checked_too(value, error, message):
    """A SessionRun (the conformance adapters', the decoders') checks a feed's steps before ONNX Runtime."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    runner = SessionRun(export_model(cfg, R.init_params(cfg), steps_input=True))
    x = np.zeros((1, 2, 8), np.float32)
    runner.check({"x": x, "padding_mask": np.ones((1, 2), bool)})  # steps left out: its default
    with pytest.raises(error, match=message):
        runner.check({"x": x, "padding_mask": np.ones((1, 2), bool), "steps": value})


def test_a_model_without_a_steps_input_refuses_steps():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=5)
    model = export_model(cfg, R.init_params(cfg))
    with pytest.raises(ValueError, match=r"^steps: this model runs a fixed step count \(ode_steps=5, unrolled in the graph\); "
                                         r"export it with steps_input=True .*; got steps=3$"):
        make_feed(model, np.zeros((1, 2, 8), np.float32), steps=3)


@pytest.mark.parametrize("graph", ["prefill", "decode_step"])
def test_the_cached_models_keep_a_fixed_step_count(graph):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder")
    with pytest.raises(ValueError, match=f"^steps_input: the {graph} model keeps a fixed step count"):
        check_export(cfg, R.init_params(cfg), graph=graph, steps_input=True)


def test_the_library_refuses_functions_with_the_loop_form():
    """export_model(functions=True, steps_input=True) is refused by name, not answered with the Loop form."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(ValueError, match=r"^functions: the Loop form has no local functions; its step is written out once, "
                                         r"in the Loop's body; got steps_input=True$"):
        export_model(cfg, R.init_params(cfg), functions=True, steps_input=True)


@pytest.mark.parametrize("fed", [0, -5])
def test_the_graph_clamps_a_step_count_below_one_to_one_step(fed):
    """A feed that skips the project's checks (ONNX Runtime called directly) still does not return x:
    the graph clamps steps to [1, MAX_STEPS] (export.loop.step_count), so 0 and -5 take one step."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    model = export_model(cfg, R.init_params(cfg), steps_input=True, padding_mask=False)
    sess = session(model)
    x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype(np.float32)
    z = sess.run(["z"], {"x": x, "steps": np.array(fed, np.int64)})[0]
    one = sess.run(["z"], {"x": x, "steps": np.array(1, np.int64)})[0]
    assert np.abs(z - x).max() > 1e-3 and np.array_equal(z, one)
    clip = next(n for n in model.graph.node if n.op_type == "Clip")
    values = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"}
    values.update({t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer})
    assert [values[name].item() for name in clip.input[1:]] == [1, R.MAX_STEPS]


def _with_stored_steps(value):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    model = export_model(cfg, R.init_params(cfg), steps_input=True)
    stored = next(t for t in model.graph.initializer if t.name == "steps")
    stored.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value), "steps"))
    return model


@pytest.mark.parametrize("value, message", [
    pytest.param(np.array(0, np.int64), r"^the model's stored steps: expected an integer in \[1, 65536\]; got 0$", id="zero"),
    pytest.param(np.array(-1, np.int64), r"^the model's stored steps: expected an integer in \[1, 65536\]; got -1$", id="negative"),
    pytest.param(np.array(70000, np.int64), r"^the model's stored steps: expected an integer in \[1, 65536\]; got 70000$",
                 id="past-the-maximum"),
    pytest.param(np.array(2, np.int32), r"^the model's stored steps: expected an int64 scalar; got int32 of shape \[\]$", id="int32"),
    pytest.param(np.array([2], np.int64), r"^the model's stored steps: expected an int64 scalar; got int64 of shape \[1\]$",
                 id="not-a-scalar"),
])
def test_a_bad_stored_step_count_is_refused_before_the_session_and_the_run(value, message):
    """The file's own default is checked as a fed steps is: before ONNX Runtime builds a session
    (it would fail inside, in its words) and before a run that leaves steps out."""
    model = _with_stored_steps(value)
    with pytest.raises(ValueError, match=message):
        session(model)
    with pytest.raises(ValueError, match=message):
        make_feed(model, np.zeros((1, 2, 8), np.float32))


@pytest.mark.parametrize("export, flag", [
    ("export_model", "steps_input"), ("export_model", "padding_mask"), ("export_model", "diagnostics"),
    ("export_model", "keep_io_types"), ("export_prefill_model", "padding_mask"), ("check_export", "steps_input"),
])
def test_a_string_flag_is_refused_not_read_by_truthiness(export, flag):
    """steps_input='no' would otherwise write the Loop form: every flag of export/ takes a bool
    (NumPy's np.bool_ too) and refuses anything else by name."""
    from odeattn.export import block

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder" if export == "export_prefill_model" else "encoder")
    with pytest.raises(TypeError, match=rf"^{flag}: expected True or False; got 'no' \(str\)$"):
        getattr(block, export)(cfg, R.init_params(cfg), **{flag: "no"})
    assert export == "check_export" or getattr(block, export)(cfg, R.init_params(cfg), **{flag: np.bool_(False)})


def test_the_encoder_export_refuses_a_string_padding_mask():
    from odeattn.export.encoder import export_encoder_model

    with pytest.raises(TypeError, match=r"^padding_mask: expected True or False; got 'no' \(str\)$"):
        export_encoder_model(None, None, padding_mask="no")


def test_a_required_steps_input_has_no_default_and_a_run_without_steps_is_refused():
    """steps_default=False: no initializer for steps, so it is a declared input; ONNX Runtime runs it
    at each count fed, a feed without steps is refused by name, and the option alone (the unrolled
    form) is refused."""
    from odeattn.export.runtime import REQUIRED_STEPS, declared_inputs

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=3)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    model = export_model(cfg, params, steps_input=True, steps_default=False)
    assert "steps" in declared_inputs(model) and not any(t.name == "steps" for t in model.graph.initializer)
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    sess = session(model)
    for steps in (1, 5):
        assert within_float32(run(model, sess, x.astype(np.float32), steps=steps)["z"], cfg, params, x, None, steps)
    with pytest.raises(ValueError, match=f"^{REQUIRED_STEPS.replace('(', '[(]').replace(')', '[)]')}$"):
        make_feed(model, x.astype(np.float32))
    with pytest.raises(ValueError, match="^steps_default: applies to the Loop form"):
        export_model(cfg, params, steps_default=False)

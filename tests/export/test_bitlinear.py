"""export_model(..., bitlinear="integer"): BitLinear's projections as exact integer products
(MatMulInteger on the stored int8 ternary weights) times one float scale per token. Its agreement
with the spec on every use_bitnet golden case runs in the main job (CI runs it whole, .ci/run)
through the onnxruntime-integer backend, and the suite's run of its sample
(tests/odeattn/commands/test_conformance.py) is read here; the option's refusals and what the file holds (`odeattn
export --bitlinear`: tests/odeattn/commands/test_export.py)."""


import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from odeattn.export.bitlinear import MAX_INTEGER_WIDTH, check_form, product_scale  # noqa: E402
from odeattn.export.block import check, export_model  # noqa: E402
from ode_ref.params import OUT_PROJ, QKV  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", use_bitnet=True, ode_steps=2), **kw})


def test_the_float_form_exports_any_block_and_the_integer_form_up_to_the_width_limit():
    f = cfg(use_bitnet=False)
    export_model(f, R.init_params(f), bitlinear="float")  # the default form, for any block
    check_form("integer", R.ODEConfig(hidden_size=MAX_INTEGER_WIDTH, num_heads=1, use_bitnet=True))


def _export(config, bitlinear):
    export_model(config, R.init_params(config), bitlinear=bitlinear)


def _check(config, bitlinear):  # the config is enough to check, as export_model checks it before building anything
    check_form(bitlinear, config)


@pytest.mark.parametrize("call, config, bitlinear, message", [
    pytest.param(_export, cfg(), "int8", r"^bitlinear: expected one of 'float', 'integer'; got 'int8'$", id="unknown-form"),
    pytest.param(_export, cfg(use_bitnet=False), "integer", r"^bitlinear: 'integer' runs BitLinear's projections as integer "
                 r"kernels; expected a config with use_bitnet=true; got use_bitnet=false$", id="integer-form-of-a-float-block"),
    # the sums reach 128 x width; above 2^24 their Cast to float32 would round
    pytest.param(_check, R.ODEConfig(hidden_size=MAX_INTEGER_WIDTH + 1, num_heads=1, use_bitnet=True), "integer",
                 f"bitlinear: 'integer' needs hidden_size <= {MAX_INTEGER_WIDTH}", id="integer-form-wider-than-its-sums-allow"),
])
def test_a_form_that_does_not_apply_is_refused_naming_the_parameter(call, config, bitlinear, message):
    with pytest.raises(ValueError, match=message):
        call(config, bitlinear)


@pytest.mark.parametrize("opset", [17, 23])
def test_the_file_holds_int8_weights_only_and_integer_products(opset):
    c = cfg(ode_solver="heun")
    params = R.init_params(c, 1, perturb_norms=True)
    model = export_model(c, params, opset=opset, bitlinear="integer")
    check(model)
    assert {p.key: p.value for p in model.metadata_props}["bitlinear"] == "integer"
    assert "bitlinear" not in {p.key for p in export_model(c, params, opset=opset).metadata_props}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = {k: v for k, v in inits.items() if "ternary" in k}
    assert sorted(weights) == sorted(["ode_func.qkv.q_ternary_t", "ode_func.qkv.k_ternary_t", "ode_func.qkv.v_ternary_t",
                                      "ode_func.out_proj.ternary_t"])
    for name, w in weights.items():
        assert w.dtype == np.int8 and w.shape == (12, 12) and set(np.unique(w)) <= {-1, 0, 1}, name
    # no float copy of W: besides the ternary values, float32 scalars (c, one per weight tensor)
    # and the norm's per-channel parameters, nothing
    rest = {k: v for k, v in inits.items() if k not in weights}
    assert all(v.dtype == np.float32 and v.size <= 12 for v in rest.values()), {k: v.shape for k, v in rest.items()}
    for key, name in ((QKV, "qkv"), (OUT_PROJ, "out_proj")):
        c_stored = rest[f"ode_func.{name}.product_scale"]
        assert c_stored == product_scale(params[key].astype(np.float32)) and c_stored.shape == ()
        # c = max(mean|W|, eps) / 127, one float32 rounding of the float64 value
        assert c_stored == np.float32(np.abs(params[key].astype(np.float32).astype(np.float64)).mean() / 127)
    # every projection reads its int8 weight in a MatMulInteger, and nothing dequantises it
    from onnx.inliner import inline_local_functions

    flat = inline_local_functions(model)
    readers = [n.op_type for n in flat.graph.node for i in n.input if i in weights]
    evaluations = 2 * 2  # heun: 2 stages x 2 steps
    assert readers == ["MatMulInteger"] * 4 * evaluations, readers
    ops = [n.op_type for n in flat.graph.node]
    assert ops.count("QuantizeLinear") == 2 * evaluations  # h once for q, k, v; y once for out_proj
    # float MatMuls: attention's own two at opset 17 (Attention at 23), and hide_nonfinite's count of
    # the visible non-finite keys (mask @ bad keys, a few values a query)
    assert "Round" not in ops and ops.count("MatMul") == evaluations * (3 if opset == 17 else 1)


@pytest.mark.xdist_group("main-job-onnx-other")  # the process that runs that part of the main job
def test_a_few_bitnet_golden_cases_pass_within_the_float32_tolerances(main_job):
    """The integer products are exact and rescaled once, so the export passes the float32
    tolerances untouched (worst error/tolerance 0.064 over the use_bitnet block cases, in the main
    job), in the suite's run of its sample: rope, alibi, padding, layer_norm at magnitude 10^3 and 8
    steps; a float block, a decode case and a grad case are skipped, not failed, each with its reason."""
    code, out, report = main_job("onnx-other")
    assert code == 0, out
    results = {r["case"]: r for r in report["results"] if r["backend"] == "onnxruntime-integer"}
    cases = {c.name: c for c in load_cases() if c.name in main_job.sample}
    chosen = ["block_dynamic_tanh_midpoint_decoder_bitnet_pad_s2_b1t1h1d6_positions-alibi", "block_rope_decoder_bitnet_pad",
              "block_large_magnitude_layer_norm_bitnet_decoder", "block_layer_norm_heun_decoder_bitnet_pad_s8_b3t7h3d12"]
    for name in chosen:
        assert results[name]["status"] == "passed", (name, results[name])
    skipped = {
        next(n for n, c in cases.items() if not c.config.use_bitnet): "not supported: a float block",
        next(n for n, c in cases.items() if c.config.use_bitnet and c.decoded): "not supported: cached decoding",
        next(n for n, c in cases.items() if c.config.use_bitnet and c.kind.name == "grad"): "not supported: gradients",
    }
    for name, reason in skipped.items():
        result = results[name]
        assert result["status"] == "skipped" and result["message"].startswith(reason), (name, result)



"""export_model(..., bitlinear="integer"): BitLinear's projections as exact integer products
(MatMulInteger on the stored int8 ternary weights) times one float scale per token. Its agreement
with the spec on every use_bitnet golden case runs in the main job (tests/odeattn/test_cli.py)
through the onnxruntime-integer backend; here, a few of them, the option's refusals and
what the file holds."""


import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.adapters import BUILTIN, make_adapter  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from odeattn.conformance.runner import run_case  # noqa: E402
from odeattn.export.bitlinear import MAX_INTEGER_WIDTH, check_form, product_scale  # noqa: E402
from odeattn.export.block import check, export_model  # noqa: E402
from ode_ref.params import OUT_PROJ, QKV  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", use_bitnet=True, ode_steps=2), **kw})


def test_refusals_name_the_option():
    c = cfg()
    with pytest.raises(ValueError, match=r"^bitlinear: expected one of 'float', 'integer'; got 'int8'$"):
        export_model(c, R.init_params(c), bitlinear="int8")
    f = cfg(use_bitnet=False)
    with pytest.raises(ValueError, match=r"^bitlinear: 'integer' runs BitLinear's projections as integer kernels; "
                                         r"expected a config with use_bitnet=true; got use_bitnet=false$"):
        export_model(f, R.init_params(f), bitlinear="integer")
    export_model(f, R.init_params(f), bitlinear="float")  # the default form, for any block
    # the sums reach 128 x width; above 2^24 their Cast to float32 would round: refused (the
    # config is enough to check, as export_model checks it before building anything)
    with pytest.raises(ValueError, match=f"bitlinear: 'integer' needs hidden_size <= {MAX_INTEGER_WIDTH}"):
        check_form("integer", R.ODEConfig(hidden_size=MAX_INTEGER_WIDTH + 1, num_heads=1, use_bitnet=True))
    check_form("integer", R.ODEConfig(hidden_size=MAX_INTEGER_WIDTH, num_heads=1, use_bitnet=True))


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


def test_a_few_bitnet_golden_cases_pass_within_the_float32_tolerances():
    """The integer products are exact and rescaled once, so the export passes the float32
    tolerances untouched (on all 16 use_bitnet block cases: worst error/tolerance 0.064, against
    0.051 for the float form, measured with odeattn conformance). Here: four of them, covering
    rope, alibi, padding, layer_norm at magnitude 10^3 and 8 steps; a float block, a decode case
    and a grad case are skipped, not failed."""
    backend = make_adapter(BUILTIN["onnxruntime-integer"].reference)
    cases = {c.name: c for c in load_cases()}
    chosen = ["block_dynamic_tanh_midpoint_decoder_bitnet_pad_s2_b1t1h1d6_positions-alibi", "block_rope_decoder_bitnet_pad",
              "block_large_magnitude_layer_norm_bitnet_decoder", "block_layer_norm_heun_decoder_bitnet_pad_s8_b3t7h3d12"]
    for name in chosen:
        result = run_case(backend, cases[name], "float32")
        assert result.status == "passed", (name, result.status, result.message)
    skipped = {
        next(n for n, c in cases.items() if not c.config.use_bitnet): "not supported: a float block",
        next(n for n, c in cases.items() if c.config.use_bitnet and c.decoded): "not supported: cached decoding",
        next(n for n, c in cases.items() if c.config.use_bitnet and c.z1_bar is not None): "not supported: gradients",
    }
    for name, reason in skipped.items():
        result = run_case(backend, cases[name], "float32")
        assert result.status == "skipped" and result.message.startswith(reason), (name, result.status, result.message)


def test_cli_writes_the_integer_form(files, capsys, export_cli):
    assert export_cli(files, "-o", str(files / "i.onnx"), "--bitlinear", "integer", name="b") == 0
    out = capsys.readouterr().out
    err = float(out.split("random batch (2 x 8): ")[1].split()[0])
    assert err < 1e-3, out  # a random batch is not a fair test: a level flipped by float32 rounding costs ~1/127
    assert "integer BitLinear: 4 projections x 8 evaluations as exact MatMulInteger" in out  # rk4, 2 steps
    model = onnx.load(files / "i.onnx")
    assert {p.key: p.value for p in model.metadata_props}["bitlinear"] == "integer"
    assert "MatMulInteger" in {n.op_type for f in model.functions for n in f.node}


@pytest.mark.parametrize("extra, name, message", [
    (["--bitlinear", "integer"], "c", "odeattn: --bitlinear: 'integer' runs BitLinear's projections as integer kernels; expected a "
                                      "config with use_bitnet=true; got use_bitnet=false"),
    (["--bitlinear", "integer", "--decode"], "b", "--bitlinear integer: expected the block model of the direct route; got --decode"),
    (["--bitlinear", "integer", "--route", "torch"], "b",
     "--bitlinear integer: expected the block model of the direct route; got --route torch"),
])
def test_cli_refusals_are_one_line_and_exit_2(files, capsys, extra, name, message, assert_refused):
    assert_refused(files, capsys, extra, name, message)


def test_cli_refuses_an_unknown_form_in_one_line(files, capsys, export_cli):
    with pytest.raises(SystemExit) as exit_:
        export_cli(files, "-o", str(files / "m.onnx"), "--bitlinear", "int8", name="b")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "argument --bitlinear: invalid choice: 'int8'" in err[0], err

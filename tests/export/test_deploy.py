"""ONNX Runtime's deployment tools on the exported block: the inlined graph, int8 dynamic
quantisation (lossy: reported and bounded here, never a conformance backend), the saved
optimised model (`odeattn export --functions/--quantize/--optimize` and `odeattn run --repeats`:
tests/odeattn/commands/test_export.py)."""


import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402
from odeattn.export.block import check, export_model  # noqa: E402
from odeattn.export.deploy import check_against_spec, inline, quantize_int8  # noqa: E402
from odeattn.export.runtime import run, session  # noqa: E402


def _covering(cases):
    """Cases, in order, until every value of each config field and of padding has appeared: the
    variety of the golden set at a fraction of its sessions (each costs ~0.1 s to build)."""
    seen, out = set(), []
    for case in cases:
        traits = {(k, str(v)) for k, v in case.config.to_dict().items()} | {("padding", case.padding_mask is not None)}
        if traits - seen:
            seen |= traits
            out.append(case)
    return out


def test_the_default_inlined_graph_equals_the_functions_form_on_the_conformance_cases():
    """ONNX Runtime inlines the local functions itself, so both forms run the same nodes: equal z,
    bit for bit (float32), on golden block cases covering every solver, norm, mode, BitLinear,
    position encoding, width and padding of the set."""
    cases = _covering([c for c in load_cases() if c.kind.name == "block"])
    assert 10 <= len(cases) < 40, len(cases)
    for case in cases:
        params = {k: v.astype(np.float32) for k, v in case.params.items()}
        model = export_model(case.config, params, padding_mask=case.padding_mask is not None, functions=True)
        flat = export_model(case.config, params, padding_mask=case.padding_mask is not None)
        assert inline(model).SerializeToString() == flat.SerializeToString()
        assert not flat.functions and {n.domain for n in flat.graph.node} == {""}
        x = case.x.astype(np.float32)
        np.testing.assert_array_equal(run(flat, session(flat, threads=1), x, case.padding_mask)["z"],
                                      run(model, session(model, threads=1), x, case.padding_mask)["z"], err_msg=case.name)


def test_int8_quantises_every_projection_and_is_lossy_within_a_measured_bound():
    c = R.ODEConfig(hidden_size=64, num_heads=4, ode_solver="rk4", ode_steps=2)
    params = R.init_params(c, seed=0)
    q = quantize_int8(export_model(c, params))
    check(q)
    ops = [n.op_type for n in q.graph.node]
    assert not q.functions and ops.count("MatMulInteger") == 4 * 4 * 2  # q, k, v, out x 4 stages x 2 steps
    weights = {i.name: i.data_type for i in q.graph.initializer if "weight_t" in i.name}
    assert {k for k, t in weights.items() if t == onnx.TensorProto.FLOAT} == {k for k in weights if k.endswith("_scale")}
    assert sum(k.endswith("_quantized") and t == onnx.TensorProto.INT8 for k, t in weights.items()) == 4  # stored once
    x = np.random.default_rng(0).normal(size=(2, 8, 64))
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    err = relative_error(run(q, session(q), x.astype(np.float32), mask)["z"], R.ode_block(params, x, c, mask))
    # lossy: the float export's error here is ~2e-7, so above 1e-5 the weights were quantised;
    # 7-bit weights stay near 2e-3 (one step of a tensor's range is ~0.8% of it, mostly averaged
    # out over the products' sums); 1e-2 leaves room for other draws and quantiser versions without
    # admitting a broken graph, and fails 8-bit weights on a CPU without VNNI (quantize_int8)
    assert 1e-5 < err < 1e-2, err


def test_int8_refuses_a_bitlinear_block():
    with pytest.raises(ValueError, match="^int8 quantisation: expected a float block; got use_bitnet=true"):
        cb = R.ODEConfig(hidden_size=8, num_heads=2, use_bitnet=True)
        quantize_int8(export_model(cb, R.init_params(cb)))


def test_a_projection_left_in_float_is_an_error_not_a_float_file(monkeypatch):
    """If onnxruntime's quantiser skipped the projections (as it does when they read their weights
    through an alias), quantize_int8 says so instead of returning the float graph."""
    import onnxruntime.quantization as Q

    monkeypatch.setattr(Q, "quantize_dynamic", lambda model, path, **kw: onnx.save(model, path))
    c = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=3)
    with pytest.raises(RuntimeError, match="expected 24 MatMulInteger nodes \\(4 projections x 6 evaluations\\); "
                                           "onnxruntime's quantiser made 0"):
        quantize_int8(export_model(c, R.init_params(c)))


@pytest.mark.parametrize("which", ["block", "block-without-a-padding-mask", "prefill", "decode_step", "int8"])
def test_check_against_spec_runs_each_model_as_it_is_meant_to_run(which):
    """The error `odeattn export` prints: small for every exact model, the int8 one's lossy."""
    from odeattn.export.block import export_decode_model, export_prefill_model

    c = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="heun", ode_steps=2)
    params = R.init_params(c, seed=1)
    model = {"block": lambda: export_model(c, params),
             "block-without-a-padding-mask": lambda: export_model(c, params, padding_mask=False),
             "prefill": lambda: export_prefill_model(c, params),
             "decode_step": lambda: export_decode_model(c, params),
             "int8": lambda: quantize_int8(export_model(c, params))}[which]()
    err = check_against_spec(model, c, params)
    assert (1e-5 < err < 1e-2) if which == "int8" else err < 1e-5, err

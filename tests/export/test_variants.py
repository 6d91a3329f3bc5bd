"""Variants in the ONNX export: each of the spec's example variants exports at opset 17 and
equals the spec (the block, and a generation through the prefill and decode-step models); a
variant whose stage uses an operation the export cannot express is refused, naming the stage
and the operation."""

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R
from odeattn.conformance.cases import decode_loop, run_decode
from odeattn.conformance.cases.fair import make_inputs
from odeattn.conformance.cases.tolerance import relative_error, tolerance
from odeattn.export.block import check, decode_names, export_decode_model, export_model, export_prefill_model
from odeattn.export.runtime import session

VARIANTS = pytest.mark.parametrize("variant", R.VARIANTS, ids=lambda v: v.__name__)
CONFIGS = [
    dict(hidden_size=12, num_heads=3, ode_solver="rk4", ode_steps=3, ode_use_pe=True),
    dict(hidden_size=8, num_heads=2, mode="decoder", ode_solver="rk2_gated", ode_steps=2, use_bitnet=True,
         ode_use_pe=True, positional_encoding="alibi"),
]


def within_float32(got, cfg, params, x, mask, attention):
    """The suite's float32 rule: tolerance derived from the spec's own float32 error."""
    want = R.ode_block(params, x, cfg, mask, attention=attention)
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask, attention=attention), want)
    return relative_error(got, want) <= tolerance(e32, "float32")


@VARIANTS
@pytest.mark.parametrize("fields", CONFIGS, ids=["encoder-rope", "decoder-gated-bitnet-alibi"])
def test_each_variant_exports_and_equals_the_spec(variant, fields):
    cfg = R.ODEConfig(**fields)
    params = R.init_params(cfg, seed=2, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 2, 6, seed=2, padding=True)
    model = export_model(cfg, params, attention=variant(cfg))
    check(model)
    z = session(model).run(["z"], {"x": x.astype(np.float32), "padding_mask": mask})[0]
    assert within_float32(z, cfg, params, x, mask, variant(cfg))


@VARIANTS
def test_each_variant_decodes_in_onnxruntime(variant):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_steps=2, ode_use_pe=True)
    params = R.init_params(cfg, seed=3, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 2, 7, seed=3, padding=True, decoded=4)
    att = variant(cfg)
    prefill, decode = (session(f(cfg, params, attention=att)) for f in (export_prefill_model, export_decode_model))
    past, present = decode_names(cfg)
    state = {}

    def run_prefill(x, m, n):
        z, *rest = prefill.run(["z", *present], {"x": x.astype(np.float32), "padding_mask": m, "max_len": np.array(n)})
        state.update(zip(past, rest), index=x.shape[1])
        return z, None

    def run_step(x_t, _):
        index = state["index"]
        z, *rest = decode.run(["z", *present], {"x_t": x_t.astype(np.float32), "index": np.array(index), **{k: state[k] for k in past}})
        state.update(zip(past, rest), index=index + 1)
        return z, None

    got = decode_loop(run_prefill, run_step, x, mask, 3)
    want = run_decode(cfg, params, x, mask, 3, attention=att)
    e32 = relative_error(run_decode(cfg, params, x.astype(np.float32), mask, 3, attention=att), want)
    assert relative_error(got, want) <= tolerance(e32, "float32")


class Cumulative(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        mask = super().build_mask(seq_len, padding_mask, cache_index=cache_index)
        return np.cumsum(mask, axis=-1) > 0  # np.cumsum: no ONNX form in the export


class ModuleHelper(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = R.attention.slot_indices(seq_len, cache_index)  # the module's NumPy helper, not self.slot_indices
        return self.hide_keys(super().build_mask(seq_len, padding_mask, cache_index=cache_index), j <= i)


class NumpyWhere(R.SelfAttention):
    """Written for the spec alone (np.where, np.sqrt): still exports, the Values answer NumPy.
    (A float compared with a constant takes a float constant, 0.0: an int is int64 in the graph.)"""

    def output_proj(self, w_out, y):
        y = super().output_proj(w_out, y)
        return np.where(y > 0.0, np.sqrt(np.abs(y) + 1.0), y)


@pytest.mark.parametrize("variant, kwargs, error, message", [
    pytest.param(Cumulative, {}, NotImplementedError, r"attention: the variant Cumulative's stage build_mask cannot be exported: "
                                                      r"np.cumsum: has no ONNX form in this export \(it has: .*sqrt",
                 id="numpy-function-with-no-onnx-form"),
    pytest.param(ModuleHelper, {}, NotImplementedError,
                 "attention: the variant ModuleHelper's stage build_mask cannot be exported: ", id="the-modules-numpy-helper"),
    pytest.param(R.TiedKeysAttention, dict(opset=23), ValueError, r"opset: a variant \(TiedKeysAttention\) exports at opset 17, .*; got 23",
                 id="a-variant-at-opset-23"),
])
def test_a_variant_the_export_cannot_express_is_refused_by_stage_and_operation(variant, kwargs, error, message):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    params = R.init_params(cfg)
    with pytest.raises(error, match=message):
        export_model(cfg, params, attention=variant(cfg), **kwargs)


class DiagonalOrFirst(R.SelfAttention):
    """==, != and a positional reduction axis, as NumPy takes them: each query sees keys j == i
    and j == 0 (j != seq_len never holds: != in the graph too)."""

    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        i, j = self.slot_indices(seq_len, cache_index)
        visible = ((i == j) | (j == 0)) & (j != seq_len)
        return self.hide_keys(super().build_mask(seq_len, padding_mask, cache_index=cache_index), visible)

    def postprocess_attn(self, y, padding_mask=None):
        y = super().postprocess_attn(y, padding_mask)
        return y - np.mean(y, -1, keepdims=True) * 0.5


def exports_within_float32(cfg, variant, seed: int) -> bool:
    """The variant's block exported (checked) and run in ONNX Runtime on a (2, 5, d) batch agrees
    with the spec within the float32 tolerance."""
    params = R.init_params(cfg, seed=seed)
    x = np.random.default_rng(seed).normal(size=(2, 5, cfg.hidden_size))
    model = export_model(cfg, params, attention=variant(cfg), padding_mask=False)
    check(model)
    z = session(model).run(["z"], {"x": x.astype(np.float32)})[0]
    return within_float32(z, cfg, params, x, None, variant(cfg))


@pytest.mark.parametrize("mode", ["encoder", "decoder"])
def test_equality_and_positional_axes_export_as_numpy_reads_them(mode):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode=mode)
    assert exports_within_float32(cfg, DiagonalOrFirst, seed=4)


def test_a_numpy_variant_of_the_spec_exports():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    assert exports_within_float32(cfg, NumpyWhere, seed=1)

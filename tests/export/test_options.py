"""ExportOptions (export/options.py): the form of an exported model as one frozen object, every rule
of its fields checked when it is built, each refusal naming the field, what it takes and what it
got; importable without onnx, since `odeattn export` builds one before onnx is imported."""

import subprocess
import sys

import numpy as np
import pytest

from odeattn.export.options import EXPORT_DTYPES, ExportOptions, OptionError


@pytest.mark.parametrize("fields, field, message", [
    pytest.param(dict(graph="encoder"), "graph", "graph: expected one of block, prefill, decode_step; got 'encoder'",
                 id="unknown-graph"),
    pytest.param(dict(opset=19), "opset", "opset: expected one of (17, 23); got 19", id="unknown-opset"),
    pytest.param(dict(bitlinear="int8"), "bitlinear", "bitlinear: expected one of 'float', 'integer'; got 'int8'",
                 id="unknown-bitlinear-form"),
    pytest.param(dict(dtype="float64"), "dtype", "dtype: expected one of float32, float16, bfloat16; got 'float64'",
                 id="the-spec-s-dtype"),
    pytest.param(dict(keep_io_types=True), "keep_io_types",
                 "keep_io_types: applies to a half dtype (float16, bfloat16); got dtype='float32'", id="keep-io-types-in-float32"),
    pytest.param(dict(functions=True, steps_input=True), "functions", "functions: the Loop form has no local functions; "
                 "its step is written out once, in the Loop's body; got steps_input=True", id="functions-with-the-loop-form"),
    pytest.param(dict(graph="prefill", dtype="bfloat16"), "dtype", "dtype: the prefill model is exported in float32 only "
                 "(its cache arrays are float32 inputs and outputs); got 'bfloat16'", id="half-prefill-model"),
    pytest.param(dict(graph="decode_step", steps_input=True), "steps_input", "steps_input: the decode_step model keeps a "
                 "fixed step count (its cache holds one slot per evaluation, ode_steps x stages); got graph='decode_step'",
                 id="loop-form-of-the-decode-step-model"),
    pytest.param(dict(graph="prefill", bitlinear="integer"), "bitlinear",
                 "bitlinear: the prefill model has the float form only; got 'integer'", id="integer-prefill-model"),
    *(pytest.param(dict(graph="prefill", **{name: True}), name,
                   f"{name}: expected the block model of the direct route; got graph='prefill'", id=f"{name}-of-the-prefill-model")
      for name in ("functions", "diagnostics", "stages")),
    pytest.param(dict(graph="decode_step", padding_mask=False), "padding_mask", "padding_mask: expected the block or prefill "
                 "model; the decode-step model's padding_mask is the cache's record of which slots hold real tokens, not "
                 "an input to omit; got graph='decode_step'", id="decode-step-model-without-its-padding-mask"),
    pytest.param(dict(graph="prefill", opset=23), "opset",
                 "opset: the prefill and decode-step models are exported at opset 17; got 23", id="prefill-model-at-opset-23"),
])
def test_a_form_the_export_does_not_make_is_refused_naming_the_field(fields, field, message):
    with pytest.raises(OptionError) as err:
        ExportOptions(**fields)
    assert str(err.value) == message and err.value.field == field
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("name", ["padding_mask", "steps_input", "functions", "keep_io_types", "diagnostics", "stages"])
def test_a_flag_that_is_not_a_bool_is_refused_by_name(name):
    """steps_input='no' would otherwise be true: each flag takes True or False (np.bool_ too)."""
    with pytest.raises(TypeError, match=rf"^{name}: expected True or False; got 'no' \(str\)$"):
        ExportOptions(**{name: "no"})


def test_the_options_are_frozen_and_compare_by_value():
    options = ExportOptions(steps_input=np.bool_(True), diagnostics=True)
    assert options == ExportOptions(steps_input=True, diagnostics=True) and type(options.steps_input) is bool
    assert hash(options) == hash(ExportOptions(steps_input=True, diagnostics=True))
    with pytest.raises(AttributeError):
        options.opset = 23
    assert ExportOptions().replace(dtype="float16").half and not ExportOptions().half


def test_of_takes_the_object_or_its_fields_and_checks_a_replacement_again():
    base = ExportOptions(opset=23)
    assert ExportOptions.of(base) is base
    assert ExportOptions.of(None, opset=23) == base
    assert ExportOptions.of(base, padding_mask=False) == ExportOptions(opset=23, padding_mask=False)
    with pytest.raises(OptionError, match="^functions: the Loop form"):
        ExportOptions.of(ExportOptions(steps_input=True), functions=True)
    with pytest.raises(TypeError, match="^options: expected an ExportOptions; got dict$"):
        ExportOptions.of({"opset": 23})


@pytest.mark.parametrize("dtype, exported", [("float32", "float32"), ("float64", "float32"), ("bfloat16", "bfloat16")])
def test_for_case_is_a_conformance_case_s_diagnostic_block_model_in_this_form(dtype, exported):
    loop = ExportOptions(steps_input=True)
    case = loop.for_case(padding_mask=False, dtype=dtype, stages=True)
    assert case == ExportOptions(steps_input=True, padding_mask=False, diagnostics=True, stages=True, dtype=exported)
    assert exported in EXPORT_DTYPES


def test_the_options_import_no_onnx():
    """`odeattn export` imports them when it is registered, where no onnx may be imported."""
    code = "import sys, odeattn.export.options; print(sorted(m for m in ('onnx', 'onnxruntime') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

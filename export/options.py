"""The form of an exported model as one frozen object, and the one set of rules its fields obey.

ExportOptions names which model (graph: the block, or the cached decoding's prefill and
decode-step models) and in which form: opset, the padding_mask input, the Loop form
(steps_input), local functions, BitLinear's products, the dtype and its io types, and the
diagnostic and stage outputs the conformance suite reads. Building one checks every field and
every combination, before any work: OptionError (a ValueError) names the field, what it takes
and what it got; a flag that is not a bool is a TypeError naming it (ode_ref.block.check_flag).

What depends on the config, the parameters or a variant (BitLinear's integer form needs
use_bitnet, cached decoding a decoder, a variant opset 17, float16 a weight within its range) is
checked by export.block.check_export, which takes these options.

This module imports no onnx: `odeattn export` builds its options from its flags when the
command is registered and run, before onnx is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ode_ref.block import check_flag
from ode_ref.multistep import MULTISTEP
from ode_ref.precision import HALF_DTYPES

GRAPHS = ("block", "prefill", "decode_step")  # the graphs export_model builds: the block, the cached decoding's two models
OPSETS = (17, 23)
DEFAULT_OPSET = 17
CACHED_OPSET = 17  # the prefill and decode-step models' only opset
EXPORT_DTYPES = ("float32", *HALF_DTYPES)  # the dtypes an export has (the spec's float64 is not one)
BITLINEAR_FORMS = ("float", "integer")  # BitLinear's products: dequantised float MatMuls, or exact integer ones (export.bitlinear)
FLAGS = ("padding_mask", "steps_input", "steps_default", "functions", "keep_io_types", "diagnostics", "stages")


class OptionError(ValueError):
    """A form the export does not make: `field` (ExportOptions's), what it takes (`expected`, in
    words) and `got`: {field: its value} when the value alone is refused, else the other fields'
    values it conflicts with. The message reads "field: expected; got received"; a command
    renders the same parts in its own flags (odeattn.commands.export)."""

    def __init__(self, field: str, expected: str, got: dict):
        self.field, self.expected, self.got = field, expected, dict(got)
        super().__init__(f"{field}: {expected}; got {self.received()}")

    def received(self, value=repr, other=lambda name, value: f"{name}={value!r}", sep: str = ", ") -> str:
        """got in words: value(v) of the field's own value, or other(name, v) of each other field, joined by sep."""
        if list(self.got) == [self.field]:
            return value(self.got[self.field])
        return sep.join(other(name, v) for name, v in self.got.items())


def check_export_dtype(dtype, *, name: str = "dtype") -> str:
    """dtype, if the export has it (float32, float16, bfloat16); OptionError naming the field otherwise."""
    if not isinstance(dtype, str) or dtype not in EXPORT_DTYPES:
        raise OptionError(name, f"expected one of {', '.join(EXPORT_DTYPES)}", {name: dtype})
    return dtype


@dataclass(frozen=True)
class ExportOptions:
    """The model to export and its form, checked when built (OptionError, TypeError for a flag).

    graph: "block" (default), "prefill" or "decode_step" (export.block's module docstring says
    each model's inputs and outputs); the cached models are float32, opset 17, unrolled, float
    BitLinear, and the decode-step model's padding_mask is the cache's, never omitted.
    opset: 17 (default) or 23. padding_mask: the model has that input (False: every token real).
    steps_input: the Loop form (export.loop), its step count an input; not with functions.
    steps_default: the Loop form's steps input stores the config's ode_steps as its default (True);
    False: steps is a required input, which OpenVINO and IREE keep an input (a stored default they
    fold into a constant, so the file runs its default whatever is fed).
    functions: the steps kept as model-local functions (default: inlined, every step written out).
    bitlinear: "float" (default) or "integer", BitLinear's products (export.bitlinear).
    dtype: "float32" (default), "float16" or "bfloat16" (export.half); keep_io_types: with a half
    dtype, x and the outputs typed float32. diagnostics: the outputs f0 and each step's state;
    stages: f(0, x)'s stage values (the conformance suite's diagnostic outputs).
    """

    graph: str = "block"
    opset: int = DEFAULT_OPSET
    padding_mask: bool = True
    steps_input: bool = False
    steps_default: bool = True
    functions: bool = False
    bitlinear: str = "float"
    dtype: str = "float32"
    keep_io_types: bool = False
    diagnostics: bool = False
    stages: bool = False

    def __post_init__(self):
        if not isinstance(self.graph, str) or self.graph not in GRAPHS:
            raise OptionError("graph", f"expected one of {', '.join(GRAPHS)}", {"graph": self.graph})
        for name in FLAGS:  # np.bool_ stored as bool, so that equal options compare and hash equal
            object.__setattr__(self, name, check_flag(name, getattr(self, name)))
        if self.opset not in OPSETS:
            raise OptionError("opset", f"expected one of {OPSETS}", {"opset": self.opset})
        if self.bitlinear not in BITLINEAR_FORMS:
            raise OptionError("bitlinear", f"expected one of {', '.join(map(repr, BITLINEAR_FORMS))}",
                              {"bitlinear": self.bitlinear})
        check_export_dtype(self.dtype)
        if self.keep_io_types and not self.half:
            raise OptionError("keep_io_types", f"applies to a half dtype ({', '.join(HALF_DTYPES)})", {"dtype": self.dtype})
        if self.graph != "block":
            self._check_cached()
        if not self.steps_default and not self.steps_input:
            raise OptionError("steps_default", "applies to the Loop form (its steps input); the unrolled form takes no "
                              "steps", {"steps_input": False})
        if self.functions and self.steps_input:
            raise OptionError("functions", "the Loop form has no local functions; its step is written out once, "
                              "in the Loop's body", {"steps_input": True})

    def _check_cached(self) -> None:
        """The prefill and decode-step models' rules: what they refuse, by field."""
        graph = {"graph": self.graph}
        if self.half:
            raise OptionError("dtype", f"the {self.graph} model is exported in float32 only (its cache arrays are "
                              "float32 inputs and outputs)", {"dtype": self.dtype})
        if self.steps_input:
            raise OptionError("steps_input", f"the {self.graph} model keeps a fixed step count (its cache holds one "
                              "slot per evaluation, ode_steps x stages)", graph)
        if self.bitlinear != "float":
            raise OptionError("bitlinear", f"the {self.graph} model has the float form only", {"bitlinear": self.bitlinear})
        for name in ("functions", "diagnostics", "stages"):
            if getattr(self, name):
                raise OptionError(name, "expected the block model of the direct route", graph)
        if self.graph == "decode_step" and not self.padding_mask:
            raise OptionError("padding_mask", "expected the block or prefill model; the decode-step model's "
                              "padding_mask is the cache's record of which slots hold real tokens, not an input to omit",
                              graph)
        if self.opset != CACHED_OPSET:
            raise OptionError("opset", f"the prefill and decode-step models are exported at opset {CACHED_OPSET}",
                              {"opset": self.opset})

    @property
    def half(self) -> bool:
        """Whether the model is exported in a half dtype (export.half's policy)."""
        return self.dtype != "float32"

    @classmethod
    def of(cls, options: ExportOptions | None = None, **form) -> ExportOptions:
        """options with the keywords form replacing those fields, or without options the
        options of form: what an export function that takes either (export.block) is given."""
        if options is None:
            return cls(**form)
        if not isinstance(options, cls):
            raise TypeError(f"options: expected an ExportOptions; got {type(options).__name__}")
        return options.replace(**form) if form else options

    def replace(self, **changes) -> ExportOptions:
        """These options with the fields changes names changed, checked again."""
        return dataclasses.replace(self, **changes)

    def for_case(self, *, padding_mask: bool, dtype: str = "float32", stages: bool = False,
                 diagnostics: bool = True) -> ExportOptions:
        """The block model of a conformance case in this form: a padding_mask input if the case has a
        mask, the diagnostic outputs (f0, each step's state) unless diagnostics=False, f(0, x)'s
        stage values if asked, and the case's dtype where the export has it (a half one; float64
        cases run the float32 file)."""
        return self.replace(graph="block", padding_mask=padding_mask, diagnostics=diagnostics, stages=stages,
                            dtype=dtype if dtype in EXPORT_DTYPES else "float32")


def loop_refusal(options: ExportOptions, config):
    """Why the Loop form (options.steps_input) cannot hold config's block, or None: its body is one
    RK step, and a multistep solver carries its past evaluations from step to step."""
    name = getattr(config, "ode_solver", None)
    if options.steps_input and name in MULTISTEP:
        return f"the Loop form's body is one RK step; ode_solver {name!r} carries its past evaluations from step to step"
    return None

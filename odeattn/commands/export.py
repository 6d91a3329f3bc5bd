"""`odeattn export`: a block's config and weights in, an .onnx file out, checked against the spec
on a random batch; with --target, another runtime's artifact (export_targets.py)."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from pathlib import Path

from ode_ref.cache import evaluations

from ode_ref.files import replacing
from odeattn.commands.args import CommandFailed, UsageError, add_force, check_output_path, require, user_input
from odeattn.commands.export_targets import (ONNX_RUNTIMES, TARGETS, check_in_runtime, check_onnx_target, inputs_of,
                                             run_target)
from odeattn.commands.inputs import load_block, unused_encoding
from odeattn.export.from_torch import TORCH_OPSETS
from odeattn.export.options import EXPORT_DTYPES, OPSETS, ExportOptions, OptionError  # no onnx: registering imports none

DEPLOY_OPTIONS = ("quantize", "optimize")  # ONNX Runtime's tools on the written block model, not its form
def register(sub) -> None:
    p = sub.add_parser("export", help="export a block (config + weights) to ONNX",
                       description="`odeattn export` (config and weights in, .onnx out) and `odeattn run` (an exported "
                                   "model on inputs from .npy files or a random batch).")
    p.add_argument("--config", required=True, type=Path, help="JSON file with the ODEConfig fields")
    p.add_argument("--weights", required=True, type=Path, help=".safetensors or .npz with the spec's parameter names")
    p.add_argument("-o", "--output", type=Path,
                   help="the .onnx file to write (required but with --genai), with --target openvino or tract too; "
                        "with --target jax, a .jaxexport file; "
                        "with --target iree, a .vmfb file; with --target aoti, a .pt2 file; with --target executorch, a .pte file; "
                        "with --target litert, a .tflite file")
    add_force(p)
    p.add_argument("--target", choices=TARGETS, default="onnx",
                   help="onnx (default): an ONNX file, for ONNX Runtime and the runtimes that read ONNX; openvino, "
                        "tract: the block's ONNX file in a form that runtime runs, checked there too (OpenVINO with "
                        "its float32 hint); jax: the "
                        "block as jax.export's serialized StableHLO program, batch and sequence symbolic, run by jax "
                        "alone; iree: the ONNX file compiled by IREE for this CPU, an IREE module; aoti: the torch port compiled "
                        "by AOTInductor for this CPU, a .pt2 package for torch's runtime; executorch: the torch port "
                        "lowered to ExecuTorch's portable operators, a .pte program; litert: the torch port converted by "
                        "litert-torch at one batch and sequence, a .tflite model (docs/deployment.md)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="with --target executorch: the largest batch the program takes (its memory is planned for it; "
                        "default 16)")
    p.add_argument("--max-seq", type=int, default=None,
                   help="with --target executorch: the longest sequence the program takes (default 512)")
    p.add_argument("--batch", type=int, default=None,
                   help="with --target litert: the batch the model holds (its shapes are fixed; default 1)")
    p.add_argument("--seq", type=int, default=None,
                   help="with --target litert: the sequence length the model holds (default 128)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="with --target jax and rope, sinusoidal_rotary or hope: the most positions a sequence holds "
                        "(the program's angle tables are made when it is traced; seq <= N is checked at every call)")
    p.add_argument("--platforms", default="cpu", metavar="LIST",
                   help="with --target jax: the backends the program is lowered for, comma-separated among cpu, cuda, "
                        "rocm and tpu (default cpu); lowering needs no such device here")
    p.add_argument("--opset", type=int, default=None, choices=sorted({*OPSETS, *TORCH_OPSETS}),
                   help="direct route: 17 (default) or 23; torch route: 18 (default) or 23")
    p.add_argument("--no-padding-mask", action="store_true",
                   help="omit the padding_mask input (block and prefill models: every token real); "
                        "not with --decode, whose padding_mask is the cache's")
    p.add_argument("--route", choices=["direct", "torch"], default="direct",
                   help="direct: built from the spec with onnx's helpers (default); torch: torch.onnx.export")
    graph = p.add_mutually_exclusive_group()  # which graph: the block (none given), or one of these
    graph.add_argument("--prefill", action="store_true",
                      help="the prefill model: the prompt's z and the KV cache it leaves (decoder mode, opset 17)")
    graph.add_argument("--decode", action="store_true",
                      help="the decode-step model: one token and the cache in, its z and the new cache out "
                           "(decoder mode, opset 17)")
    graph.add_argument("--genai", type=Path, metavar="DIR",
                      help="a language model (an LMConfig, `odeattn init --lm`) as DIR/model.onnx and "
                           "DIR/genai_config.json, the folder ONNX Runtime GenAI generates from (docs/generation.md)")
    p.add_argument("--shared-buffer", action="store_true",
                   help="with --genai: GenAI's past_present_share_buffer form, each cache layer written in place "
                        "by TensorScatter (opset 24)")
    p.add_argument("--bitlinear", choices=["float", "integer"], default="float",
                   help="with use_bitnet, BitLinear's products: float (default), dequantised weights and float MatMuls; "
                        "integer, exact int8 MatMulInteger on the ternary weights times one float scale per token "
                        "(block model of the direct route)")
    p.add_argument("--steps-input", action="store_true",
                   help="the Loop form: one file for any number of steps, an int64 input 'steps' (default: the "
                        "config's ode_steps) that odeattn run --steps sets (block model of the direct route)")
    p.add_argument("--steps-required", action="store_true",
                   help="with --steps-input: no stored default for 'steps', a required input (OpenVINO and IREE fold "
                        "a stored default into a constant, so such a file runs its default whatever is fed)")
    p.add_argument("--dtype", choices=EXPORT_DTYPES, default="float32",
                   help="float32 (default); float16 or bfloat16: ode_ref.precision's half-precision policy, weights "
                        "stored in that dtype, x and z typed in it, float32 between its rounding points "
                        "(block model of the direct route)")
    p.add_argument("--keep-io-types", action="store_true",
                   help="with a half --dtype: x and z typed float32 (x rounded to the dtype on entry, z on exit)")
    p.add_argument("--functions", action="store_true",
                   help="write the steps as calls of model-local functions: a file that stays flat in the steps (the "
                        "same z), which onnxruntime's quantize_dynamic and transformers optimizer do not read; the "
                        "default writes every step out")
    p.add_argument("--quantize", choices=["int8"],
                   help="int8: onnxruntime's dynamic quantisation of the four projections, on the inlined graph; "
                        "lossy, so not a conformance backend (float weights only: not with use_bitnet)")
    p.add_argument("--optimize", action="store_true",
                   help="also write the graph ONNX Runtime runs after its optimisations, as <output>.optimized.onnx "
                        "(it may hold kernels specific to this machine's CPU)")


def check_options(args):
    """(config, params, opset, the ExportOptions of the direct route or None for the torch route)
    once the inputs are read and every option applies; UsageError naming the option that is
    refused, before any work. The form's rules are ExportOptions' and check_export's, their
    errors named by this command's options (as_option)."""
    check_output_path("-o", args.output, ".onnx", force=args.force, others=inputs_of(args))
    allowed = {"direct": OPSETS, "torch": TORCH_OPSETS}[args.route]
    opset = args.opset or allowed[0]
    if opset not in allowed:
        raise UsageError(f"--opset: the {args.route} route exports opset {' or '.join(map(str, allowed))}; got {opset}")
    form = form_of(args)
    options = None
    if args.route == "torch":
        check_torch_route(form)
    else:
        options = checked(lambda: ExportOptions(opset=opset, **form), form)
    config, params = load_block(args.config, args.weights)
    check_deploy_options(args, config)
    if options is None:
        require("torch")  # main() names the extra that installs it
    else:
        from odeattn.export.block import check_export

        checked(lambda: check_export(config, params, options), form)
    return config, params, opset, options


def form_of(args) -> dict:
    """ExportOptions' fields as this command's options set them, but the opset (the route's)."""
    return {"graph": "prefill" if args.prefill else "decode_step" if args.decode else "block",
            "padding_mask": not args.no_padding_mask, "steps_input": args.steps_input,
            "steps_default": not args.steps_required, "functions": args.functions,
            "bitlinear": args.bitlinear, "dtype": args.dtype, "keep_io_types": args.keep_io_types}


# ExportOptions' fields, as this command's options
OPTIONS = {"opset": "--opset", "padding_mask": "--no-padding-mask", "steps_input": "--steps-input",
           "steps_default": "--steps-required",
           "functions": "--functions", "bitlinear": "--bitlinear", "dtype": "--dtype", "keep_io_types": "--keep-io-types"}
GRAPH_OPTIONS = {"prefill": "--prefill", "decode_step": "--decode"}


def option_of(field: str, value) -> str:
    """The option that sets field: for the graph, the one that picks its model."""
    return GRAPH_OPTIONS.get(value, "the block model") if field == "graph" else OPTIONS.get(field, field)


def typed(field: str, value) -> str:
    """field = value as the options a user types: --steps-input, --no-padding-mask, --decode, --dtype float16;
    a flag at its default as the option not given ("no --steps-input")."""
    if field == "graph":
        return option_of(field, value)
    if isinstance(value, bool):
        return option_of(field, value) if value != getattr(ExportOptions(), field) else f"no {option_of(field, value)}"
    return f"{option_of(field, value)} {value}"


def checked(call, form: dict):
    """call(), its ValueError or TypeError as a usage error naming this command's options."""
    try:
        return call()
    except (ValueError, TypeError) as err:
        raise as_option(err, form) from None


def as_option(err: Exception, form: dict) -> UsageError:
    """A library's error ("field: ...") as a usage error naming the option that sets the field;
    an OptionError's conflicting fields named as typed (--steps-input, --decode)."""
    if isinstance(err, OptionError):
        got = err.received(other=typed, sep=" ")
        return UsageError(f"{option_of(err.field, form.get(err.field))}: {err.expected}; got {got}")
    name, sep, rest = str(err).partition(": ")
    return UsageError(f"{OPTIONS[name]}: {rest}" if sep and name in OPTIONS else str(err))


def run(args) -> int:
    if args.target not in ("onnx", *ONNX_RUNTIMES):
        return run_target(args)
    check_onnx_target(args)
    import onnx

    from odeattn.export.deploy import check_against_spec, node_counts

    if args.genai is not None:
        from odeattn.commands.genai import export_genai

        return export_genai(args)
    if args.shared_buffer:
        raise UsageError("--shared-buffer: applies to --genai DIR (the GenAI folder's in-place cache form)")
    if args.output is None:
        raise UsageError("-o/--output: required (the .onnx file to write)" + (", except with --genai DIR" if args.target == "onnx" else ""))
    with user_input():
        config, params, opset, options = check_options(args)
    warning = unused_encoding(config)
    if warning:
        print(f"odeattn export: {warning}", file=sys.stderr)
    if args.prefill or args.decode:
        return export_cached(args, config, params, options)
    notes = write_block(args, config, params, opset, options)
    model = onnx.load(str(args.output))
    err = check_against_spec(model, config, params)
    stored, executed = node_counts(model)
    spec = "ode_ref (float64)" if args.dtype == "float32" else f"ode_ref.precision.half_block ({args.dtype})"
    if not err < float("inf"):  # NaN or Inf: the file is no model of the spec; it is not left behind
        args.output.unlink()
        raise CommandFailed(f"--dtype {args.dtype}: the model's own check against {spec} gives a relative error of "
                            f"{err} (its z overflowed); {args.output} not written; use bfloat16 or float32")
    print(f"wrote {args.output}: {args.output.stat().st_size / 1e3:.1f} kB, opset {opset}, "
          f"{stored} nodes stored ({executed} executed after inlining), "
          f"max relative error vs {spec} on a random batch (2 x 8): {err:.2e}")
    if args.optimize:
        notes.append(write_optimized(args.output))
    for note in notes:
        print(f"  {note}")
    return 0


def write_block(args, config, params, opset: int, options) -> list[str]:
    """Write the block model to --output, by its route (options None: the torch route, at opset)
    and in its form; the notes to print."""
    if args.route == "torch":
        from odeattn.backends.torch import ODEAttentionBlock
        from odeattn.export.from_torch import export_torch

        print(f"exporting through torch.onnx.export: it traces each of the {evaluations(config)} evaluations of f, "
              "which takes tens of seconds", file=sys.stderr, flush=True)
        with quiet_torch_export():
            with replacing(args.output) as tmp:
                export_torch(ODEAttentionBlock.from_params(config, params), tmp, opset=opset)
        return []
    from odeattn.export.block import check, export_model

    model = export_model(config, params, options)
    check(model)
    try:
        model, notes = deploy_form(model, args)
    except RuntimeError as err:  # the quantiser left a projection in float: no file rather than a wrong one
        raise CommandFailed(str(err)) from None
    if args.target in ONNX_RUNTIMES:  # checked in the runtime before anything is written
        notes.append(check_in_runtime(args, model, config, params))
    write_model(model, args.output)
    if options.bitlinear == "integer":
        from odeattn.export.deploy import PROJECTIONS

        notes.append(f"integer BitLinear: {PROJECTIONS} projections x {evaluations(config)} evaluations as exact MatMulInteger "
                     "(uint8 levels, int8 ternary weights) times one float scale per token; weights stored as int8 only")
    if options.half:
        io = "float32 (holding its values)" if options.keep_io_types else options.dtype
        notes.append(f"{options.dtype}: weights stored in {options.dtype}, x and z typed {io}; float32 between the "
                     "policy's rounding points (ode_ref.precision)")
    if options.steps_input:
        default = f"default {config.ode_steps}" if options.steps_default else "required, no default"
        notes.append(f"Loop form: input 'steps' (int64, {default}) sets the step count at run time "
                     "(odeattn run --steps N); the file holds one step")
    elif options.functions:
        notes.append(LOCAL_FUNCTIONS_NOTE)
    return notes


def write_model(model, path: Path) -> None:
    """The model's bytes to path, whole or not at all."""
    with replacing(path) as tmp:
        tmp.write_bytes(model.SerializeToString())


LOCAL_FUNCTIONS_NOTE = ("local functions: onnxruntime's quantize_dynamic and transformers optimizer do not look inside "
                        "them (nothing gets quantised or fused); for those tools export without --functions")


@contextlib.contextmanager
def quiet_torch_export():
    """torch.onnx.export's messages that are not the user's business, silenced for the call only:
    its registry's "torchvision is not installed" (a log line per torchvision operator), torch's
    own use of its deprecated pytree LeafSpec (a FutureWarning), and that the batch and seq
    axes shared by x and padding_mask keep their one name (a UserWarning)."""
    from odeattn.export.torch_program import quiet

    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with quiet(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"# The axis name: \w+ will not be used, since it shares the same shape "
                                    r"constraints with another axis", UserWarning, r"torch\.onnx")
            yield
    finally:
        registry.setLevel(level)


def write_optimized(output: Path) -> str:
    """Write the optimised model beside output (--optimize); its note."""
    from odeattn.export.deploy import optimized_path, save_optimized

    optimized = optimized_path(output)
    with replacing(optimized) as tmp:
        save_optimized(output, tmp)
    return (f"optimised model: {optimized}, {optimized.stat().st_size / 1e3:.1f} kB "
            "(ONNX Runtime's graph after every optimisation; it may hold kernels specific to this machine's CPU)")


def _other_form(args) -> str | None:
    """The option that asks for something other than the direct route's block model, if any."""
    return ("--prefill" if args.prefill else "--decode" if args.decode
            else f"--route {args.route}" if args.route != "direct" else None)


def check_deploy_options(args, config) -> None:
    """UsageError naming the option unless --quantize and --optimize apply: the direct route's
    block model; for int8, float weights stored in float32 and no local functions; a writable
    path for the optimised model."""
    from odeattn.export.deploy import check_quantizable, optimized_path

    given = [f"--{o}" for o in DEPLOY_OPTIONS if getattr(args, o)]
    if not given:
        return
    other = _other_form(args)
    if other:
        raise UsageError(f"{'/'.join(given)}: expected the block model of the direct route; got {other}")
    if args.quantize:
        check_quantizable(config, name="--quantize int8")
        if args.functions:
            raise UsageError("--functions: --quantize int8 quantises the written-out graph, which has no local "
                             "functions; got --functions --quantize int8")
        if args.dtype != "float32":
            raise UsageError(f"--quantize int8: expected --dtype float32 (it quantises float32 MatMul weights); "
                             f"got --dtype {args.dtype}")
    if args.optimize:
        check_output_path("--optimize", optimized_path(args.output), ".onnx", force=args.force,
                          others={**inputs_of(args), "-o": args.output})


# Why the torch route refuses a field (default: it is the direct route's block model's)
TORCH_ROUTE = {"graph": "the direct route only", "padding_mask": "the torch route always has a padding_mask input",
               "dtype": "expected the block model of the direct route (the prefill and decode-step models, and the "
                        "torch route, export float32 only)"}


def check_torch_route(form: dict) -> None:
    """UsageError naming the first option that sets a field of form away from the default form
    (ExportOptions()): the torch route exports the float32 block with a padding_mask input and
    every step written out, only its opset chosen."""
    default = ExportOptions()
    for field, value in form.items():
        if value != getattr(default, field):
            why = TORCH_ROUTE.get(field, "expected the block model of the direct route")
            raise UsageError(f"{typed(field, value)}: {why}; got --route torch")


def deploy_form(model, args):
    """(the model to write, notes to print): the export as is, or quantised to int8 (--quantize int8)."""
    from odeattn.export.deploy import PROJECTIONS, loop_body, quantize_int8

    if args.quantize:
        int8 = quantize_int8(model)
        body = loop_body(int8)
        nodes = int8.graph.node if body is None else body.node
        return int8, [f"int8 dynamic quantisation (lossy, not a conformance backend): {PROJECTIONS} projections x "
                      f"{sum(n.op_type == 'MatMulInteger' for n in nodes) // PROJECTIONS} evaluations"
                      f"{'' if body is None else ' per step (in the Loop body)'} as "
                      f"MatMulInteger; the float export is {len(model.SerializeToString()) / 1e3:.1f} kB"]
    return model, []


def export_cached(args, config, params, options) -> int:
    """--prefill or --decode: write the model, then run it as `odeattn run` does on a random batch
    of 8 tokens (the decode-step model generating them from an empty cache) and compare with
    ode_block on the whole sequence."""
    from odeattn.export.block import check, decode_names, export_model
    from odeattn.export.deploy import check_against_spec

    model = export_model(config, params, options)
    check(model)
    write_model(model, args.output)
    err = check_against_spec(model, config, params)
    what = "the prefill of 8 tokens" if args.prefill else "8 tokens decoded one by one from an empty cache"
    print(f"wrote {args.output}: {args.output.stat().st_size / 1e3:.1f} kB, opset {options.opset}, {len(model.graph.node)} nodes, "
          f"{len(decode_names(config)[0]) - 1} cache arrays; max relative error vs ode_ref on the whole sequence, {what} "
          f"(batch 2): {err:.2e}")
    return 0

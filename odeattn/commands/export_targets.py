"""`odeattn export --target T`, the artifacts of the runtimes beside ONNX: with --target jax,
jax.export's serialized program; with iree, an IREE module; with aoti, an AOTInductor package; with
executorch, an ExecuTorch program; with litert, a LiteRT model at one shape. Each is checked
against the spec on a random batch through its own runtime before it is written, as the ONNX file
is (export.py). With openvino or tract, the ONNX file that export.py writes, in a form the runtime
runs (check_onnx_target), checked in that runtime too (check_in_runtime)."""

from __future__ import annotations

import contextlib
import sys

from ode_ref.files import replacing
from odeattn.commands.args import CommandFailed, UsageError, check_output_path, require, user_input
from odeattn.commands.inputs import load_block

TARGETS = ("onnx", "openvino", "tract", "jax", "iree", "aoti", "executorch", "litert")
# the runtimes that read the ONNX file itself: --target T writes the block's file in a form T runs,
# checked in T as well, with T's settings for exactness (export/standalone.py)
ONNX_RUNTIMES = {"openvino": "OpenVINO", "tract": "tract"}
SUFFIXES = {"jax": ".jaxexport", "iree": ".vmfb", "aoti": ".pt2", "executorch": ".pte", "litert": ".tflite"}
# the options that shape an ONNX file, each with whether it was given: none applies to another --target
ONNX_ONLY = {"--opset": lambda a: a.opset is not None, "--route": lambda a: a.route != "direct",
             "--prefill": lambda a: a.prefill, "--decode": lambda a: a.decode, "--genai": lambda a: a.genai is not None,
             "--shared-buffer": lambda a: a.shared_buffer, "--bitlinear": lambda a: a.bitlinear != "float",
             "--steps-input": lambda a: a.steps_input, "--steps-required": lambda a: a.steps_required,
             "--dtype": lambda a: a.dtype != "float32",
             "--keep-io-types": lambda a: a.keep_io_types, "--functions": lambda a: a.functions,
             "--quantize": lambda a: a.quantize is not None, "--optimize": lambda a: a.optimize}


def inputs_of(args) -> dict:
    """The files the command reads, by option: no output may be one of them."""
    return {"--config": args.config, "--weights": args.weights}


def run_target(args) -> int:
    """--target T (not the ONNX file's: onnx, openvino, tract): the options of another target refused, then
    its artifact written."""
    if args.target != "executorch":
        _executorch_only(args)
    if args.target != "litert":
        _litert_only(args)
    return {"jax": export_jax, "iree": export_iree, "aoti": export_aoti, "executorch": export_executorch,
            "litert": export_litert}[args.target](args)


# why --target openvino or tract refuses an option: the first given is named ({t}: the target, {r}: its runtime)
_CHECKED_BLOCK = "the --target {t} check runs the float32 block model in {r}; --target onnx writes the others"
RUNTIME_REFUSES = {
    "--route": lambda a: a.route != "direct", "--prefill": lambda a: a.prefill, "--decode": lambda a: a.decode,
    "--genai": lambda a: a.genai is not None, "--quantize": lambda a: a.quantize is not None,
    "--optimize": lambda a: a.optimize, "--dtype": lambda a: a.dtype != "float32",
    "--functions": lambda a: a.functions, "--steps-input": lambda a: a.steps_input and a.target == "tract"}
WHY_REFUSED = {"--functions": "{r} does not implement ONNX local functions; expected the default form",
               "--steps-input": "{r} does not implement the Loop form; expected the default form"}


def check_onnx_target(args) -> None:
    """UsageError where an option of another target is given to the ONNX file, or (--target
    openvino, tract) an option asks for a form that target does not write (RUNTIME_REFUSES); then
    the runtime's package required."""
    _executorch_only(args)
    _litert_only(args)
    _jax_only(args, "an ONNX file computes every position's angle and names no backend")
    if args.target not in ONNX_RUNTIMES:
        return
    given = next((option for option, set_ in RUNTIME_REFUSES.items() if set_(args)), None)
    if given is not None:
        why = WHY_REFUSED.get(given, _CHECKED_BLOCK).format(t=args.target, r=ONNX_RUNTIMES[args.target])
        raise UsageError(f"{given}: {why}; got --target {args.target}")
    if args.steps_input and not args.steps_required:
        raise UsageError("--steps-input: OpenVINO folds a stored steps default into a constant (the file would run its "
                         "default whatever is fed); add --steps-required")
    require(args.target)


def check_in_runtime(args, model, config, params) -> str:
    """The block model for --target openvino or tract checked as an artifact is (check_artifact),
    in that runtime with its settings (export.standalone.load_onnx), before it is written: a
    failure of the runtime itself is a CommandFailed too, in one line. The check's words."""
    from odeattn.export.runtime import make_feed
    from odeattn.export.standalone import load_onnx

    runtime, steps = ONNX_RUNTIMES[args.target], config.ode_steps if args.steps_input else None
    try:
        run = load_onnx(args.target, model)
        return f"{runtime}: " + check_artifact(args, config, params, lambda x, mask: run(make_feed(model, x, mask, steps))["z"])
    except (RuntimeError, ValueError) as err:  # tract's TractError, OpenVINO's compile and run errors
        text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise CommandFailed(f"--target {args.target}: {runtime} does not run the file ({text}); {args.output} not "
                            "written") from None


def _other_target(args, form: str) -> None:
    """UsageError where an option of the ONNX file is given to another --target (form: what the
    target writes), or -o/--output is missing."""
    given = [option for option, set_ in ONNX_ONLY.items() if set_(args)]
    if given:
        raise UsageError(f"{given[0]}: applies to --target onnx, openvino and tract; the {args.target} target writes {form}")
    if args.output is None:
        raise UsageError(f"-o/--output: required (the {SUFFIXES[args.target]} file to write)")


def _check_and_write(args, config, params, blob: bytes, run, seq: int = 8, batch: int = 2) -> str:
    """check_artifact, then blob written to -o. The check's words for the report."""
    checked = check_artifact(args, config, params, run, seq, batch)
    with replacing(args.output) as tmp:
        tmp.write_bytes(blob)
    return checked


def check_artifact(args, config, params, run, seq: int = 8, batch: int = 2) -> str:
    """The check as ONNX's (export.deploy.check_against_spec): z(1) of run(x, mask) on batch x seq
    tokens, every second row padded after 5, then the same batch padded on the left, against the
    spec in float64, within float32's tolerance for this block (the smaller of the two), or
    CommandFailed naming -o as not written. run None: no check here (the jax target lowered for no
    CPU). The check's words for the report."""
    import numpy as np

    import ode_ref as R
    from odeattn.conformance.cases.tolerance import relative_error, tolerance
    from odeattn.export import check_batch

    x, mask = check_batch(config.hidden_size, seq, padded=not args.no_padding_mask, batch=batch)
    masks = [mask] if args.no_padding_mask else [mask, mask[:, ::-1].copy()]  # the padding on the right, then the left
    wants = [R.ode_block(params, x, config, m) for m in masks]
    allowed = min(tolerance(relative_error(R.ode_block(params, x.astype(np.float32), config, m), want), "float32")
                  for m, want in zip(masks, wants))
    err = None if run is None else float(np.max([relative_error(run(x.astype(np.float32), m), want)  # NaN kept
                                                 for m, want in zip(masks, wants)]))
    if err is not None and not err <= allowed:  # NaN too: the file would be no model of the spec
        raise CommandFailed(f"--target {args.target}: the artifact's check against ode_ref (float64) gives a relative "
                            f"error of {err:.2e}, over float32's tolerance {allowed:.1e} for this block; "
                            f"{args.output} not written")
    padded = "" if args.no_padding_mask or mask.all() else ", padded on each side"
    return (f"max relative error vs ode_ref (float64) on a random batch ({batch} x {seq}{padded}): {err:.2e}" if err is not None
            else "not run here (no cpu among its platforms)")


def export_jax(args) -> int:
    """--target jax: the block as jax.export's serialized program (export/jax_program.py), checked
    against the spec on a random batch (2 x 8) through jax alone, as export checks an ONNX file."""
    _other_target(args, "the block as jax.export's program, float32, batch and sequence symbolic")
    platforms = tuple(p.strip() for p in args.platforms.split(","))
    from odeattn.export.jax_program import check_export_arguments, export_jax_block, jax_runner

    with user_input():
        check_output_path("-o", args.output, SUFFIXES["jax"], force=args.force, others=inputs_of(args))
        config, params = load_block(args.config, args.weights)
    with as_options():
        check_export_arguments(config, "float32", args.max_positions, platforms)
    require("jax")
    require("flatbuffers")  # jax.export serializes with it
    blob = export_jax_block(config, params, padding_mask=not args.no_padding_mask, max_positions=args.max_positions,
                            platforms=platforms)
    seq = min(8, args.max_positions or 8)
    checked = _check_and_write(args, config, params, blob, jax_runner(blob)
                               if "cpu" in platforms else None, seq)
    bound = f", seq <= {args.max_positions}" if args.max_positions else ""
    print(f"wrote {args.output}: {len(blob) / 1e3:.1f} kB, jax.export program for {', '.join(platforms)} (float32, "
          f"batch x seq symbolic{bound}), {checked}")
    return 0


@contextlib.contextmanager
def as_options():
    """A library's ValueError ("max_seq: ...") as a usage error naming the option (--max-seq)."""
    try:
        yield
    except ValueError as err:
        name, _, rest = str(err).partition(": ")
        raise UsageError(f"--{name.replace('_', '-')}: {rest}") from None


def _only(args, target: str, why: str, options: dict) -> None:
    """UsageError where an option of target (option -> its value, None: not given) is given to another."""
    given = next((option for option, value in options.items() if value is not None), None)
    if given is not None:
        raise UsageError(f"{given}: applies to --target {target} ({why}); got --target {args.target}")


def _executorch_only(args) -> None:
    _only(args, "executorch", "its memory is planned for the largest shapes", {"--max-batch": args.max_batch, "--max-seq": args.max_seq})


def _litert_only(args) -> None:
    _only(args, "litert", "its shapes are fixed", {"--batch": args.batch, "--seq": args.seq})


def _jax_only(args, what: str) -> None:
    """UsageError where an option of --target jax is given to another target (what: how it compiles)."""
    for option, given in (("--max-positions", args.max_positions is not None), ("--platforms", args.platforms != "cpu")):
        if given:
            raise UsageError(f"{option}: applies to --target jax; {what}")


def _compiled_target_inputs(args, form: str, how: str):
    """(config, params) for a target that compiles the block (iree, aoti, executorch) once no
    option of another target is given (form: what it writes; how: how it compiles) and -o fits."""
    _other_target(args, form)
    _jax_only(args, how)
    with user_input():
        check_output_path("-o", args.output, SUFFIXES[args.target], force=args.force, others=inputs_of(args))
        return load_block(args.config, args.weights)


def export_iree(args) -> int:
    """--target iree: the block's ONNX file (the default form) compiled by IREE for this CPU
    (export/iree_program.py), checked against the spec on a random batch through IREE's runtime."""
    config, params = _compiled_target_inputs(
        args, "the default ONNX form compiled by IREE for this CPU, float32, batch and sequence dynamic",
        "IREE compiles the ONNX file for this CPU")
    require("onnx")
    require("iree.compiler")
    require("iree.runtime")
    from odeattn.export.block import export_model
    from odeattn.export.iree_program import IreeRunner, compile_iree
    from odeattn.export.options import ExportOptions

    blob = compile_iree(export_model(config, params, ExportOptions(padding_mask=not args.no_padding_mask)))
    checked = _check_and_write(args, config, params, blob, IreeRunner(blob, config.hidden_size))
    print(f"wrote {args.output}: {len(blob) / 1e3:.1f} kB, IREE module for this CPU (float32, batch x seq dynamic), "
          f"{checked}")
    return 0


def export_aoti(args) -> int:
    """--target aoti: the torch port's block through torch.export, compiled by AOTInductor for this
    CPU into a .pt2 package (export/aoti_program.py), checked against the spec on a random batch
    through the loaded package."""
    config, params = _compiled_target_inputs(
        args, "the torch port compiled by AOTInductor for this CPU, float32, batch and sequence dynamic",
        "AOTInductor compiles the torch port for this CPU")
    require("torch")
    from odeattn.export.aoti_program import missing_compiler

    missing = missing_compiler()
    if missing:
        raise CommandFailed(f"--target aoti: AOTInductor builds the package with {missing[0]}, which is not "
                            "on the PATH; install one (Debian: apt install g++)", code=2)
    from odeattn.export.aoti_program import aoti_runner, export_aoti_block

    print("compiling with AOTInductor: it generates and builds the block's C++ kernels, which takes tens of seconds",
          file=sys.stderr, flush=True)
    blob = export_aoti_block(config, params, padding_mask=not args.no_padding_mask)
    run = aoti_runner(blob)
    checked = _check_and_write(args, config, params, blob, run)
    print(f"wrote {args.output}: {len(blob) / 1e3:.1f} kB, AOTInductor package for this CPU (float32, batch x seq "
          f"dynamic), {checked}")
    return 0


def export_executorch(args) -> int:
    """--target executorch: the torch port's block through torch.export, lowered to ExecuTorch's
    portable operators (export/executorch_program.py), batch and sequence dynamic up to
    --max-batch and --max-seq, checked against the spec on a random batch through ExecuTorch's
    runtime."""
    from odeattn.export.executorch_program import MAX_BATCH, MAX_SEQ, check_bounds

    config, params = _compiled_target_inputs(
        args, "the torch port lowered to ExecuTorch's portable operators, float32, batch and sequence dynamic up to "
              "--max-batch and --max-seq", "ExecuTorch lowers the torch port")
    bounds = {"max_batch": MAX_BATCH if args.max_batch is None else args.max_batch,
              "max_seq": MAX_SEQ if args.max_seq is None else args.max_seq}
    with as_options():
        check_bounds(**bounds)
    require("torch")
    require("executorch")
    from odeattn.export.executorch_program import executorch_runner, export_executorch_block

    print("lowering to ExecuTorch: it traces and lowers every evaluation of f, which takes tens of seconds",
          file=sys.stderr, flush=True)
    blob = export_executorch_block(config, params, padding_mask=not args.no_padding_mask, **bounds)
    checked = _check_and_write(args, config, params, blob, executorch_runner(blob))
    print(f"wrote {args.output}: {len(blob) / 1e3:.1f} kB, ExecuTorch program, portable operators (float32, batch <= "
          f"{bounds['max_batch']} x seq <= {bounds['max_seq']}), {checked}")
    return 0


def export_litert(args) -> int:
    """--target litert: the torch port's block converted by litert-torch at --batch x --seq
    (export/litert_program.py), checked against the spec on a random batch of that shape through
    LiteRT's interpreter."""
    from odeattn.export.litert_program import BATCH, SEQ, check_config, check_shape

    config, params = _compiled_target_inputs(
        args, "the torch port converted by litert-torch, float32, at one batch and sequence (--batch, --seq)",
        "litert-torch converts the torch port")
    shape = {"batch": BATCH if args.batch is None else args.batch, "seq": SEQ if args.seq is None else args.seq}
    with as_options():
        check_shape(**shape)
    with user_input("--config"):
        check_config(config)
    require("torch")
    require("litert_torch")
    require("ai_edge_litert")
    from odeattn.export.litert_program import export_litert_block, litert_runner

    print("converting with litert-torch: it traces the block and converts every evaluation of f, which takes seconds",
          file=sys.stderr, flush=True)
    blob = export_litert_block(config, params, padding_mask=not args.no_padding_mask, **shape)
    checked = _check_and_write(args, config, params, blob, litert_runner(blob), seq=shape["seq"], batch=shape["batch"])
    print(f"wrote {args.output}: {len(blob) / 1e3:.1f} kB, LiteRT model (float32, batch {shape['batch']} x seq "
          f"{shape['seq']}), {checked}")
    return 0

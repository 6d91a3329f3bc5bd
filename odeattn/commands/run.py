"""`odeattn run`: an exported model in ONNX Runtime on inputs from .npy files or a random batch;
a prefill model on all of x, a decode-step model generating x's tokens from an empty cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ode_ref.files import save_npy
from ode_ref.precision import HALF_DTYPES, check_float16_range
from odeattn.commands.args import (CommandFailed, UsageError, add_force, check_output_path, load_npy, non_negative_int,
                                   positive_int, user_input)
from odeattn.commands.inputs import load_x


def register(sub) -> None:
    r = sub.add_parser("run", help="run an exported model in onnxruntime (a decode-step model: generating "
                                   "--seq tokens from an empty cache)", description=__doc__)
    r.add_argument("model", type=Path, help="an .onnx file written by odeattn export: a block, a prefill or a "
                                            "decode-step model")
    r.add_argument("--x", type=Path, help=".npy float32 [batch, seq, d_model] (a half model's dtype too, or float32 "
                                         "rounded to it); default: a random batch")
    r.add_argument("--padding-mask", type=Path, help=".npy bool [batch, seq]")
    r.add_argument("--batch", type=positive_int, default=2, help="without --x: the random batch's batch size (default 2)")
    r.add_argument("--seq", type=positive_int, default=8,
                   help="without --x: the random batch's length, the tokens a decode-step model generates (default 8)")
    r.add_argument("--seed", type=non_negative_int, default=0, help="without --x: the random batch's seed (default 0)")
    r.add_argument("-o", "--output", type=Path, default=None, help="save z here (.npy); default: print a summary only")
    add_force(r)
    r.add_argument("--steps", type=int, default=None,
                   help="the step count, for a model exported with --steps-input (the Loop form); default: its ode_steps")
    r.add_argument("--repeats", type=positive_int, default=None,
                   help="also time N runs after one warm-up: latency median and min..max, and the session's creation")
    r.add_argument("--threads", type=non_negative_int, default=0,
                   help="ONNX Runtime's intra-op threads; default (0): every core")


def check_inputs(args, threads: int):
    """(the model's graph (block, prefill or decode_step), x, its forward, the start of its session: the seconds that took), once
    the model is read and its inputs are checked against it, before any session is built."""
    import time

    from odeattn.export.decode import OnnxDecoder, SessionRun
    from odeattn.export.runtime import block_width, load_model, make_feed, run_session, session

    check_output_path("-o", args.output, ".npy", force=args.force,
                      others={"model": args.model, "--x": args.x, "--padding-mask": args.padding_mask})
    model = load_model(args.model)
    x = load_x(args.x, block_width(model), batch=args.batch, seq=args.seq, seed=args.seed, dtype=np.float32)
    if x.dtype == np.float64:  # what np.save writes of a NumPy default array: the one-line fix
        raise UsageError(f"--x: expected dtype float32; got float64 (save it as float32: "
                         f"np.save({str(args.x)!r}, x.astype(np.float32)))")
    mask = load_npy("--padding-mask", args.padding_mask) if args.padding_mask else None
    meta = {p.key: p.value for p in model.metadata_props}
    graph = meta.get("kind", "block")  # the metadata key "kind" names the graph (ExportOptions.graph)
    check_steps_option(model, args.steps)
    if graph == "block":
        feed = make_feed(model, as_model_dtype(model, x), mask, args.steps)
        built = {}

        def start() -> float:
            begun = time.perf_counter()
            built["session"] = session(model, threads=threads)
            return time.perf_counter() - begun

        return graph, x, (lambda: run_session(built["session"], ["z"], feed)[0]), start
    runner = SessionRun(model, threads=threads)  # the feeds are checked before the session is built
    config = json.loads(meta["config"])
    if graph == "prefill":
        decoder = OnnxDecoder(config, prefill_run=runner)
        decoder.prefill_feed(x, mask)  # max_len: the prompt's length
        return graph, x, (lambda: decoder.prefill(x, mask)[0]), runner.start
    if mask is not None:
        raise UsageError("--padding-mask: a decode-step model decodes real tokens only; got a mask")
    decoder = OnnxDecoder(config, decode_run=runner)
    decoder.check_generate(x)
    return graph, x, (lambda: decoder.generate(x)), runner.start


def as_model_dtype(model, x):
    """x in a half model's dtype (export.half): float32 rounded to it, as every library converts (a
    .npy file holds no bfloat16); anything else as it is, for make_feed to check."""
    from odeattn.export.runtime import declared_inputs

    dtype = declared_inputs(model)["x"][0]
    if dtype.name in HALF_DTYPES and x.dtype == np.float32:
        try:
            check_float16_range("--x", x, dtype.name)
        except ValueError as err:
            raise UsageError(str(err)) from None
        return x.astype(dtype)
    return x


def check_steps_option(model, steps) -> None:
    """UsageError naming --steps unless it applies: an integer >= 1, for a model with a steps input;
    given, for a model whose steps input is required."""
    from odeattn.export.runtime import REQUIRED_STEPS, STEPS, check_steps, declared_inputs, default_inputs, fixed_steps

    if steps is None:
        if STEPS in declared_inputs(model):
            raise UsageError(f"--{REQUIRED_STEPS.replace('expected steps', 'expected --steps N')}")
        return
    if STEPS not in default_inputs(model) and STEPS not in declared_inputs(model):
        raise UsageError(f"--{fixed_steps(model)}; got --steps {steps}")
    try:
        check_steps(steps)
    except ValueError as err:
        raise UsageError(f"--{err}") from None  # its message begins 'steps: '


def run(args) -> int:
    import os

    threads = args.threads or os.cpu_count() or 1
    with user_input():
        graph, x, forward, start = check_inputs(args, threads)
        created = start()  # a model with an operator the CPU provider has no kernel for is refused here
    z = forward()  # also the warm-up of --repeats
    if z.dtype.name in HALF_DTYPES and np.isfinite(x).all() and not np.isfinite(np.asarray(z, np.float32)).all():
        raise CommandFailed(f"z: the {z.dtype.name} model gave NaN or Inf on a finite x: {z.dtype.name} overflowed "
                            "(float16 holds magnitudes up to 65504); run the float32 or bfloat16 export")
    summary = f"z: shape {list(z.shape)}, dtype {z.dtype}, finite {bool(np.isfinite(z).all())}, max |z| {float(np.abs(z).max()):.4g}"
    if args.output:
        saved = z if z.dtype.kind == "f" else z.astype(np.float32)  # .npy has no bfloat16: its values, in float32
        save_npy(args.output, saved)
        summary += f", saved to {args.output}" + ("" if saved is z else f" as float32 (holding its {z.dtype} values)")
    print(summary)
    if args.repeats:
        print(latency(forward, args.repeats, created, threads, graph, x.shape))
    return 0


def latency(forward, repeats: int, created: float, threads: int, graph: str, shape) -> str:
    """One line: the median and min..max of `repeats` timed forwards (after the warm-up the caller
    ran), the thread count and the session's creation time."""
    import statistics

    from odeattn.bench import measure

    times = measure(forward, warmup=0, repeats=repeats)
    what = "a forward" if graph == "block" else "the prefill" if graph == "prefill" else f"decoding {shape[1]} tokens"
    return (f"latency of {what} (batch {shape[0]}, seq {shape[1]}), {repeats} runs after 1 warm-up, threads {threads}: "
            f"median {statistics.median(times) * 1e3:.2f} ms, min..max {min(times) * 1e3:.2f}..{max(times) * 1e3:.2f} ms; "
            f"session created in {created * 1e3:.0f} ms")

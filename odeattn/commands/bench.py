"""`odeattn bench`: every execution path of the block timed interleaved in one run, against a plain
PyTorch block and this machine's own float32 matmul peak, both measured in the same run.

`odeattn bench --quick`: the same table, on the small shape only, with fewer rounds, shorter
bursts and smaller peak matmuls: still minutes, as every path is set up (torch.compile and JAX compile
first) and its memory probed in a fresh process.

`odeattn bench --decode`: the next token's z at a context of n tokens, two ways, per runtime
(torch, jax, ort): a cached decode step (the cache holds the n - 1 tokens before it) against
recomputing the block on all n tokens.

`odeattn bench --compile`: the JAX block's first call against its warm call, per solver and
steps on the small shape, each in a fresh process with JAX's persistent compilation cache off: what
a user's first call pays for compiling, and its targets.

`odeattn bench --memory`: peak activation memory and time of one forward+backward against
ode_steps (1 to 32), with and without activation checkpointing, torch and JAX.

How the bench measures (rounds, bursts, paired ratios, the peak, memory and the targets):
docs/performance-method.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import ode_ref as R
from odeattn.bench import (COMPILE_CONFIGS, DECODE_CONTEXTS, DECODE_RUNTIMES, DEFAULT_REPEATS, MEMORY_RUNTIMES, MEMORY_SHAPE, PATHS, QUICK,
                           SHAPES, TORCH_PLAIN, compile_result, decode_result, format_compile, format_decode, format_memory, format_tables, memory_result,
                           plot_memory, plot_scaling, run_bench)
from ode_ref.files import replacing, write_text
from odeattn.commands.args import (UsageError, add_force, check_output_path, comma_list, non_negative_int, positive_int,
                                   require, user_input)


def parse_shape(text: str) -> tuple:
    """(batch, seq, d_model, heads); UsageError naming --shape unless four positive integers with
    d_model a multiple of heads."""
    try:
        batch, seq, d_model, heads = (int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--shape: expected batch,seq,d_model,heads (four integers); got {text!r}") from None
    if min(batch, seq, d_model, heads) < 1 or d_model % heads:
        raise UsageError(f"--shape: expected four positive integers with d_model a multiple of heads; got {text!r}")
    return batch, seq, d_model, heads


def _check(args) -> tuple[list, dict]:
    """(the paths in PATHS' order, {label: shape}); UsageError for bad input, before any work."""
    names = comma_list("--paths", args.paths, PATHS) if args.paths else list(PATHS)
    names = [p for p in PATHS if p in names]  # PATHS' order: the compared paths side by side
    if args.plot and (args.no_scaling or args.quick):
        raise UsageError(f"--plot: the plot shows the scaling tables, which {'--quick' if args.quick else '--no-scaling'} "
                         "skips; drop one of them")
    if args.steps > R.MAX_STEPS:
        raise UsageError(f"--steps: expected at most {R.MAX_STEPS} (the config's bound on ode_steps); got {args.steps}")
    check_output_path("--json", args.json, ".json", force=args.force)
    check_output_path("--plot", args.plot, ".png", force=args.force)
    if args.plot:
        require("matplotlib")  # a missing extra is named before the work starts
    named = {shape: name for name, shape in SHAPES.items()}  # a named shape keeps its name (and targets)
    shapes = ({named.get(parse_shape(s), "x".join(map(str, parse_shape(s)))): parse_shape(s) for s in args.shape}
              if args.shape else QUICK["shapes"] if args.quick else SHAPES)
    if args.decode and args.memory:
        raise UsageError("--memory: measures training, --decode decoding; drop one of them")
    modes = [o for o, on in (("--decode", args.decode), ("--memory", args.memory), ("--compile", args.compile)) if on]
    if args.compile and len(modes) > 1:
        raise UsageError(f"--compile: times the first call, {modes[0]} another table; drop one of them")
    table_only = [o for o, on in (("--long-context", args.long_context), ("--quick", args.quick), ("--paths", args.paths))
                  if on]
    if modes and table_only:
        mode = modes[0]
        raise UsageError(f"{table_only[0]}: an option of the main table, which {mode} replaces; drop one of them")
    if args.compile and (args.plot or args.shape):
        raise UsageError(f"{'--plot' if args.plot else '--shape'}: --compile has its own configs on the small shape; drop it")
    if not modes and TORCH_PLAIN in names and (args.solver not in R.TABLEAUS or R.TABLEAUS[args.solver].gated):
        raise UsageError(f"--solver {args.solver}: {TORCH_PLAIN}, in the main table's paths, runs the fixed tableaus only; "
                         f"pick another solver, or --paths without {TORCH_PLAIN}")
    return names, shapes


def _check_decode(args) -> tuple[list, list]:
    """(contexts, runtimes) of --decode; UsageError for bad input, before any work."""
    contexts = [int(c) if c.strip().isdigit() and int(c) >= 2 else -1 for c in args.contexts.split(",")]
    if -1 in contexts:
        raise UsageError(f"--contexts: expected comma-separated integers >= 2; got {args.contexts!r}")
    runtimes = comma_list("--decode-runtimes", args.decode_runtimes, DECODE_RUNTIMES)
    if args.plot:
        raise UsageError("--plot: the decode table has no plot; drop --plot")
    return contexts, runtimes


def _check_memory(args) -> tuple[tuple, list, list]:
    """(shape, steps, runtimes) of --memory; UsageError for bad input, before any work."""
    steps = comma_list("--memory-steps", args.memory_steps, positive_ints=True)
    runtimes = comma_list("--memory-runtimes", args.memory_runtimes, MEMORY_RUNTIMES)
    if len(args.shape) > 1:
        raise UsageError(f"--shape: --memory takes one shape; got {len(args.shape)}")
    shape = parse_shape(args.shape[0]) if args.shape else MEMORY_SHAPE
    if args.plot:
        require("matplotlib")  # a missing extra is named before the work starts
    return shape, steps, runtimes


# The packages of each runtime the tables run; a table's runtimes are checked before any work.
RUNTIME_PACKAGES = {"torch": ("torch",), "jax": ("jax",), "ort": ("onnx", "onnxruntime")}


def _needed(args, names) -> list[str]:
    """The top-level packages this run needs: every runtime of its table (the main table's paths
    and the scaling lines unless skipped; --decode's and --memory's runtimes; --compile's JAX),
    and matplotlib for --plot."""
    from odeattn.bench import PATH_SPECS

    if args.compile:
        runtimes = ["jax"]
    elif args.decode:
        runtimes = comma_list("--decode-runtimes", args.decode_runtimes, DECODE_RUNTIMES)
    elif args.memory:
        runtimes = comma_list("--memory-runtimes", args.memory_runtimes, MEMORY_RUNTIMES)
    else:
        tops = {m.partition(".")[0] for n in names for m in PATH_SPECS[n].imports}
        scaling = [] if args.quick or args.no_scaling else list(RUNTIME_PACKAGES)
        runtimes = [*scaling, *(r for r, mods in RUNTIME_PACKAGES.items() if tops & set(mods))]
    packages = [m for r in dict.fromkeys(runtimes) for m in RUNTIME_PACKAGES[r]]
    return packages + (["matplotlib"] if args.plot else [])


def run(args) -> int:
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = args.threads or os.cpu_count() or 1
    repeats = args.repeats or DEFAULT_REPEATS
    with user_input():
        names, shapes = _check(args)
        if args.decode:
            contexts, runtimes = _check_decode(args)
        elif args.memory:
            shape, steps, runtimes = _check_memory(args)
    for package in _needed(args, names):
        require(package)  # a missing extra is named in one line before any work
    if args.decode:
        result = decode_result(contexts, runtimes, solver=args.solver, steps=args.steps, repeats=repeats,
                               threads=threads, log=log)
        print(format_decode(result))
    elif args.compile:
        result = compile_result(log, **({"repeats": args.repeats} if args.repeats else {}))
        print(format_compile(result))
    elif args.memory:
        result = memory_result(shape, steps, runtimes, solver=args.solver, repeats=repeats, threads=threads, log=log)
        print(format_memory(result))
    else:
        result = run_bench(shapes, names, solver=args.solver, steps=args.steps, warmup=args.warmup, threads=threads,
                           quick=args.quick, repeats=args.repeats, long_context=args.long_context,
                           scaling=not args.no_scaling, log=log)
        print(format_tables(result))
    if args.json:
        write_text(args.json, json.dumps(result, indent=1))
    if args.plot and args.memory:
        with replacing(args.plot) as tmp:
            plot_memory(result, tmp)
        print(f"plot: {args.plot}")
    elif args.plot and result["scaling"]:
        with replacing(args.plot) as tmp:
            plot_scaling(result, tmp)
        print(f"plot: {args.plot}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="time every execution path, interleaved, against a plain PyTorch block and this machine's matmul peak",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], metavar="B,T,D,H",
                   help="benchmark this shape instead of small and large (repeatable)")
    p.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--solver", default="rk4", choices=list(R.SOLVERS),
                   help="the block's ODE solver (default rk4); --compile times its own configs")
    p.add_argument("--steps", type=positive_int, default=4,
                   help="the block's ode_steps (default 4); --memory takes --memory-steps, --compile its own configs")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed calls after the first, before the rounds")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="interleaved rounds of the main table (default 5, --quick 3); timed calls of the other tables")
    p.add_argument("--quick", action="store_true",
                   help="the main table on the small shape, with fewer rounds and smaller peak matmuls (minutes: every path "
                        "still set up, compiled and probed for memory in a fresh process)")
    p.add_argument("--long-context", action="store_true",
                   help="add peak memory and one forward's time per path at B1 T8192 D512 H8 (with --quick: B1 T2048 D256 H8)")
    p.add_argument("--threads", type=non_negative_int, default=0, help="default (0): every core")
    p.add_argument("--no-scaling", action="store_true", help="skip the scaling tables")
    p.add_argument("--json", type=Path, help="also write the whole result here as JSON (every figure of the tables, and the settings)")
    p.add_argument("--plot", type=Path, help="PNG of the scaling tables")
    add_force(p)
    p.add_argument("--decode", action="store_true",
                   help="instead: cached decoding against recomputing the prefix (see below)")
    p.add_argument("--contexts", default=",".join(map(str, DECODE_CONTEXTS)), help="with --decode: context lengths")
    p.add_argument("--decode-runtimes", default=",".join(DECODE_RUNTIMES), help="with --decode: some of torch,jax,ort")
    p.add_argument("--compile", action="store_true",
                   help="instead: the JAX block's first call against its warm call, fresh processes ("
                        + ", ".join(f"{s} x {n}" for s, n in COMPILE_CONFIGS) + "; see below)")
    p.add_argument("--memory", action="store_true",
                   help="instead: training memory and time against steps, with and without checkpointing (see below)")
    p.add_argument("--memory-steps", default="1,2,4,8,16,32", help="with --memory: the ode_steps values")
    p.add_argument("--memory-runtimes", default="torch,jax", help="with --memory: some of torch,jax")

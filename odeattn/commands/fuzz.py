"""`odeattn conformance fuzz`: drawn examples judged live against the spec (odeattn.conformance.fuzzing.fuzz).

Exit codes: 0 nothing diverged; 1 a counterexample found (its shrunk example printed and written
as a repro folder; a hang or a crash of the backend's worker is one), or fewer examples judged than --min-examples (a shortfall); 2 usage: a bad option, a --replay folder missing a file or holding a pickle, a
backend that runs none of the drawn configs (that is not a pass).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from odeattn.commands.args import (CommandFailed, UsageError, check_output_path, non_negative_int, positive_float, positive_int,
                                   user_input)

FUZZ_ONLY = {"examples": "--examples", "seed": "--seed", "time_budget": "--time-budget", "replay": "--replay",
             "model": "--model", "config": "--config", "weights": "--weights", "runtime": "--runtime",
             "min_examples": "--min-examples", "database": "--database", "repro": "--repro", "cover": "--cover",
             "same_draws": "--same-draws", "encoder_examples": "--encoder-examples"}
DEFAULT_REPRO = Path("fuzz-repro")
RUN_ONLY = {"include": "-k", "exclude": "--exclude", "xfail": "--xfail", "golden": "--golden", "expect_digest": "--expect-digest",
            "external": "--external", "fail_fast": "--fail-fast", "profile": "--profile", "float64_bound": "--float64-bound",
            "shard": "--shard", "list": "--list"}


def add_options(p) -> None:
    # a group of their own: `odeattn conformance --help` shows them apart from the main run's
    p = p.add_argument_group("fuzz options", "taken only by 'odeattn conformance fuzz' (its own help: "
                             "odeattn conformance fuzz --help)")
    p.add_argument("--examples", type=positive_int, default=None, metavar="N",
                   help="fuzz: examples per backend and dtype (default 100)")
    p.add_argument("--min-examples", type=positive_int, default=None, metavar="N",
                   help="fuzz: fewer examples judged than N per backend and dtype (too many draws refused) fails the run, "
                        "exit 1 (default: --examples; a smaller N accepts a shortfall)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="fuzz: hypothesis's seed (default 0): the same draws")
    p.add_argument("--database", type=Path, default=None, metavar="DIR",
                   help="fuzz: keep the failing examples in this folder and judge them first on the next run "
                        "(default: none kept)")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="fuzz: stop drawing after this long per backend and dtype (a divergence is still shrunk)")
    p.add_argument("--replay", type=Path, default=None, metavar="DIR", help="fuzz: rerun the example of a repro folder")
    p.add_argument("--cover", action=argparse.BooleanOptionalAction, default=None,
                   help="fuzz: search every row of the covering array over the fuzzer's factors first (every feasible pair "
                        "of two factors' levels), one example each, then draw at random (docs/fuzzing.md); the default, "
                        "but with --model, whose config is fixed")
    p.add_argument("--encoder-examples", type=non_negative_int, default=None, metavar="N",
                   help="fuzz: examples of the encoder stack per backend and dtype (every family and profile, the Macaron "
                        "layer, PCformer's alpha and corrector, qkvflow's time-dependent stack), a run of their own after "
                        "the attention block's, on a backend that runs encoder cases, in float32 and float64 (default 10; "
                        "0: none)")
    p.add_argument("--same-draws", action="store_true", default=None,
                   help="fuzz: draw the same examples in every dtype (default: each dtype its own, from the same seed)")
    p.add_argument("--repro", type=Path, default=None, metavar="DIR",
                   help="fuzz: where a divergence's repro folder is written (default ./fuzz-repro)")
    p.add_argument("--model", type=Path, default=None, metavar="FILE",
                   help="fuzz: judge this exported block file (with --config and --weights, its own) instead of a backend: "
                        "an .onnx file, a .vmfb module (--runtime iree), a .pt2 (--runtime aoti) or .pte (--runtime "
                        "executorch) package, a .jaxexport program (--runtime jax) or a .tflite model (--runtime litert)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.json", help="fuzz --model: the file's config")
    p.add_argument("--weights", type=Path, default=None, metavar="FILE", help="fuzz --model: the file's weights (.safetensors, .npz)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="fuzz --model: the runtime, onnxruntime (default, in this process), openvino or tract (in this process), "
                        "onnxruntime-node or onnxruntime-web; iree, aoti, executorch, jax or litert for their files (in this process)")


def check_not_given(args) -> None:
    """Another action given a fuzz option: refused."""
    given = [o if getattr(args, a, None) is not False else f"--no-{o[2:]}" for a, o in FUZZ_ONLY.items()
             if getattr(args, a, None) not in (None, [])]
    if args.action != "fuzz" and given:
        raise UsageError(f"{', '.join(given)}: taken only by 'odeattn conformance fuzz'")


def _adapters(args):
    """[(reference as typed, adapter)] of the --backend options, each constructed in a worker
    process of its own (client.RemoteAdapter), within --timeout: whatever the port does (raise,
    exit, hang, crash) is its result there, never this command's."""
    from odeattn.conformance.running.remote import remote_adapters

    if not args.backend:
        raise UsageError("--backend: fuzz needs a backend to judge (a built-in name, module:object or exec:CMD)")
    try:
        return remote_adapters(args.backend, args.timeout)
    except ValueError as err:  # its message begins 'backend'
        raise UsageError(f"--{err}") from None


def close_all(adapters) -> None:
    """Stop the worker process of each adapter that has one."""
    for _, adapter, *_ in adapters:
        if hasattr(adapter, "close"):
            adapter.close()


def fuzz(args) -> int:
    from ode_ref.precision import DTYPES
    from odeattn.conformance.running.expectations import load as load_expectations

    unused = [o for a, o in RUN_ONLY.items() if getattr(args, a, None) not in (None, [], False)]
    if unused:
        raise UsageError(f"{', '.join(unused)}: not taken by fuzz")
    with user_input():
        for d in args.dtypes:
            if d not in DTYPES:
                raise UsageError(f"--dtype: expected one of {', '.join(DTYPES)}; got {d!r}")
        check_draw_options(args)
        inputs = {"--replay": args.replay, "--model": args.model, "--config": args.config, "--weights": args.weights}
        check_output_path("--json", args.json, force=args.force, others=inputs)
        check_output_path("--junit", args.junit, force=args.force, others={**inputs, "--json": args.json})
        if args.replay is None:
            args.repro = DEFAULT_REPRO if args.repro is None else args.repro
            check_repro_folder(args.repro)
        args.expectations = load_expectations(args.expectations)
        model = None
        if args.model is not None or args.config is not None or args.weights is not None or args.runtime is not None:
            model = model_file(args)
        elif args.replay is None:
            adapters = _adapters(args)
    if model is not None and args.replay is None:  # the run outside user_input: what it raises is no usage error
        return draw_and_judge(args, [model])
    if args.replay is not None:
        return replay(args)
    try:
        return draw_and_judge(args, adapters)
    finally:
        close_all(adapters)


def check_draw_options(args) -> None:
    """--min-examples at most the examples asked, --database a folder (or a path one can be made
    at); neither taken with --replay, which draws nothing, nor the options of a run's budget and
    of its outputs (--json, --junit, --repro): a replay prints its one result and writes nothing."""
    from odeattn.conformance.fuzzing.fuzz import DEFAULT_EXAMPLES

    given = [o for o, v in (("--min-examples", args.min_examples), ("--database", args.database),
                            ("--expectations", args.expectations or None), ("--examples", args.examples),
                            ("--seed", args.seed), ("--time-budget", args.time_budget), ("--cover" if args.cover else "--no-cover", args.cover),
                            ("--same-draws", args.same_draws), ("--encoder-examples", args.encoder_examples)) if v is not None]
    if args.replay is not None and given:
        raise UsageError(f"{', '.join(given)}: not taken with --replay (it reruns one example, drawing nothing)")
    written = [o for o, v in (("--json", args.json), ("--junit", args.junit), ("--repro", args.repro)) if v is not None]
    if args.replay is not None and written:
        raise UsageError(f"{', '.join(written)}: not taken with --replay (it prints the one example's result and "
                         "writes no file)")
    examples = args.examples or DEFAULT_EXAMPLES
    if args.encoder_examples is not None and any(v is not None for v in (args.model, args.config, args.weights)):
        raise UsageError("--encoder-examples: not taken with --model (the file is an attention block, its config fixed)")
    if args.min_examples is not None and args.min_examples > examples:
        raise UsageError(f"--min-examples: expected at most the examples asked (--examples {examples}); got {args.min_examples}")
    if args.database is not None:  # hypothesis's database drops a failed write silently: found out now
        from odeattn.conformance.fuzzing.repro import check_writable_folder

        with user_input():
            check_writable_folder("--database", args.database, "a failing example would not be kept")


def check_repro_folder(repro: Path) -> None:
    """--repro must be a folder (or a path one can be made at); a repro is written into a folder of
    its own inside it (repro.write_repro), which refuses one that already holds files."""
    from odeattn.conformance.fuzzing.repro import check_writable_folder

    with user_input():
        check_writable_folder("--repro", repro, "a counterexample's folder would be lost")


def model_file(args):
    """(the --model path as typed, its adapter, the strategy and the weights) of fuzz --model."""
    from odeattn.commands.inputs import load_block
    from odeattn.conformance.fuzzing.draw import fixed_draws
    from odeattn.conformance.fuzzing.model_file import (RUNTIME_SUFFIXES, RUNTIMES, ModelFile, check_file_config,
                                                        check_runtime, load_block_file)

    missing = [o for o, v in (("--model", args.model), ("--config", args.config), ("--weights", args.weights)) if v is None]
    if args.cover:  # the array's cells are configs; a file has its own
        raise UsageError("--cover: not taken with --model (the file's config is fixed; the array's cells vary configs)")
    if missing or args.backend:
        raise UsageError(f"--model: takes --config and --weights (no --backend); missing {', '.join(missing) or 'nothing'}"
                         if missing else "--model: judges the file itself; --backend is not taken with it")
    runtime = check_runtime(args.runtime or "onnxruntime")
    suffix = RUNTIME_SUFFIXES.get(runtime, ".onnx")
    if not args.model.is_file():
        raise UsageError(f"--model: expected a{'n' if suffix == '.onnx' else ''} {suffix} file; got {str(args.model)!r}, "
                         f"{'a folder' if args.model.is_dir() else 'which does not exist'}")
    runs = {s: r for r, s in RUNTIME_SUFFIXES.items()}.get(args.model.suffix)  # the runtime a file's suffix names
    if runs is not None and runs != runtime:
        raise UsageError(f"--model: {str(args.model)!r} is a {args.model.suffix} file, which --runtime {runs} runs; got "
                         f"--runtime {runtime}")
    if runtime in RUNTIME_SUFFIXES:
        if args.model.suffix == ".onnx":
            raise UsageError(f"--model: expected a {suffix} file for --runtime {runtime}; got the ONNX file "
                             f"{str(args.model)!r} (its runtimes: {', '.join(r for r in RUNTIMES if r not in RUNTIME_SUFFIXES)})")
        return package_file(args)
    with user_input("--model"):  # before the config: a GenAI file's config is no block's
        model = load_block_file(args.model)
    config, params = load_block(args.config, args.weights)
    with user_input():
        check_file_config(model, config, runtime)
    check_float32_weights(params)
    with user_input():  # a file its runtime does not load (tract's)
        adapter = ModelFile(args.model, config, params, runtime, model=model).adapt()
    strategy = fixed_draws(config, adapter.batch, adapter.seq, adapter.takes_mask)
    return str(args.model), adapter, strategy, params


def package_file(args):
    """model_file's (path, adapter, strategy, weights) for a compiled package: an IREE .vmfb module
    (--runtime iree), an AOTInductor .pt2 (--runtime aoti), an ExecuTorch .pte (--runtime executorch),
    a jax.export program (--runtime jax) or a LiteRT .tflite model (--runtime litert)."""
    from odeattn.commands.inputs import load_block
    from odeattn.conformance.fuzzing.draw import fixed_draws
    from odeattn.conformance.fuzzing.model_file import PackageFile

    config, params = load_block(args.config, args.weights)
    check_float32_weights(params)
    with user_input():
        adapter = PackageFile(args.model, config, params, args.runtime)
    return str(args.model), adapter, fixed_draws(config, adapter.batch, adapter.seq, adapter.takes_mask), params


def check_float32_weights(params) -> None:
    """UsageError naming --weights where a weight is beyond float32's range: the file runs float32,
    so no input could be judged against these."""
    import numpy as np

    big, top = max(float(np.abs(v).max(initial=0.0)) for v in params.values()), float(np.finfo(np.float32).max)
    if big > top:
        raise UsageError(f"--weights: the model file runs in float32, which holds magnitudes up to {top:.4g}; "
                         f"got a weight of magnitude {big:.4g}")


def draw_and_judge(args, adapters) -> int:
    from odeattn.conformance.cases.kinds import ENCODER
    from odeattn.conformance.fuzzing.fuzz import (DEFAULT_ENCODER_EXAMPLES, DEFAULT_EXAMPLES, ENCODER_STACK, ENCODER_SUFFIX,
                                                  encoder_search, fuzz as run_fuzz)
    from odeattn.conformance.fuzzing.model_file import artifact_record
    from odeattn.conformance.running.reports import environment
    from odeattn.conformance.fuzzing.fuzz_report import format_run, shortfall
    from odeattn.conformance.fuzzing.repro import folder_name, write_repro

    examples, seed = args.examples or DEFAULT_EXAMPLES, 0 if args.seed is None else args.seed
    if not any(not args.dtypes or d in args.dtypes for _, adapter, *_ in adapters for d in adapter.dtypes):
        raise UsageError(f"--dtype: no backend runs any of the dtypes asked for ({', '.join(args.dtypes)})")
    print(f"fuzz: {examples} examples per backend and dtype, seed {seed}"
          + (f", time budget {args.time_budget:g} s" if args.time_budget else ""), flush=True)
    for typed, adapter, *_ in adapters:  # a dtype asked for that a backend does not run is said, not dropped silently
        unrun = [d for d in args.dtypes or () if d not in adapter.dtypes]
        if unrun:
            print(f"{typed}: not run in {', '.join(unrun)} (it runs {', '.join(adapter.dtypes)})", flush=True)
    for typed, adapter, *_ in adapters:  # a repro folder of an earlier run is not replaced unasked
        for dtype in (d for d in adapter.dtypes if not args.dtypes or d in args.dtypes):
            suffixes = ("", ENCODER_SUFFIX) if encoder_search(adapter, dtype, args.encoder_examples) else ("",)
            for target in (args.repro / folder_name(typed, dtype, suffix) for suffix in suffixes):
                if target.is_dir() and any(target.iterdir()) and not args.force:
                    raise UsageError(f"--repro: {str(target)!r} holds files already; pass --force to replace them, or "
                                     "name another --repro folder")
    runs, unwritten, unjudged = [], [], []
    for typed, adapter, *fixed in adapters:
        strategy, params = fixed or (None, None)
        dtypes = [d for d in adapter.dtypes if not args.dtypes or d in args.dtypes]
        if args.encoder_examples and not any(encoder_search(adapter, d, args.encoder_examples) for d in dtypes):
            why = ENCODER.missing(adapter) or f"it has no half-precision policy; run in {', '.join(dtypes)}"
            print(f"{typed}: no encoder examples ({why})", flush=True)  # asked for, and not run: said
        for dtype in dtypes:
            block = run_fuzz(adapter, dtype, examples=examples, seed=seed, time_budget=args.time_budget, strategy=strategy,
                             params=params, min_examples=args.min_examples, database=args.database,
                             expectations=args.expectations, cover=args.cover, share_draws=bool(args.same_draws))
            encoder = None if fixed else encoder_search(adapter, dtype, args.encoder_examples, args.min_examples)
            left = None if args.time_budget is None else args.time_budget - block.seconds  # one budget for both searches
            spent = encoder is not None and left is not None and left <= 0
            for run in [block] + ([None] if encoder is not None and not spent else []):  # then the encoder stack's
                if run is None:
                    run = run_fuzz(adapter, dtype, examples=encoder[0], seed=seed, time_budget=left, kinds=(ENCODER,),
                                   min_examples=encoder[1], database=args.database, expectations=args.expectations,
                                   share_draws=bool(args.same_draws))
                judged = _judged(args, typed, run)
                if judged is not None:
                    unjudged.append(judged)
                if run.finding is not None:
                    target = args.repro / folder_name(typed, dtype, run.suffix)
                    try:
                        run.finding.repro = str(write_repro(target, run.finding, typed, dtype, model=(
                            args.model, args.config, args.weights, args.runtime) if fixed else None))
                    except OSError as err:  # checked writable up front, yet it failed (a full disk): the finding is printed
                        unwritten.append(f"--repro: {str(target)!r} could not be written ({err.strerror or err}); the "
                                         f"counterexample of {typed}/{dtype}{run.search} is printed above only")
                runs.append(run)
                print(format_run(run), flush=True)
            if spent:
                print(f"{typed}/{dtype} ({ENCODER_STACK}): not run: the --time-budget was spent on the attention block's "
                      "search", flush=True)
    header = {"action": "fuzz", "examples": examples, "seed": seed, "min_examples": args.min_examples or examples,
              "encoder_examples": DEFAULT_ENCODER_EXAMPLES if args.encoder_examples is None else args.encoder_examples,
              "database": None if args.database is None else str(args.database), "environment": environment()}
    if args.model is not None:  # the report a deployer ships beside the file: which file, run where
        header["artifact"] = artifact_record(args.model, args.runtime or "onnxruntime")
        loop = adapters[0][1].loop_steps
        if loop is not None:  # a Loop form is judged at one step count: the report says which
            header["artifact"]["steps_fed"] = loop
    unwritten += write_reports(args, runs, header)
    for r in (r for r in runs if r.short):  # a shortfall is not a pass: the draws judged are not those asked
        print(f"fuzz: {r.label}: {shortfall(r)}; that is not a pass (--min-examples N accepts fewer)",
              file=sys.stderr)
    written = [r.finding.repro for r in runs if r.diverged and r.finding.repro]
    if written:
        print(f"rerun an example: {' or '.join(f'{w}/case.json' for w in written)} holds the command", file=sys.stderr)
    for r in runs:
        for label in r.unexpected:  # a known failure's region that no longer fails: the file's line is stale
            print(f"fuzz: {r.label}: unexpected pass: {label}: none of the examples it selects failed",
                  file=sys.stderr)
    for line in unwritten[:-1] + unjudged[:-1]:
        print(f"odeattn conformance fuzz: {line}", file=sys.stderr)
    if unjudged:  # nothing judged on a backend: the worst outcome, a usage error (exit 2)
        raise CommandFailed(unjudged[-1], code=2)
    if unwritten:
        raise CommandFailed(unwritten[-1])
    return 1 if any(r.failed for r in runs) else 0


def _judged(args, typed: str, run):
    """The line saying that run judged nothing, which is not a pass, or None: it judged something, or
    it is the encoder stack's default search (a port may refuse every encoder config)."""
    from odeattn.conformance.fuzzing.fuzz_report import format_refusals

    if run.examples > 0 or (run.suffix and args.encoder_examples is None):
        return None
    where = f"{run.dtype}" + (f", the {run.drew}'s search" if run.suffix else "")
    if run.unrun:
        return (f"--time-budget: {args.time_budget:g} s ran out before any example ran on {typed} in {where}: nothing "
                "was judged, which is not a pass; give it more time")
    return (f"--backend {typed}: ran none of the drawn configs in {where} ({run.skipped} draws not supported; "
            f"{format_refusals(run.refusals) or 'none drawn'}): that is not a pass")


def write_reports(args, runs, header) -> list:
    """Write --json and --junit; the line for each that could not be written (their paths were
    tried up front, so this is a disk filling up, say), the results being printed already."""
    from odeattn.conformance.fuzzing.fuzz_report import write_json, write_junit
    from ode_ref.files import replacing

    failed = []
    for option, path, write in (("--json", args.json, write_json), ("--junit", args.junit, write_junit)):
        if path is None:
            continue
        try:
            with replacing(path) as tmp:
                write(runs, tmp, header)
        except OSError as err:
            failed.append(f"{option}: {str(path)!r} could not be written ({err.strerror or err})")
    return failed


def replay(args) -> int:
    """Rerun a repro folder's example on one backend; 1 if it still diverges (or the backend
    raised, hung or crashed its worker on it)."""
    import numpy as np

    from odeattn.conformance.fuzzing.fuzz import unjudgeable
    from odeattn.conformance.fuzzing.repro import load_repro

    if len(args.backend) != 1 and args.model is None:
        raise UsageError(f"--backend: --replay runs one backend (or --model); got {len(args.backend)}")
    if len(args.dtypes) > 1:
        raise UsageError(f"--dtype: --replay runs one dtype; got {', '.join(args.dtypes)}")
    with user_input():
        with np.errstate(all="ignore"):  # an input the spec overflows on is refused below, in one line
            case, meta = load_repro(args.replay, args.dtypes[0] if args.dtypes else "")
        dtype = args.dtypes[0] if args.dtypes else meta.get("dtype", "float32")
        why = unjudgeable(case, dtype)
        if why is not None:
            raise UsageError(f"--replay: {why}: nothing can be judged on it, which is not a pass")
        (typed, adapter, *_), = [model_file(args)] if args.model is not None else _adapters(args)
    try:
        if dtype not in adapter.dtypes:
            raise UsageError(f"--dtype: backend {typed} runs {', '.join(adapter.dtypes)}; got {dtype!r}")
        return replay_on(args, typed, adapter, case, dtype)
    finally:
        close_all([(typed, adapter)])


def replay_on(args, typed: str, adapter, case, dtype: str) -> int:
    """replay's run and its lines: the result, where it is off and the stage, or the backend's
    own traceback where it raised (its error, not this command's)."""
    from odeattn.conformance.fuzzing.fuzz import first_divergent
    from odeattn.conformance.running.compare import run_case
    from odeattn.conformance.cases.localise import localise
    from odeattn.conformance.cases.stages import format_stage
    from odeattn.conformance.fuzzing.stages import first_divergent_stage

    outputs = {}
    result = run_case(adapter, case, dtype, outputs=outputs)
    print(f"replay of {args.replay} on {typed}/{dtype}: {result.status}{': ' + result.message if result.message else ''}")
    if result.traceback:
        print("  the backend's traceback:\n" + "\n".join("    " + line for line in result.traceback.rstrip().splitlines()))
    q = first_divergent(result)
    if q:
        tol = next(r.tolerance for r in result.quantities if r.quantity == q)
        print(f"  where: {localise(q, outputs[q], case.quantities()[q], tol, prompt=case.prompt)['summary']}")
        if case.kind.stages and getattr(adapter, "run_stages", None) is not None:
            print(f"  stage: {format_stage(first_divergent_stage(adapter, case, dtype))}")
    if result.status in ("skipped", "untestable"):
        raise CommandFailed(f"--backend {typed}: does not run this example ({result.message}): that is not a pass", code=2)
    return 1 if result.failed else 0

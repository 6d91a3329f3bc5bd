"""`odeattn conformance fuzz`: drawn examples judged live against the spec (odeattn.conformance.fuzzing.fuzz).

Exit codes: 0 nothing diverged; 1 a counterexample found (its shrunk example printed and written
as a repro folder); 2 usage: a bad option, a --replay folder missing a file or holding a pickle, a
backend that runs none of the drawn configs (that is not a pass).
"""

from __future__ import annotations

import sys
from pathlib import Path

from odeattn.commands.args import CommandFailed, UsageError, check_output_path, positive_float, positive_int, user_input

FUZZ_ONLY = {"examples": "--examples", "seed": "--seed", "time_budget": "--time-budget", "replay": "--replay",
             "model": "--model", "config": "--config", "weights": "--weights", "runtime": "--runtime"}
RUN_ONLY = {"include": "-k", "exclude": "--exclude", "xfail": "--xfail", "golden": "--golden", "expect_digest": "--expect-digest",
            "external": "--external", "fail_fast": "--fail-fast", "profile": "--profile", "float64_bound": "--float64-bound"}


def add_options(p) -> None:
    p.add_argument("--examples", type=positive_int, default=None, metavar="N",
                   help="fuzz: examples per backend and dtype (default 100)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="fuzz: hypothesis's seed (default 0): the same draws")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="fuzz: stop drawing after this long per backend and dtype (a divergence is still shrunk)")
    p.add_argument("--replay", type=Path, default=None, metavar="DIR", help="fuzz: rerun the example of a repro folder")
    p.add_argument("--repro", type=Path, default=Path("fuzz-repro"), metavar="DIR",
                   help="fuzz: where a divergence's repro folder is written (default ./fuzz-repro)")
    p.add_argument("--model", type=Path, default=None, metavar="FILE.onnx",
                   help="fuzz: judge this exported block file (with --config and --weights, its own) instead of a backend")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.json", help="fuzz --model: the file's config")
    p.add_argument("--weights", type=Path, default=None, metavar="FILE", help="fuzz --model: the file's weights (.safetensors, .npz)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="fuzz --model: the runtime, onnxruntime (default, in this process), onnxruntime-node or onnxruntime-web")


def check_not_given(args) -> None:
    """Another action given a fuzz option: refused."""
    given = [o for a, o in FUZZ_ONLY.items() if getattr(args, a, None) not in (None, [], False)]
    if args.action != "fuzz" and given:
        raise UsageError(f"{', '.join(given)}: taken only by 'odeattn conformance fuzz'")


def _adapters(args):
    """[(reference as typed, adapter)] of the --backend options, each constructed here."""
    from odeattn.conformance.adapters import BUILTIN, discover, make_adapter

    if not args.backend:
        raise UsageError("--backend: fuzz needs a backend to judge (a built-in name, module:object or exec:CMD)")
    try:
        refs, _, _ = discover(args.backend, timeout=args.timeout)
    except ValueError as err:
        raise UsageError(f"--{err}") from None
    out = []
    for typed, ref in zip(args.backend, refs):
        try:
            out.append((typed, make_adapter(ref.reference, imports=BUILTIN[typed].requires if typed in BUILTIN else ())))
        except Exception as err:
            raise UsageError(f"--backend {typed}: cannot be constructed ({type(err).__name__}: {err})") from None
    return out


def fuzz(args) -> int:
    from odeattn.conformance.cases.half import DTYPES

    unused = [o for a, o in RUN_ONLY.items() if getattr(args, a, None) not in (None, [], False)]
    if unused:
        raise UsageError(f"{', '.join(unused)}: not taken by fuzz")
    with user_input():
        for d in args.dtypes:
            if d not in DTYPES:
                raise UsageError(f"--dtype: expected one of {', '.join(DTYPES)}; got {d!r}")
        inputs = {"--replay": args.replay, "--model": args.model, "--config": args.config, "--weights": args.weights}
        check_output_path("--json", args.json, force=args.force, others=inputs)
        check_output_path("--junit", args.junit, force=args.force, others={**inputs, "--json": args.json})
        if args.replay is None:
            check_repro_folder(args.repro)
        if args.model is not None or args.config is not None or args.weights is not None or args.runtime is not None:
            model = model_file(args)
            if args.replay is None:
                return draw_and_judge(args, [model])
        if args.replay is None:
            adapters = _adapters(args)
    return replay(args) if args.replay is not None else draw_and_judge(args, adapters)


def check_repro_folder(repro: Path) -> None:
    """--repro must be a folder (or a path one can be made at); a repro is written into a folder of
    its own inside it (repro.write_repro), which refuses one that already holds files."""
    if repro.exists() and not repro.is_dir():
        raise UsageError(f"--repro: expected a folder; got the file {str(repro)!r}")
    parent = next((p for p in (repro, *repro.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise UsageError(f"--repro: {str(parent)!r} is not a folder, so {str(repro)!r} cannot be made")


def model_file(args):
    """(the --model path as typed, its adapter, the strategy and the weights) of fuzz --model."""
    from odeattn.commands.inputs import load_block
    from odeattn.conformance.fuzzing.draw import fixed_draws
    from odeattn.conformance.fuzzing.model_file import ModelFile, check_runtime

    missing = [o for o, v in (("--model", args.model), ("--config", args.config), ("--weights", args.weights)) if v is None]
    if missing or args.backend:
        raise UsageError(f"--model: takes --config and --weights (no --backend); missing {', '.join(missing) or 'nothing'}"
                         if missing else "--model: judges the file itself; --backend is not taken with it")
    runtime = check_runtime(args.runtime or "onnxruntime")
    if not args.model.is_file():
        raise UsageError(f"--model: expected an .onnx file; got {str(args.model)!r}")
    config, params = load_block(args.config, args.weights)
    adapter = ModelFile(args.model, config, params, runtime).adapt()
    strategy = fixed_draws(config, adapter.batch, adapter.seq, adapter.takes_mask)
    return str(args.model), adapter, strategy, params


def draw_and_judge(args, adapters) -> int:
    from odeattn.conformance.fuzzing.fuzz import DEFAULT_EXAMPLES, fuzz as run_fuzz
    from odeattn.conformance.fuzzing.fuzz_report import format_run, write_json, write_junit
    from odeattn.conformance.fuzzing.repro import folder_name, write_repro
    from ode_ref.files import replacing

    examples, seed = args.examples or DEFAULT_EXAMPLES, 0 if args.seed is None else args.seed
    if not any(not args.dtypes or d in args.dtypes for _, adapter, *_ in adapters for d in adapter.dtypes):
        raise UsageError(f"--dtype: no backend runs any of the dtypes asked for ({', '.join(args.dtypes)})")
    print(f"fuzz: {examples} examples per backend and dtype, seed {seed}"
          + (f", time budget {args.time_budget:g} s" if args.time_budget else ""), flush=True)
    for typed, adapter, *_ in adapters:  # a repro folder of an earlier run is not replaced unasked
        for dtype in (d for d in adapter.dtypes if not args.dtypes or d in args.dtypes):
            target = args.repro / folder_name(typed, dtype)
            if target.is_dir() and any(target.iterdir()) and not args.force:
                raise UsageError(f"--repro: {str(target)!r} holds files already; pass --force to replace them, or "
                                 "name another --repro folder")
    runs = []
    for typed, adapter, *fixed in adapters:
        strategy, params = fixed or (None, None)
        dtypes = [d for d in adapter.dtypes if not args.dtypes or d in args.dtypes]
        for dtype in dtypes:
            run = run_fuzz(adapter, dtype, examples=examples, seed=seed, time_budget=args.time_budget,
                           strategy=strategy, params=params)
            if run.examples == 0 and run.unrun:
                raise CommandFailed(f"--time-budget: {args.time_budget:g} s ran out before any example ran on {typed} in "
                                    f"{dtype}: nothing was judged, which is not a pass; give it more time", code=2)
            if run.examples == 0:
                raise CommandFailed(f"--backend {typed}: ran none of the drawn configs in {dtype} ({run.skipped} draws "
                                    "not supported): that is not a pass", code=2)
            if run.finding is not None:
                run.finding.repro = str(write_repro(args.repro / folder_name(typed, dtype), run.finding, typed, dtype,
                                                    model=(args.model, args.config, args.weights, args.runtime) if fixed else None))
            runs.append(run)
            print(format_run(run), flush=True)
    header = {"action": "fuzz", "examples": examples, "seed": seed}
    if args.json:
        with replacing(args.json) as tmp:
            write_json(runs, tmp, header)
    if args.junit:
        with replacing(args.junit) as tmp:
            write_junit(runs, tmp, header)
    if any(r.diverged for r in runs):
        print(f"rerun an example: {next(r.finding for r in runs if r.diverged).repro}/case.json holds the command", file=sys.stderr)
        return 1
    return 0


def replay(args) -> int:
    """Rerun a repro folder's example on one backend; 1 if it still diverges."""
    from odeattn.conformance.fuzzing.fuzz import first_divergent, run_one
    from odeattn.conformance.fuzzing.localise import localise
    from odeattn.conformance.fuzzing.repro import load_repro
    from odeattn.conformance.fuzzing.stages import first_divergent_stage, format_stage

    if len(args.backend) != 1 and args.model is None:
        raise UsageError(f"--backend: --replay runs one backend (or --model); got {len(args.backend)}")
    if len(args.dtypes) > 1:
        raise UsageError(f"--dtype: --replay runs one dtype; got {', '.join(args.dtypes)}")
    with user_input():
        case, meta = load_repro(args.replay, args.dtypes[0] if args.dtypes else "")
        (typed, adapter, *_), = [model_file(args)] if args.model is not None else _adapters(args)
        dtype = args.dtypes[0] if args.dtypes else meta.get("dtype", "float32")
        if dtype not in adapter.dtypes:
            raise UsageError(f"--dtype: backend {typed} runs {', '.join(adapter.dtypes)}; got {dtype!r}")
    result, outputs = run_one(adapter, case, dtype)
    print(f"replay of {args.replay} on {typed}/{dtype}: {result.status}{': ' + result.message if result.message else ''}")
    q = first_divergent(result)
    if q:
        tol = next(r.tolerance for r in result.quantities if r.quantity == q)
        print(f"  where: {localise(q, outputs[q], case.quantities()[q], tol, prompt=case.prompt)['summary']}")
        if case.kind == "block" and getattr(adapter, "run_stages", None) is not None:
            print(f"  stage: {format_stage(first_divergent_stage(adapter, case, dtype))}")
    if result.status == "skipped":
        raise CommandFailed(f"--backend {typed}: does not run this example ({result.message}): that is not a pass", code=2)
    return 1 if result.failed else 0

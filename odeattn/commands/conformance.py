"""`odeattn conformance`: run the golden cases on every installed backend (the main job);
`odeattn conformance generate`: regenerate the golden files (and the seal) from ode_ref;
`odeattn conformance mutants`: run the mutation battery and print its kill table;
`odeattn conformance fuzz`: drawn examples judged live against the spec (odeattn/commands/fuzz.py);
`odeattn conformance matrix REPORT...`: the --json reports of one golden set joined into a compliance matrix.

Exit codes: 0 everything passed; 1 any failure, error or unexpected pass; 2 usage, or a bad
suite file. Every usage error is found before any case runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ode_ref.files import replacing
from odeattn.commands.args import UsageError, add_force, check_output_path, positive_float, positive_int, user_input
from odeattn.commands import fuzz as fuzz_command
from odeattn.commands.progress import Progress


ACTION_HELP = {  # `conformance ACTION --help`: (what the action does, the options it takes)
    "generate": ("regenerate the golden files and their seal from ode_ref: into --golden DIR, or with --packaged the "
                 "packaged set in place; one of the two is required", ("--golden", "--packaged")),
    "mutants": ("run the mutation battery (one-line bugs applied to the spec; the manual's Conformance page) "
                "through the runner in every dtype, and print its kill table and a verdict line; exit 1 if a "
                "mutant survives", ("--golden", "-j")),
    "fuzz": ("draw configs and inputs, judge each backend against the spec computed live, and shrink a "
             "divergence to a repro folder; exit 1 if one was found, or if fewer examples were judged than "
             "--min-examples (the manual's Fuzzing page)",
             ("--backend", "--dtype", "--json", "--junit", "--examples", "--min-examples", "--seed", "--cover", "--same-draws",
              "--encoder-examples", "--time-budget", "--database", "--expectations", "--replay", "--repro", "--model", "--config",
              "--weights", "--runtime", "--timeout", "--force")),
    "matrix": ("join JSON reports of one golden set (several backends, machines, runtimes or shards) into a compliance "
               "matrix: a verdict per backend and dtype, every case's result, and each report's sha256 as the evidence; "
               "Markdown on stdout unless --markdown or --html names a file", ("reports", "--markdown", "--html", "--force")),
}


class _ActionHelp(argparse.Action):
    """--help: the help of the action given before it (`conformance mutants --help`), else the
    whole command's."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        action = getattr(namespace, "action", None)
        if action in ACTION_HELP:
            what, taken = ACTION_HELP[action]
            sub = argparse.ArgumentParser(prog=f"{parser.prog} {action}", description=what, add_help=False)
            for a in parser._actions:
                if set(a.option_strings) & set(taken) or a.dest in taken:  # a positional by its dest
                    sub._add_action(a)
            parser = sub
        parser.print_help()
        parser.exit()


def register(sub) -> None:
    p = sub.add_parser("conformance", help="check backends against the frozen golden cases (the main job)",
                       description=__doc__, add_help=False)
    p.add_argument("-h", "--help", action=_ActionHelp, help="show this help (after an action: that action's) and exit")
    p.add_argument("action", nargs="?", choices=["run", "generate", "mutants", "fuzz", "matrix"], default="run",
                   help="run (default) the suite, generate the golden files from ode_ref, run the mutation battery, fuzz: "
                        "drawn cases judged against the spec live, or matrix: join reports into a compliance matrix")
    p.add_argument("reports", nargs="*", type=Path, metavar="REPORT", help="matrix: the --json reports to join")
    p.add_argument("--golden", type=Path, default=None,
                   help="golden directory (default: the packaged, sealed one; generate: the folder to write, required "
                        "but with --packaged)")
    p.add_argument("--expect-digest", metavar="SHA256", help="refuse a golden set whose digest differs")
    p.add_argument("--backend", action="append", default=[], metavar="NAME|module:object|exec:CMD",
                   help="a backend to run (repeatable): a name, 'package.module:object', or exec:\"CMD ARGS\" (a program "
                        "speaking the external protocol); default: every installed one")
    p.add_argument("--external", type=Path, default=None, metavar="FILE",
                   help="a JSON file naming external backends, {\"backends\": {NAME: {\"exec\": CMD}}}: each runs as an "
                        "entry point would")
    p.add_argument("--dtype", dest="dtypes", action="append", default=[], metavar="DTYPE",
                   help="only this dtype of those each backend declares (repeatable): float32, float64, bfloat16 or "
                        "float16; default every one")
    p.add_argument("-k", dest="include", action="append", default=[], metavar="REGEX", help="only cases matching (repeatable, OR)")
    p.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="skip cases matching (repeatable)")
    p.add_argument("--xfail", action="append", default=[], metavar="REGEX",
                   help="expected failures, matched against 'backend/dtype/case' (repeatable); an unexpected pass fails")
    p.add_argument("--expectations", action="append", default=[], type=Path, metavar="FILE",
                   help="a port's expectations file (JSON, repeatable): its known failures (xfail, strict) and what must "
                        "not run (skip), by backend, dtype, case and config; read by the run and by fuzz")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only the I-th of N parts of the selected cases, balanced by measured case time (a CI "
                        "job each); the N parts hold every case once")
    p.add_argument("--list", action="store_true", help="print the selected cases (after -k, --exclude, --shard), one a line, "
                                                       "and exit without running anything")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    p.add_argument("-j", "--jobs", type=positive_int, default=None, metavar="N",
                   help="worker processes at once (default: the core count)")
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="S",
                   help="per-case timeout in seconds (default 120); fuzz: per example, and to construct the backend")
    p.add_argument("--float64-bound", type=positive_float, default=None, metavar="E",
                   help="also fail a float64 quantity whose relative error exceeds E (e.g. 1e-12)")
    p.add_argument("--profile", action="store_true",
                   help="also print where the time went: per backend, per phase (start, import, construction, "
                        "compilation, run, transfer, comparison), and the programs compiled (the JSON report "
                        "always holds it)")
    p.add_argument("--json", type=Path, help="write a JSON report here")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    add_force(p)
    p.add_argument("--packaged", action="store_true",
                   help="generate: rewrite the packaged golden set (and its seal) in place, as a change to the "
                        "suite does; otherwise generate writes only into --golden DIR")
    fuzz_command.add_options(p)
    matrix_options = p.add_argument_group("matrix options")
    matrix_options.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="matrix: write the Markdown here")
    matrix_options.add_argument("--html", type=Path, default=None, metavar="FILE", help="matrix: write an HTML page here")


def title(args) -> str:
    return "conformance" if args.action == "run" else f"conformance {args.action}"



def run(args) -> int:
    """The command, with Ctrl-C and SIGTERM ending it in one line (the workers are killed)."""
    import signal

    def terminated(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("odeattn conformance: interrupted; every worker process was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
    from odeattn.conformance.adapters.search_path import import_from_working_folder
    from odeattn.conformance.running.pool import core_count

    args.jobs = args.jobs or core_count()
    if args.packaged and args.action != "generate":
        raise UsageError(f"--packaged: taken by generate only; got the action {args.action}")
    import_from_working_folder()  # as `python -m` does: a plug-in beside the user is found
    fuzz_command.check_not_given(args)
    if args.action != "matrix" and (args.reports or args.markdown or args.html):
        given = ", ".join(([f"{args.reports[0]!s} (a report)"] if args.reports else []) + ["--markdown"] * bool(args.markdown)
                          + ["--html"] * bool(args.html))
        raise UsageError(f"{given}: taken only by 'odeattn conformance matrix'")
    if args.action == "matrix":
        return matrix(args)
    if args.action == "fuzz":
        return fuzz_command.fuzz(args)
    if args.action == "generate":
        return generate(args)
    if args.action == "mutants":
        return mutants(args)
    return suite(args)


def generate(args) -> int:
    from odeattn.conformance.cases import case_count
    from odeattn.conformance.golden import GOLDEN_DIR, check_writable, generate as write_set
    from odeattn.conformance.cases.target import owned_files

    unused = [o for o, v in (("--backend", args.backend), ("--dtype", args.dtypes), ("-k", args.include), ("--exclude", args.exclude),
                             ("--xfail", args.xfail), ("--json", args.json), ("--junit", args.junit), ("--profile", args.profile),
                             ("--expectations", args.expectations), ("--shard", args.shard), ("--list", args.list),
                             ("--external", args.external), ("--expect-digest", args.expect_digest),
                             ("--fail-fast", args.fail_fast), ("--float64-bound", args.float64_bound)) if v]
    if unused:  # generate writes the whole set: a selection or a run's option would be ignored
        raise UsageError(f"{', '.join(unused)}: not taken by generate (only --golden DIR or --packaged)")
    if (args.golden is None) == (not args.packaged):
        raise UsageError("generate: expected --golden DIR (a new or empty folder, or one holding a golden set) or "
                         "--packaged (rewrite the packaged, sealed set in place)"
                         + ("; got both" if args.packaged else "; got neither"))
    directory = args.golden or GOLDEN_DIR
    with user_input():
        owned_files(directory)  # a folder holding other files is refused: generate touches only its own
        check_writable(directory)  # made if missing
    bar = Progress()
    bar.begin(case_count())
    try:
        written = write_set(directory, progress=lambda name: bar.advance())
    finally:
        bar.close()
    print(f"wrote {written.cases} cases and {written.manifest.name} to {directory} ({written.size / 1e6:.2f} MB), "
          f"digest {written.digest}")
    return 0


def mutants(args) -> int:
    from odeattn.conformance.golden import GOLDEN_DIR, load_cases
    from odeattn.conformance.mutation.mutants import format_field_table, format_table, kill_table, survivors, verdict

    unused = [o for o, v in (("--backend", args.backend), ("--dtype", args.dtypes), ("-k", args.include), ("--exclude", args.exclude),
                             ("--xfail", args.xfail), ("--json", args.json), ("--junit", args.junit),
                             ("--profile", args.profile), ("--expectations", args.expectations),
                             ("--shard", args.shard), ("--list", args.list)) if v]
    if unused:
        raise UsageError(f"{', '.join(unused)}: not taken here (only --golden and -j)")
    with user_input():
        cases = load_cases(args.golden or GOLDEN_DIR)  # a GoldenError: one line per defect
    rows = kill_table(cases, jobs=args.jobs, progress=Progress())
    print(format_table(rows))
    print()
    print(format_field_table(rows))
    print(verdict(rows))
    return 1 if survivors(rows) else 0


def matrix(args) -> int:
    from odeattn.conformance.running.matrix import load_report, markdown, to_html

    unused = [o for o, v in (("--backend", args.backend), ("--dtype", args.dtypes), ("-k", args.include), ("--exclude", args.exclude),
                             ("--xfail", args.xfail), ("--json", args.json), ("--junit", args.junit), ("--golden", args.golden),
                             ("--expectations", args.expectations), ("--shard", args.shard), ("--list", args.list),
                             ("--profile", args.profile)) if v]
    if unused:
        raise UsageError(f"{', '.join(unused)}: not taken by matrix (only REPORT..., --markdown, --html, --force)")
    if not args.reports:
        raise UsageError("matrix: expected one or more --json reports (odeattn conformance --json FILE); got none")
    with user_input():
        inputs = {f"REPORT {p}": p for p in args.reports}
        check_output_path("--markdown", args.markdown, force=args.force, others=inputs)
        check_output_path("--html", args.html, force=args.force, others={**inputs, "--markdown": args.markdown})
        reports = [load_report(p) for p in args.reports]
        text = markdown(reports)
    if args.markdown is None and args.html is None:
        print(text, end="")
    for path, content in ((args.markdown, text), (args.html, args.html and to_html(reports))):
        if path is not None:
            with replacing(path) as tmp:
                Path(tmp).write_text(content)
            print(f"wrote {path}")
    return 0


def prepare(args):
    """(cases, backend refs, notes, backend errors, report header, the built-in names), once the
    options, the golden set (a GoldenError: a line per defect) and the backends are checked; run
    inside user_input, before any case runs."""
    from odeattn.conformance.adapters import BUILTIN, discover
    from odeattn.conformance.adapters.external import load_backends_file
    from odeattn.conformance.golden import GOLDEN_DIR, digest, load_cases
    from ode_ref.precision import DTYPES
    from odeattn.conformance.running.expectations import load as load_expectations
    from odeattn.conformance.running.selection import compile_patterns, select
    from odeattn.conformance.running.reports import environment
    from odeattn.conformance.running.shards import describe as describe_shard, parse_shard, shard

    for d in args.dtypes:
        if d not in DTYPES:
            raise UsageError(f"--dtype: expected one of {', '.join(DTYPES)}; got {d!r}")
    for option, patterns in (("-k", args.include), ("--exclude", args.exclude), ("--xfail", args.xfail)):
        compile_patterns(option, patterns)
    ran_only = [o for o, v in (("--json", args.json), ("--junit", args.junit), ("--profile", args.profile),
                               ("--fail-fast", args.fail_fast)) if v]
    if args.list and ran_only:  # --list runs nothing: an output or a run's option would be ignored
        raise UsageError(f"{', '.join(ran_only)}: not taken with --list, which runs nothing")
    directory = args.golden or GOLDEN_DIR
    inputs = {"--external": args.external, "--golden (its manifest.json)": directory / "manifest.json"}
    check_output_path("--json", args.json, force=args.force, others=inputs)
    check_output_path("--junit", args.junit, force=args.force, others={**inputs, "--json": args.json})
    if args.external is not None and not args.external.is_file():
        raise UsageError(f"--external: expected a file; got {os.fspath(args.external)!r}")
    if args.golden is not None and not args.golden.is_dir():
        raise UsageError(f"--golden: expected a folder; got {os.fspath(args.golden)!r}")
    every = load_cases(directory)
    cases = select(every, args.include, args.exclude)
    if not cases:
        raise UsageError("-k/--exclude: no case matches the patterns")
    args.expectations = load_expectations(args.expectations)
    if args.shard is not None:
        index, count = parse_shard(args.shard)
        chosen = shard(cases, index, count)
        print(describe_shard(cases, chosen, index, count), file=sys.stderr)
        cases, args.shard = chosen, f"{index}/{count}"  # the report's form, whatever spaces it was typed with
    set_digest = digest(directory)
    if args.expect_digest and args.expect_digest.strip().lower() != set_digest:  # hex: either case
        raise UsageError(f"--expect-digest: expected {args.expect_digest}; the golden set's digest is {set_digest}")
    try:
        declared = load_backends_file(args.external) if args.external else None
        refs, notes, errors = discover(args.backend, timeout=args.timeout, declared=declared)
    except ValueError as err:  # its message begins 'backend'
        raise UsageError(f"--{err}") from None
    if args.list:
        return cases, refs, notes, errors, {}, set(BUILTIN)
    header = {"golden": "packaged (sealed)" if args.golden is None else os.fspath(args.golden), "digest": set_digest,
              "cases": len(cases), "suite_cases": len(every), "shard": args.shard, "environment": environment()}
    return cases, refs, notes, errors, header, set(BUILTIN)


def suite(args) -> int:
    import time

    from odeattn.conformance.running.profile import format_profile
    from odeattn.conformance.running.compare import BackendError, UsageRefusal
    from odeattn.conformance.running.runner import run_suite
    from odeattn.conformance.running.reports import format_report, write_json, write_junit
    from odeattn.conformance.running.triage import triage

    start = time.perf_counter()
    with user_input():
        cases, refs, notes, errors, header, taken = prepare(args)
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    setup = time.perf_counter() - start
    print(f"golden set: {header['golden']}, {len(cases)} cases, digest {header['digest']}")
    print(f"backends: {', '.join(r.label for r in refs)} (workers: {args.jobs})", flush=True)
    report = run_suite(refs, cases, xfail=args.xfail, fail_fast=args.fail_fast, jobs=args.jobs, timeout=args.timeout,
                       float64_bound=args.float64_bound, progress=Progress(), taken=taken, dtypes=args.dtypes or None,
                       expectations=args.expectations, usage_stops=True)
    refused = next((e for e in report.errors if isinstance(e, UsageRefusal)), None)
    if refused is not None:  # known once the worker built it, and the run stopped there: no table, no report
        typed = refused.backend in args.backend
        raise UsageError(f"{'--backend' if typed else 'backend'} {refused.backend}: {refused.message}"
                         + ("" if typed else " (an installed plug-in)") + "; give it a name of its own")
    report.notes += notes
    report.warnings += args.expectations.unused({r.backend for r in report.results},
                                                partial=args.shard is not None)
    if report.exit_code:  # what the failures share, and the stage of f each group's first case diverges at
        triage(report, cases, jobs=args.jobs, timeout=args.timeout)
    report.errors += [BackendError(label, message) for label, message in errors]
    print(format_report(report))
    if args.profile:
        print()
        print(format_profile(report.profile, report.wall))
        print(f"before the run: {setup:.1f} s (the golden set loaded and checked, the backends found)")
    if args.json:
        with replacing(args.json) as tmp:
            write_json(report, tmp, {**header, "setup_seconds": setup})
    if args.junit:
        with replacing(args.junit) as tmp:
            write_junit(report, tmp, header)
    return report.exit_code

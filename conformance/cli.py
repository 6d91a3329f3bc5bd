"""`odeattn conformance`: run the golden cases on every installed backend (the main job);
`odeattn conformance generate`: regenerate the golden files (and the seal) from ode_ref;
`odeattn conformance mutants`: run the mutation battery and print its kill table.

Exit codes: 0 everything passed; 1 any failure, error or unexpected pass; 2 usage, or a bad
suite file. Every usage error is found before any case runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from odeattn.cli import check_output_path, positive_int


def register(sub) -> None:
    p = sub.add_parser("conformance", help="check backends against the frozen golden cases (the main job)",
                       description=__doc__)
    p.add_argument("action", nargs="?", choices=["run", "generate", "mutants"], default="run",
                   help="run (default) the suite, generate the golden files from ode_ref, or run the mutation battery")
    p.add_argument("--golden", type=Path, default=None, help="golden directory (default: the packaged, sealed one)")
    p.add_argument("--expect-digest", metavar="SHA256", help="refuse a golden set whose digest differs")
    p.add_argument("--backend", action="append", default=[], metavar="NAME|module:object",
                   help="a backend to run (repeatable); default: every installed one")
    p.add_argument("-k", dest="include", action="append", default=[], metavar="REGEX", help="only cases matching (repeatable, OR)")
    p.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="skip cases matching (repeatable)")
    p.add_argument("--xfail", action="append", default=[], metavar="REGEX",
                   help="expected failures, matched against 'backend/dtype/case' (repeatable); an unexpected pass fails")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    p.add_argument("-j", "--jobs", type=positive_int, default=None, metavar="N",
                   help="worker processes at once (default: the core count)")
    p.add_argument("--timeout", type=_positive_float, default=120.0, metavar="S", help="per-case timeout in seconds (default 120)")
    p.add_argument("--float64-bound", type=_positive_float, default=None, metavar="E",
                   help="also fail a float64 quantity whose relative error exceeds E (e.g. 1e-12)")
    p.add_argument("--json", type=Path, help="write a JSON report here")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    p.set_defaults(func=main)


def _positive_float(text):
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}")
    return value


def _progress():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda total: tqdm(total=total, unit="case", file=sys.stderr, disable=None, leave=False)


def _generate(args) -> int:
    from .cases import case_specs
    from .golden import GOLDEN_DIR, write_golden

    directory = args.golden or GOLDEN_DIR
    progress = _progress()
    try:
        specs = case_specs()
        bar = progress(len(specs)) if progress else None
        path = write_golden(directory, progress=(lambda name: bar.update(1)) if bar else None)
    except (PermissionError, OSError) as err:
        print(f"odeattn conformance generate: {err}", file=sys.stderr)
        return 2
    if bar:
        bar.close()
    files = sorted(Path(directory).glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files) + path.stat().st_size
    from .golden import digest

    print(f"wrote {len(files)} cases and {path.name} to {directory} ({size / 1e6:.2f} MB), digest {digest(directory)}")
    return 0


def _prepare(args):
    """(cases, backend refs, notes, header) or ValueError for any usage error or bad suite file."""
    from .adapters import BUILTIN, discover
    from .golden import GOLDEN_DIR, digest, load_cases
    from .runner import compile_patterns, select

    compile_patterns("--xfail", args.xfail)
    check_output_path("--json", args.json)
    check_output_path("--junit", args.junit)
    directory = args.golden or GOLDEN_DIR
    if args.golden is not None and not args.golden.is_dir():
        raise ValueError(f"--golden: expected a folder; got {os.fspath(args.golden)!r}")
    cases = select(load_cases(directory), args.include, args.exclude)  # GoldenError is a ValueError
    if not cases:
        raise ValueError("-k/--exclude: no case matches the patterns")
    set_digest = digest(directory)
    if args.expect_digest and args.expect_digest != set_digest:
        raise ValueError(f"--expect-digest: expected {args.expect_digest}; the golden set's digest is {set_digest}")
    refs, notes, errors = discover(args.backend, timeout=args.timeout)
    header = {"golden": "packaged (sealed)" if args.golden is None else os.fspath(args.golden), "digest": set_digest,
              "cases": len(cases)}
    return cases, refs, notes, errors, header, set(BUILTIN)


def main(args) -> int:
    """The command, with Ctrl-C and SIGTERM ending it in one line (the workers are killed)."""
    import signal

    def terminated(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("odeattn conformance: interrupted; every worker process was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args) -> int:
    from .pool import core_count

    args.jobs = args.jobs or core_count()
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a plug-in beside the user is found
    if args.action == "generate":
        return _generate(args)
    if args.action == "mutants":
        from .mutants import main as mutants

        return mutants(args)
    from .runner import BackendError, format_report, run_suite, write_json, write_junit

    try:
        cases, refs, notes, errors, header, taken = _prepare(args)
    except ValueError as err:
        for line in str(err).splitlines():
            print(f"odeattn conformance: {line}", file=sys.stderr)
        return 2
    print(f"golden set: {header['golden']}, {len(cases)} cases, digest {header['digest']}")
    print(f"backends: {', '.join(r.label for r in refs)} (workers: {args.jobs})")
    report = run_suite(refs, cases, xfail=args.xfail, fail_fast=args.fail_fast, jobs=args.jobs, timeout=args.timeout,
                       float64_bound=args.float64_bound, progress=_progress(), taken=taken)
    report.notes += notes
    report.errors += [BackendError(label, message) for label, message in errors]
    print(format_report(report))
    if args.json:
        write_json(report, args.json, header)
    if args.junit:
        write_junit(report, args.junit, header)
    return report.exit_code

"""`odeattn conformance`: run the golden cases on every installed backend (the main job), and
`odeattn conformance generate`: regenerate the golden files from ode_ref."""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("conformance", help="check backends against the frozen golden cases (the main job)",
                       description=__doc__)
    p.add_argument("action", nargs="?", choices=["run", "generate"], default="run",
                   help="run (default) the suite, or generate the golden files from ode_ref")
    p.add_argument("--golden", type=Path, default=None, help="golden directory (default: the packaged one)")
    p.add_argument("--backend", action="append", default=[], metavar="NAME|module:object",
                   help="a backend to run (repeatable); default: every installed one")
    p.add_argument("-k", dest="include", action="append", default=[], metavar="REGEX", help="only cases matching (repeatable, OR)")
    p.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="skip cases matching (repeatable)")
    p.add_argument("--xfail", action="append", default=[], metavar="REGEX",
                   help="expected failures, matched against 'backend/dtype/case' (repeatable)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    p.add_argument("--json", type=Path, help="write a JSON report here")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    p.set_defaults(func=main)


def _progress():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda total: tqdm(total=total, unit="case", file=sys.stderr, disable=None, leave=False)


def _generate(args) -> int:
    from .golden import GOLDEN_DIR, write_golden

    directory = args.golden or GOLDEN_DIR
    progress = _progress()
    from .cases import case_specs

    bar = progress(len(case_specs())) if progress else None
    path = write_golden(directory, progress=(lambda name: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    files = sorted(Path(directory).glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files) + path.stat().st_size
    print(f"wrote {len(files)} cases and {path.name} to {directory} ({size / 1e6:.2f} MB)")
    return 0


def resolve_backends(requested):
    """(backends, notes): instances to run, and a line per backend that could not be loaded."""
    from .backends import discover, make_backend

    available = discover()
    chosen = requested or list(available)
    backends, notes = [], []
    for name in chosen:
        source = available.get(name, name)  # a name, or a 'module:object' reference
        try:
            backends.append(make_backend(source))
        except ImportError as err:
            if requested:
                raise SystemExit(f"--backend {name}: cannot be loaded ({err})")
            notes.append(f"{name}: not installed ({err})")
    return backends, notes


def main(args) -> int:
    if args.action == "generate":
        return _generate(args)
    from .golden import GOLDEN_DIR, load_cases
    from .runner import format_report, run_suite, select, write_json, write_junit

    try:
        cases = select(load_cases(args.golden or GOLDEN_DIR), args.include, args.exclude)
        backends, notes = resolve_backends(args.backend)
    except (ValueError, TypeError) as err:
        print(f"odeattn conformance: {err}", file=sys.stderr)
        return 2
    if not cases:
        print("odeattn conformance: no case matches the -k/--exclude patterns", file=sys.stderr)
        return 2
    names = ", ".join(f"{b.name} ({'/'.join(b.dtypes)})" for b in backends)
    print(f"{len(cases)} cases x {names}")
    results = run_suite(backends, cases, xfail=args.xfail, fail_fast=args.fail_fast, progress=_progress())
    print(format_report(results))
    for note in notes:
        print(f"skipped backend {note}")
    if args.json:
        write_json(results, args.json)
    if args.junit:
        write_junit(results, args.junit)
    return 1 if any(r.failed for r in results) else 0

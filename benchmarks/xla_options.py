"""Which golden cases' JAX outputs the suite's XLA options (tests/conftest.py's SUITE_XLA_FLAGS)
change, bit for bit, against XLA's defaults: tests/conformance/test_xla_defaults.py's CHANGED.

XLA compiles for the host CPU, so the list holds for the CPU it was measured on (the project's
CI machine) and is measured again after a jaxlib upgrade or on another CPU:

    python benchmarks/xla_options.py        # prints CHANGED; about 5 min on 2 cores

Each dtype's outputs are computed under each set of options in a process of its own (XLA reads
XLA_FLAGS once), with an empty JAX cache, two processes at a time."""

import argparse
import concurrent.futures
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from odeattn.conformance.adapters.jax import JaxAdapter

ROWS = JaxAdapter.dtypes  # the JAX adapter's dtypes, each compared
ROOT = Path(__file__).resolve().parents[1]


def suite_flags() -> str:
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return " ".join(module.SUITE_XLA_FLAGS)


def save_outputs(dtype: str, path: str) -> None:
    """Every golden case's outputs on the JAX adapter in dtype, as run_case computes them: npz
    entries 'case|quantity' (a case the dtype skips or marks untestable has none)."""
    from odeattn.conformance.adapters import BUILTIN, make_adapter
    from ode_ref.precision import HALF_DTYPES
    from odeattn.conformance.golden import load_cases
    from odeattn.conformance.running.compare import attempt_case

    backend = make_adapter(BUILTIN["jax"].reference)
    saved = {}
    for case in load_cases():
        if dtype in HALF_DTYPES and case.untestable(dtype):
            continue
        reply, outputs = attempt_case(backend, case, dtype)
        if reply["status"] == "error":
            raise RuntimeError(f"{case.name} in {dtype}: {reply['message']}")
        # a half output widened to float32, exactly (np.savez keeps ml_dtypes' types as raw bytes)
        saved.update({f"{case.name}|{q}": np.asarray(v).astype(np.float32) if dtype in HALF_DTYPES else np.asarray(v)
                      for q, v in outputs.items()})
    np.savez(path, **saved)


def _run(flags: str, dtype: str, path: str) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XLA_FLAGS": flags, "XDG_CACHE_HOME": cache, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, __file__, "--outputs", dtype, path], env=env, check=True)


def changed(a, b) -> tuple[list, int, float]:
    """(the cases with an output whose bits differ, the count of such outputs, the largest
    difference relative to the output's largest entry)."""
    assert a.files == b.files, "the two runs computed different outputs"
    differ = [k for k in a.files if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
    rel = [float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()
                 / max(np.abs(b[k].astype(np.float64)).max(), np.finfo(np.float64).tiny)) for k in differ]
    return sorted({k.split("|")[0] for k in differ}), len(differ), max(rel, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outputs", nargs=2, metavar=("DTYPE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.outputs:
        return save_outputs(*args.outputs)
    flags = suite_flags()
    with tempfile.TemporaryDirectory() as out, concurrent.futures.ThreadPoolExecutor(2) as pool:
        paths = {(which, d): f"{out}/{which}-{d}.npz" for which in ("suite", "defaults") for d in ROWS}
        runs = [pool.submit(_run, flags if which == "suite" else "", d, p) for (which, d), p in paths.items()]
        for run in runs:
            run.result()
        print("CHANGED = {")
        for d in ROWS:
            suite = np.load(paths["suite", d])
            cases, outputs, rel = changed(suite, np.load(paths["defaults", d]))
            total = len(suite.files)
            print(f"    {d!r}: {cases!r},  # {len(cases)} cases, {outputs} of {total} outputs, at most {rel:.1e} relative")
        print("}")


if __name__ == "__main__":
    main()

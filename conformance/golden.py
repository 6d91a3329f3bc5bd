"""Frozen golden cases on disk: one safetensors file per case plus manifest.json.

    golden/manifest.json     {"format": 1, "cases_version", "spec_version", "cases": [...]}
    golden/<case>.safetensors  x, padding_mask (if any), the parameters under their names,
                               f0, trajectory (steps + 1, batch, seq, d_model), z1 — float64

Each manifest entry holds the case's config, seeds, shapes, per-quantity e32 and tolerances
(per dtype, see tolerance.py), the file name and its sha256. Both formats are readable from C++
or Rust; nothing here unpickles or executes code. load_cases verifies every checksum first.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

import ode_ref as R

from .cases import CASES_VERSION, Case, build_all
from .tolerance import UNIT_ROUNDOFF, tolerance

FORMAT = 1
GOLDEN_DIR = Path(__file__).parent / "golden"
MANIFEST = "manifest.json"
DTYPES = ("float64", "float32")  # tolerances stored for these (others derive from e32 alike)


class GoldenError(ValueError):
    """A golden file or manifest that is missing, tampered with, truncated or malformed."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tensors(case: Case) -> dict:
    t = {"x": case.x, "f0": case.f0, "trajectory": case.trajectory, "z1": case.z1}
    if case.padding_mask is not None:
        t["padding_mask"] = case.padding_mask
    t.update(case.params)
    return {k: np.asarray(v, order="C") for k, v in t.items()}


def _entry(case: Case, file: str, sha: str) -> dict:
    return {
        "name": case.name,
        "config": case.config.to_dict(),
        "param_seed": case.param_seed,
        "input_seed": case.input_seed,
        "shape": list(case.x.shape),
        "padding": case.padding_mask is not None,
        "file": file,
        "sha256": sha,
        "quantities": {
            q: {"e32": e, "tolerance": {d: tolerance(e, d) for d in DTYPES}} for q, e in case.e32.items()
        },
    }


def write_golden(directory=GOLDEN_DIR, cases=None, progress=None) -> Path:
    """Write every case and the manifest; returns the manifest path. Deterministic bytes."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cases = build_all() if cases is None else cases
    entries = []
    for case in cases:
        file = f"{case.name}.safetensors"
        save_file(_tensors(case), str(directory / file))
        entries.append(_entry(case, file, _sha256(directory / file)))
        if progress:
            progress(case.name)
    manifest = {
        "format": FORMAT,
        "cases_version": CASES_VERSION,
        "spec_version": R.__version__,
        "tolerance_model": {"safety": 32.0, "floor_ulps": 1.0, "unit_roundoff": UNIT_ROUNDOFF},
        "cases": entries,
    }
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def read_manifest(directory=GOLDEN_DIR) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise GoldenError(f"golden manifest: no file {os.fspath(path)!r}; run `odeattn conformance generate`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GoldenError(f"golden manifest {os.fspath(path)!r}: not valid JSON ({err})") from err
    if manifest.get("format") != FORMAT:
        raise GoldenError(f"golden manifest: expected format {FORMAT}; got {manifest.get('format')!r}")
    return manifest


def load_case(entry: dict, directory=GOLDEN_DIR) -> Case:
    """One case from its manifest entry, after verifying the file's sha256."""
    from safetensors.numpy import load_file

    path = Path(directory) / entry["file"]
    if not path.is_file():
        raise GoldenError(f"golden case {entry['name']!r}: file {entry['file']!r} is missing")
    sha = _sha256(path)
    if sha != entry["sha256"]:
        raise GoldenError(
            f"golden case {entry['name']!r}: {entry['file']} has sha256 {sha[:16]}..., the manifest "
            f"says {entry['sha256'][:16]}...: the file was modified or truncated; regenerate it"
        )
    t = load_file(str(path))
    config = R.ODEConfig.from_any(entry["config"])
    params = {k: t[k] for k in R.param_shapes(config)}
    return Case(
        name=entry["name"], config=config, params=params, x=t["x"], padding_mask=t.get("padding_mask"),
        f0=t["f0"], trajectory=t["trajectory"], e32={q: v["e32"] for q, v in entry["quantities"].items()},
        input_seed=entry["input_seed"], param_seed=entry["param_seed"],
    )


def load_cases(directory=GOLDEN_DIR) -> list[Case]:
    """Every frozen case, each verified against its checksum."""
    return [load_case(e, directory) for e in read_manifest(directory)["cases"]]

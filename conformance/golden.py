"""Frozen golden cases on disk: one safetensors file per case plus manifest.json, sealed.

    golden/manifest.json       {"format", "cases_version", "spec_version", "cases": [...]}
    golden/<case>.safetensors  x, padding_mask (if any), the parameters under their names, and
                               block cases: f0, trajectory (steps + 1, batch, seq, d_model);
                               decode cases: decode (batch, seq, d_model), float64;
                               grad cases: z1_bar, x_bar and grad.<parameter>, float64;
                               encoder cases: z (the stack's output), float64;
                               lm cases: x the token ids (batch, seq, 1), logits, float64

Each manifest entry holds the case's name, its config (the fields that differ from ODEConfig's
defaults), shape, padding flag, decoded (decode cases: tokens decoded after the prompt), vjp
(grad cases: true), encoder (encoder cases: true, their config an ODEEncoderConfig's fields), lm (language model
cases: true, their config an LMConfig's fields), per-quantity e32 (tolerances derive from it, tolerance.py), the file name
and its sha256. Since format 6 it also holds, per half dtype, either the spec's error under the
half-precision policy per quantity (e16 for float16, ebf16 for bfloat16, the quantities of e32)
or, in half_untestable, the reason the case has no meaning in that dtype (half.py's rules:
grad, encoder and LM cases, float16's range and overflow, BitLinear levels flipped). A team's set
may omit both: its half rows are then untestable, "no e16 in this golden set". Everything stored is read: the versions are checked against this code, the shape
and padding against the file, the checksums against the bytes. Every size a manifest declares is
bounded (MAX_SIZE) and checked against the bytes its file holds before anything is built from it;
every stored array must be float64 (the padding mask bool) and finite, and a trajectory's first
state must be x. A team's set (not sealed) also has each stored e32 bounded by the spec's own
float32 error for its case, recomputed at load (E32_FACTOR; docs/specification.md says why), and
each stored e16 and ebf16 likewise by the spec's own error under the policy (check_e_half).

Sealing: the set's digest is the sha256 of manifest.json, whose entries hold every file's
sha256, so it covers every byte. The packaged set's digest, and each entry's, are recorded in
code (seal.py, written by `odeattn conformance generate`); a run on the packaged set refuses any
difference, naming the case. A team's own set (--golden DIR) is validated the same way and its
digest printed, so a CI can pin it with --expect-digest.

Both formats are readable from C++ or Rust; nothing here unpickles or executes code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

import ode_ref as R

from ode_ref.config import stored_fields
from ode_ref.files import replacing
from ode_ref.precision import HALF_DTYPES

from .cases import CASES_VERSION, Case, build_all, half_fields, same_case, with_half
from .cases.half import HALF_FIELDS
from .cases.case import names_text
from .cases.kinds import BLOCK, KINDS, kind_of_entry
from .cases.target import MANIFEST, check_names, check_writable, owned_files
from .cases.tolerance import UNIT_ROUNDOFF

FORMAT = 7  # 3 added decode cases (the optional "decoded"), 4 grad cases ("vjp"), 5 encoder cases ("encoder"),
# 6 the half-precision errors ("e16", "ebf16", "half_untestable"), 7 language model cases ("lm");
# older sets read as they did
READ_FORMATS = (2, 3, 4, 5, 6, 7)
GOLDEN_DIR = Path(__file__).parent / "golden"
SEAL_FILE = Path(__file__).parent / "seal.py"

_NUMBER = {"type": "number", "minimum": 0}
# The largest size a manifest may declare: steps, batch, seq, d_model, heads and decoded tokens each.
# Sizes are then checked against the bytes of the case's file (_check_sizes), before any list or
# array is built from them: a manifest cannot make loading allocate more than its files hold.
MAX_SIZE = 1 << 16
_SIZE = {"type": "integer", "minimum": 1, "maximum": MAX_SIZE}
# A team's stored e32 may be at most this many times the spec's own float32 error for the case,
# recomputed at load (counted as at least one float32 rounding, 2^-24); see docs/specification.md,
# "The stored e32 of a team's golden set is bounded".
E32_FACTOR = 256.0
# A team's stored e16 or ebf16 may be at most this many times the spec's own error under the
# policy, recomputed at load (at least one rounding of the dtype): the spread a regeneration on
# another CPU allows (tests/conformance/test_golden.py). Not 256: with a floor of u = 2^-8,
# bfloat16's bound would reach 1.0, a tolerance that passes anything.
E_HALF_FACTOR = 8.0
_FLAGGED = [k for k in KINDS.values() if k.flag is not None]  # the kinds a manifest entry marks: decoded, vjp, encoder, lm
SCHEMA = {
    "type": "object",
    "required": ["format", "cases_version", "spec_version", "cases"],
    "additionalProperties": False,
    "properties": {
        "format": {"enum": list(READ_FORMATS)},
        "cases_version": {"const": CASES_VERSION},
        "spec_version": {"const": R.__version__},
        "cases": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "config", "shape", "padding", "file", "sha256", "e32"],
                "additionalProperties": False,
                # each kind's config schema (cases/kinds.py), chosen by its flag; none: the block kind's
                "allOf": [{"if": {"required": [k.flag]}, "then": {"properties": {"config": k.config_schema(_SIZE)}}} for k in _FLAGGED]
                + [{"if": {"not": {"anyOf": [{"required": [k.flag]} for k in _FLAGGED]}},
                    "then": {"properties": {"config": BLOCK.config_schema(_SIZE)}}}],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                    "config": {"type": "object"},
                    "shape": {"type": "array", "items": _SIZE, "minItems": 3, "maxItems": 3},
                    "padding": {"type": "boolean"},
                    **{k.flag: k.flag_schema(_SIZE) for k in _FLAGGED},
                    "file": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+\\.safetensors$"},
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "e32": {"type": "object", "additionalProperties": _NUMBER},
                    "e16": {"type": "object", "additionalProperties": _NUMBER},
                    "ebf16": {"type": "object", "additionalProperties": _NUMBER},
                    "half_untestable": {"type": "object", "additionalProperties": False,
                                        "properties": {d: {"type": "string", "minLength": 1} for d in HALF_DTYPES}},
                },
            },
        },
    },
}


class GoldenError(ValueError):
    """A golden set that is missing, tampered with, truncated or malformed: one line a defect."""

    def __init__(self, defects):
        self.defects = [defects] if isinstance(defects, str) else list(defects)
        super().__init__("\n".join(self.defects))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_digest(entry: dict) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _tensors(case: Case) -> dict:
    t = {"x": case.x, **case.kind.stored_outputs(case)}
    if case.padding_mask is not None:
        t["padding_mask"] = case.padding_mask
    t.update(case.params)
    return {k: np.asarray(v, order="C") for k, v in t.items()}


def _entry(case: Case, file: str, sha: str) -> dict:
    return {
        "name": case.name,
        "config": stored_fields(case.config),
        "shape": list(case.x.shape),
        "padding": case.padding_mask is not None,
        **case.kind.flags(case),
        "file": file,
        "sha256": sha,
        "e32": dict(case.e32),
        **{HALF_FIELDS[d]: dict(getattr(case, HALF_FIELDS[d])) for d in HALF_DTYPES if getattr(case, HALF_FIELDS[d]) is not None},
        **({"half_untestable": dict(case.half_untestable)} if case.half_untestable else {}),
    }


def write_golden(directory=GOLDEN_DIR, cases=None, progress=None) -> Path:
    """Write every case and the manifest; returns the manifest path. Deterministic bytes.
    Writing the packaged folder also rewrites the seal (seal.py)."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    owned = owned_files(directory)  # a folder that is not empty and holds no golden set is refused
    check_writable(directory)
    cases = build_all() if cases is None else cases
    check_names(directory, owned, [f"{case.name}.safetensors" for case in cases])
    kept = _kept(cases, directory)  # read before any file is removed
    entries = []
    for stale in owned - {f"{name}.safetensors" for name in kept}:  # a renamed or removed case leaves no file behind
        (directory / stale).unlink(missing_ok=True)
    for case in cases:
        file = f"{case.name}.safetensors"
        if case.name in kept:
            case = with_half(kept[case.name])  # its file and e32 as stored; e16 and ebf16 against its golden
        else:
            with replacing(directory / file) as tmp:
                save_file(_tensors(case), str(tmp))
        entries.append(_entry(case, file, _sha256(directory / file)))
        if progress:
            progress(case.name)
    manifest = {"format": FORMAT, "cases_version": CASES_VERSION, "spec_version": R.__version__, "cases": entries}
    path = directory / MANIFEST
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if directory.resolve() == GOLDEN_DIR.resolve():
        write_seal(path)
    return path


def _kept(cases, directory: Path) -> dict:
    """name -> the stored Case, for each case that directory's (valid) set already holds: the same
    config and inputs bit for bit, and outputs within the float64 bound of the built ones. Its
    file and its e32 are kept as they are: the spec's float64 results move in the last bits from
    one CPU to another (tests/conformance/test_golden.py), so regenerating on another machine
    leaves the stored files byte-identical instead of rewriting them all."""
    try:
        stored = {e["name"]: e for e in read_manifest(directory)["cases"]}
    except GoldenError:
        return {}  # none yet, or not this code's: every case is written afresh
    kept = {}
    for case in cases:
        entry = stored.get(case.name)
        if entry is None or entry["file"] != f"{case.name}.safetensors":
            continue
        try:
            old = load_case(entry, directory)
        except GoldenError:
            continue
        if same_case(case, old):
            kept[case.name] = old
    return kept


@dataclasses.dataclass(frozen=True)
class Written:
    """What generate wrote: the manifest, the number of case files, their bytes with the
    manifest's, and the set's digest."""

    manifest: Path
    cases: int
    size: int
    digest: str


def generate(directory=GOLDEN_DIR, progress=None) -> Written:
    """write_golden of every case into directory, and what it wrote (`odeattn conformance generate`).
    progress: called with each case's name once it is written."""
    path = write_golden(directory, progress=progress)
    files = [Path(directory) / name for name in owned_files(directory)]  # the set's, not a user's beside it
    return Written(path, len(files), sum(f.stat().st_size for f in files) + path.stat().st_size, digest(directory))


def write_seal(manifest_path: Path, seal_file: Path = SEAL_FILE) -> None:
    manifest = json.loads(manifest_path.read_text())
    lines = [
        '"""The seal of the packaged golden set. Written by `odeattn conformance generate`; never edit."""',
        "",
        f'DIGEST = "{_sha256(manifest_path)}"  # sha256 of golden/manifest.json',
        "ENTRIES = {  # case name -> sha256 of its manifest entry (canonical JSON)",
        *[f'    "{e["name"]}": "{entry_digest(e)}",' for e in manifest["cases"]],
        "}",
    ]
    seal_file.write_text("\n".join(lines) + "\n")


def digest(directory=GOLDEN_DIR) -> str:
    """The set's digest: sha256 of its manifest.json."""
    return _sha256(Path(directory) / MANIFEST)


def _where(path) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def validate_manifest(manifest, directory: Path) -> list[str]:
    """Every defect of a parsed manifest, one line each, naming the file and the field."""
    import jsonschema

    where = os.fspath(Path(directory) / MANIFEST)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    defects = [f"{where}: {_where(e.absolute_path)}: {e.message}"
               for e in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))]
    cases = manifest.get("cases") if isinstance(manifest, dict) else None
    listed = {e.get("file") for e in cases if isinstance(e, dict)} if isinstance(cases, list) else set()
    present = {p.name for p in Path(directory).iterdir()} - {MANIFEST}
    unlisted = [f"{os.fspath(Path(directory) / extra)}: not listed in {MANIFEST}; a golden folder holds only its cases"
                for extra in sorted(present - listed)]
    if defects:
        return defects + unlisted
    names, files = set(), set()
    for i, e in enumerate(manifest["cases"]):
        field = f"{where}: $.cases[{i}]"
        if e["name"] in names:
            defects.append(f"{field}.name: {e['name']!r} is listed twice")
        if e["file"] in files:
            defects.append(f"{field}.file: {e['file']!r} is listed twice")
        names.add(e["name"])
        files.add(e["file"])
        try:
            kind_of_entry(e)
        except ValueError as err:  # two kinds' flags
            defects.append(f"{field}: {err}")
            continue
        try:
            config = config_of_entry(e)
        except (TypeError, ValueError) as err:
            defects.append(f"{field}.config: {err}")
            continue
        defects += _check_sizes(e, config, Path(directory), field) or _check_half(e, field)  # sizes first: one line an entry
    return defects + unlisted


def _check_half(entry: dict, field: str) -> list:
    """The entry's e16 and ebf16 against its e32 (the same quantities) and its half_untestable (a
    dtype has its errors or the reason it has none, not both). One line at most."""
    reasons = entry.get("half_untestable", {})
    for dtype in HALF_DTYPES:
        name = HALF_FIELDS[dtype]
        if name in entry and dtype in reasons:
            return [f"{field}.{name}: expected either {name} or half_untestable.{dtype}, not both"]
        if name in entry and set(entry[name]) != set(entry["e32"]):
            return [f"{field}.{name}: expected the quantities of e32 ({names_text(sorted(entry['e32']))}); "
                    f"got [{names_text(repr(q) for q in sorted(entry[name]))}]"]
    return []


def config_of_entry(entry: dict):
    """The entry's config, of its kind's config class (an ODEEncoderConfig for an encoder case)."""
    return kind_of_entry(entry).config_type.from_any(entry["config"])


def _expected_arrays(entry: dict, config) -> dict:
    """name -> shape of every array a (schema-valid) entry's file holds; tuples only, no arrays."""
    kind, shape = kind_of_entry(entry), tuple(entry["shape"])
    expected = {"x": shape, **kind.file_arrays(shape, config), **kind.param_shapes(config)}
    if entry["padding"]:
        expected["padding_mask"] = shape[:2]
    return expected


def _itemsize(name: str) -> int:
    return 1 if name == "padding_mask" else 8  # bool; every other array float64


def _check_sizes(entry: dict, config, directory: Path, field: str) -> list:
    """The entry's sizes against each other, against its e32 (its kind's check_entry) and against
    the bytes of its file (a stat, no read): a manifest that declares more than it or its file
    holds is refused before anything is built from its sizes. One line at most."""
    kind = kind_of_entry(entry)
    defect = kind.check_entry(entry, config)
    if defect is not None:
        return [f"{field}.{defect[0]}: {defect[1]}"]
    path = directory / entry["file"]
    if not path.is_file():
        return []  # reported by name when the case is loaded
    need = sum(_itemsize(k) * math.prod(s) for k, s in _expected_arrays(entry, config).items())
    have = path.stat().st_size
    if need > have:
        return [f"{field}: its sizes ({kind.sizes_text(entry, config)}) need at least {need} bytes of arrays; "
                f"{os.fspath(path)} holds {have}"]
    return []


def check_seal(manifest: dict, directory: Path) -> list[str]:
    """Differences between the packaged manifest and the seal in code, one line a case."""
    from . import seal

    where = os.fspath(Path(directory) / MANIFEST)
    got = {e["name"]: entry_digest(e) for e in manifest["cases"]}
    defects = [f"{where}: case {n!r} is missing from the packaged set (sealed)" for n in seal.ENTRIES if n not in got]
    defects += [f"{where}: case {n!r} is not in the sealed set" for n in got if n not in seal.ENTRIES]
    defects += [f"{where}: case {n!r} differs from the sealed set (config, e32 or file checksum)"
                for n, d in got.items() if n in seal.ENTRIES and d != seal.ENTRIES[n]]
    if not defects and digest(directory) != seal.DIGEST:
        defects.append(f"{where}: the file differs from the sealed set (digest {digest(directory)[:16]}..., sealed "
                       f"{seal.DIGEST[:16]}...)")
    return defects


def _no_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not a number JSON allows", name, 0)


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > 18:  # parsed before any bound is checked: a 5000-digit integer is no size
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits is no size or count")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{text[:30]} is not a finite number (it overflows float64)")
    return value


def read_manifest(directory=GOLDEN_DIR) -> dict:
    """The parsed, validated manifest (sealed, for the packaged folder); GoldenError otherwise."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        how = "--packaged" if directory.resolve() == GOLDEN_DIR.resolve() else f"--golden {os.fspath(directory)}"
        raise GoldenError(f"{os.fspath(path)}: no such file; run `odeattn conformance generate {how}`")
    try:
        manifest = json.loads(path.read_text(), parse_constant=_no_constant, parse_float=_finite_float,
                              parse_int=_small_int)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise GoldenError(f"{os.fspath(path)}: not valid JSON ({err})") from err
    defects = validate_manifest(manifest, directory)
    if not defects and directory.resolve() == GOLDEN_DIR.resolve():
        defects = check_seal(manifest, directory)
    if defects:
        raise GoldenError(defects)
    return manifest


def load_case(entry: dict, directory=GOLDEN_DIR) -> Case:
    """One case from its (validated) manifest entry, after verifying the file's sha256, the
    arrays' names, shapes and dtypes, that every one is finite and that the trajectory starts at
    x; for a team's set (not the packaged, sealed one), each stored e32 is also bounded by the
    spec's own float32 error for the case, recomputed here (check_e32)."""
    from safetensors.numpy import load

    path = Path(directory) / entry["file"]
    if not path.is_file():
        raise GoldenError(f"{os.fspath(path)}: missing (case {entry['name']!r})")
    data = path.read_bytes()  # read once: hashed, then parsed from the same bytes
    sha = hashlib.sha256(data).hexdigest()
    if sha != entry["sha256"]:
        raise GoldenError(f"{os.fspath(path)}: sha256 {sha[:16]}..., the manifest says {entry['sha256'][:16]}...: "
                          "the file was modified or truncated")
    try:
        t = load(data)
    except Exception as err:  # a file that matches its checksum but is not safetensors
        raise GoldenError(f"{os.fspath(path)}: not a readable safetensors file ({err})") from err
    config = config_of_entry(entry)
    kind = kind_of_entry(entry)
    expected = _expected_arrays(entry, config)
    if set(t) != set(expected) or any(t[k].shape != s for k, s in expected.items()):
        got = {k: list(v.shape) for k, v in t.items()}
        raise GoldenError(f"{os.fspath(path)}: expected tensors {dict((k, list(s)) for k, s in expected.items())}; got {got}")
    _check_arrays(t, path, kind, _roles(kind, entry, config, expected))
    case = Case(
        name=entry["name"], config=config, params={k: t[k] for k in kind.param_shapes(config)}, x=t["x"],
        padding_mask=t.get("padding_mask"), e32=dict(entry["e32"]), kind=kind,
        e16=entry.get("e16"), ebf16=entry.get("ebf16"), half_untestable=dict(entry.get("half_untestable", {})),
        **{"f0": None, "trajectory": None, **kind.from_file(t, config, entry)})
    if Path(directory).resolve() != GOLDEN_DIR.resolve():  # the packaged set's e32 are sealed
        defects = check_e32(case, Path(directory)) or check_e_half(case, Path(directory))
        if defects:
            raise GoldenError(defects)
    return case


def _roles(kind, entry: dict, config, expected: dict) -> dict:
    """name -> what each array of the entry's file is: an input, a (stored) quantity or a parameter."""
    inputs = ("x", "padding_mask", *kind.inputs)
    outputs = kind.output_shapes(tuple(entry["shape"]), config)
    return {name: "input" if name in inputs else "quantity" if name in outputs else "parameter"
            for name in expected}


def _check_arrays(t: dict, path: Path, kind, roles: dict) -> None:
    """GoldenError naming the file and the array unless every array is float64 (the padding mask
    bool) and finite, and the kind's own check of its arrays passes (a block's trajectory starts at x)."""
    for name, value in t.items():
        want = np.bool_ if name == "padding_mask" else np.float64
        if value.dtype != want:
            raise GoldenError(f"{os.fspath(path)}: array {name!r}: expected dtype {np.dtype(want)}; got {value.dtype}")
        if want is np.float64 and not np.isfinite(value).all():
            at = np.argwhere(~np.isfinite(value))[0]
            raise GoldenError(f"{os.fspath(path)}: array {name!r}, a stored {roles[name]}, holds {value[tuple(at)]} at "
                              f"{at.tolist()}; expected finite values (a non-finite golden value passes or fails "
                              "any backend alike)")
    defect = kind.check_file(t)
    if defect is not None:
        raise GoldenError(f"{os.fspath(path)}: {defect}")


def check_e32(case: Case, directory: Path) -> list:
    """One line if any stored e32 of the case exceeds E32_FACTOR times the spec's own float32
    error for it, recomputed here (at least 2^-24, one float32 rounding: below it the tolerance
    is its floor anyway). Tolerances derive from e32: an inflated one lets a wrong backend pass."""
    golden = {q: a for q, a in case.quantities().items() if q in case.e32}
    try:
        with np.errstate(all="ignore"):  # a float32 overflow gives a non-finite error, refused below
            recomputed = case.kind.float32_errors(case.config, case.params, case.x, case.padding_mask, golden,
                                                  decoded=case.decoded, inputs=case.inputs)
    except (ValueError, TypeError, ArithmeticError) as err:
        return [f"{os.fspath(directory / MANIFEST)}: case {case.name!r}: the spec cannot run it in float32 to bound its "
                f"e32 ({err})"]
    floor = UNIT_ROUNDOFF["float32"]
    over = [q for q in case.e32 if not case.e32[q] <= E32_FACTOR * max(recomputed[q], floor)]  # NaN: over
    if not over:
        return []
    q = max(over, key=lambda q: case.e32[q] / max(recomputed[q], floor))
    more = f" (and {len(over) - 1} other quantit{'y' if len(over) == 2 else 'ies'})" if len(over) > 1 else ""
    return [f"{os.fspath(directory / MANIFEST)}: case {case.name!r}: e32.{q} = {case.e32[q]:.3g} is over "
            f"{E32_FACTOR:g} times the spec's own float32 error for this case, {recomputed[q]:.3g} recomputed here "
            f"(counted as at least 2^-24){more}; a tolerance derives from e32, so this one would let wrong "
            "results pass"]


def check_e_half(case: Case, directory: Path) -> list:
    """check_e32 for a team's stored e16 and ebf16: one line if one exceeds E_HALF_FACTOR times the
    spec's own error under the half policy, recomputed here (half.py; at least one rounding of the
    dtype), or if the spec finds the case untestable in a dtype the set stores errors for."""
    stored = {d: getattr(case, HALF_FIELDS[d]) for d in HALF_DTYPES if getattr(case, HALF_FIELDS[d]) is not None}
    if not stored:
        return []  # a set without them: its half rows are untestable, and say so
    recomputed = half_fields(case)
    where = f"{os.fspath(directory / MANIFEST)}: case {case.name!r}"
    for dtype, errors in stored.items():
        name, spec = HALF_FIELDS[dtype], recomputed[HALF_FIELDS[dtype]]
        if spec is None:
            return [f"{where}: {name} is stored, but the case is untestable in {dtype} "
                    f"({recomputed['half_untestable'][dtype]})"]
        floor = UNIT_ROUNDOFF[dtype]
        over = [q for q in errors if not errors[q] <= E_HALF_FACTOR * max(spec[q], floor)]
        if over:
            q = max(over, key=lambda q: errors[q] / max(spec[q], floor))
            return [f"{where}: {name}.{q} = {errors[q]:.3g} is over {E_HALF_FACTOR:g} times the spec's own {dtype} error "
                    f"under the half policy, {spec[q]:.3g} recomputed here (counted as at least {floor:.3g}); a "
                    "tolerance derives from it, so this one would let wrong results pass"]
    return []


def load_cases(directory=GOLDEN_DIR) -> list[Case]:
    """Every frozen case, the manifest validated (and sealed) and each file checked; GoldenError
    with one line for each case that fails."""
    cases, defects = [], []
    for e in read_manifest(directory)["cases"]:
        try:
            cases.append(load_case(e, directory))
        except GoldenError as err:
            defects += err.defects
    if defects:
        raise GoldenError(defects)
    return cases

"""A fuzz finding as a folder a user attaches to a bug report, and its replay.

    config.json          the config (every field)
    weights.safetensors  the parameters, float64, under the spec's names
    x.npy                the input, float64 (batch, seq, d_model)
    padding_mask.npy     bool (batch, seq); all True when the example has no mask (case.json says which)
    z1_bar.npy           a grad example's cotangent of z(1)
    expected.safetensors the spec's float64 quantities (f0, step_k, z1; prefill, decode_k; x_bar, grad.*)
    got.safetensors      the backend's, widened to float64 (exactly)
    case.json            backend, dtype, kind, the quantity, err/tol, the localisation and the command
                         that reruns exactly this example

Replaying reads only data: np.load(allow_pickle=False) and safetensors, so a folder holding a
pickle is refused, never executed. The spec's expected outputs are recomputed from the inputs, not
read from the folder.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


from .draw import FUZZED_KINDS, case_of, describe_input, describe_padding
from ..cases.kinds import kind_of

REQUIRED = ("case.json", "config.json", "weights.safetensors", "x.npy", "padding_mask.npy")
NPY_MAGIC = b"\x93NUMPY"  # a .npy file's first bytes
FORMAT = 1


def check_writable_folder(option: str, folder, lost: str) -> None:
    """ValueError naming option unless folder is one (or can be made where it would be) that takes
    new entries: a folder made and removed there, so a read-only place is found before a run, not
    after it, when `lost` (what would be lost) is gone."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option}: expected a folder; got the file {str(folder)!r}")
    parent = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise ValueError(f"{option}: {str(parent)!r} is not a folder, so {str(folder)!r} cannot be made")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".odeattn-fuzz-check."))
    except OSError as err:
        raise ValueError(f"{option}: {str(folder)!r} cannot be written ({err.strerror or err}); {lost}") from None


def folder_name(backend: str, dtype: str, suffix: str = "") -> str:
    """A file name for a backend (a reference may hold ':' or spaces), a search's suffix (the encoder
    stack's, fuzz.ENCODER_SUFFIX) and dtype: the backend's part cut to keep the name within 120
    characters, so that two searches or dtypes of one backend never share a name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in backend)
    return f"{safe[:119 - len(suffix) - len(dtype)]}{suffix}-{dtype}"


def replay_command(directory: Path, backend: str, dtype: str, model=None) -> str:
    """The command that reruns a folder's example: on the backend, or on a model file (model:
    its (file, config, weights) paths, and the runtime if not the default)."""
    q = shlex.quote
    if model is not None:
        runtime = model[3] if len(model) > 3 and model[3] not in (None, "onnxruntime") else None
        return (f"odeattn conformance fuzz --replay {q(str(directory))} --model {q(str(model[0]))} --config {q(str(model[1]))} "
                f"--weights {q(str(model[2]))}" + (f" --runtime {q(runtime)}" if runtime else ""))
    return f"odeattn conformance fuzz --replay {q(str(directory))} --backend {q(backend)} --dtype {dtype}"


def write_repro(directory: Path, finding, backend: str, dtype: str, model=None) -> Path:
    """Write finding (fuzz.Finding) as the folder directory, whole or not at all; returns it. The
    files are written into a fresh sibling folder first, which then becomes directory (or, where
    directory exists, its files replace theirs one by one: the caller has refused an existing
    folder unless told to overwrite). model: a model file's (file, config, weights) paths and its
    runtime, for the rerun command."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        _write_files(staging, directory, finding, backend, dtype, model)
        if not directory.exists():
            os.rename(staging, directory)
            return directory
        for f in staging.iterdir():
            os.replace(f, directory / f.name)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _write_files(directory: Path, named: Path, finding, backend: str, dtype: str, model) -> None:
    """The repro folder's files into directory; named: the folder's final path (case.json's command)."""
    case, d = finding.case, finding.draw
    (directory / "config.json").write_text(json.dumps(case.config.to_dict(), indent=1) + "\n")
    save_file({k: np.ascontiguousarray(v, np.float64) for k, v in case.params.items()}, str(directory / "weights.safetensors"))
    np.save(directory / "x.npy", case.x)
    mask = case.padding_mask if case.padding_mask is not None else np.ones(case.x.shape[:2], dtype=bool)
    np.save(directory / "padding_mask.npy", mask)
    for name, a in case.kind.request_arrays(case).items():  # a grad example's cotangent, z1_bar.npy
        np.save(directory / f"{name}.npy", a)
    save_file({k: np.ascontiguousarray(v, np.float64) for k, v in case.quantities().items()}, str(directory / "expected.safetensors"))
    save_file({k: np.ascontiguousarray(np.asarray(v, np.float32) if v.dtype.itemsize < 4 else v, np.float64)
               for k, v in finding.outputs.items()}, str(directory / "got.safetensors"))
    bad = next((q for q in finding.result.quantities if q.quantity == finding.quantity), None)
    meta = {"format": FORMAT, "backend": backend, "dtype": dtype, "kind": d.kind.name, "decoded": case.decoded,
            "has_padding_mask": case.padding_mask is not None, "shape": list(case.x.shape),
            "heads": case.config.num_heads, "head_dim": case.config.head_dim, "padding": describe_padding(d),
            "input": describe_input(d), "quantity": finding.quantity, "message": finding.result.message,
            "error": bad.error if bad else None, "tolerance": bad.tolerance if bad else None,
            "localisation": finding.localisation, "stage": finding.stage,
            "command": replay_command(named, backend, dtype, model)}
    (directory / "case.json").write_text(json.dumps(meta, indent=1) + "\n")


def _array(directory: Path, name: str) -> np.ndarray:
    """The array in directory/name, read without unpickling; ValueError naming the file if it is no
    .npy file (a pickle, text), an array of objects, or one cut short (empty, truncated)."""
    with open(directory / name, "rb") as f:
        head = f.read(len(NPY_MAGIC))
        if head != NPY_MAGIC:
            raise ValueError(f"--replay: {name}: expected a .npy array; the file " + ("is empty" if not head else
                             "has no .npy header (a pickle or another kind of file); refused: replay reads data only"))
        f.seek(0)
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except ValueError as err:
            if "pickle" in str(err) or "Object arrays" in str(err):  # an object array: a pickle, never loaded
                raise ValueError(f"--replay: {name} holds a pickle (an array of Python objects); refused: replay "
                                 "reads data only") from None
            raise ValueError(f"--replay: {name}: a damaged .npy file ({err})") from None
        except EOFError:  # a header and no data
            raise ValueError(f"--replay: {name}: a damaged .npy file (it ends before its data)") from None


def _json(directory: Path, name: str):
    """The value in the JSON file directory/name; ValueError naming it if it is not UTF-8 JSON or
    nests deeper than the parser's recursion limit."""
    try:
        return json.loads((directory / name).read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"--replay: {name}: not valid JSON (nested too deep to parse)") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"--replay: {name}: not valid JSON ({err})") from None


def _weights(directory: Path) -> dict:
    """weights.safetensors' arrays; ValueError naming it if safetensors cannot read it (empty,
    truncated, a pickle or another kind of file: safetensors reads its header only, never code)."""
    from safetensors import SafetensorError

    try:
        return load_file(str(directory / "weights.safetensors"))
    except SafetensorError as err:
        raise ValueError(f"--replay: weights.safetensors: not a readable safetensors file ({err})") from None


def load_repro(directory: Path, dtype: str = ""):
    """(the spec's case for the folder's inputs, case.json's dict), the case's half fields measured
    for dtype (default: case.json's); ValueError naming the file and
    what was wrong (a missing file, a pickle, a shape or dtype that does not fit)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--replay: expected a folder written by odeattn conformance fuzz; got {str(directory)!r}")
    missing = [n for n in REQUIRED if not (directory / n).is_file()]
    if missing:
        raise ValueError(f"--replay: {str(directory)!r} is missing {', '.join(missing)}")
    meta = _json(directory, "case.json")
    if not isinstance(meta, dict):
        raise ValueError(f"--replay: case.json: expected a JSON object; got {meta!r}")
    kind = kind_of(meta.get("kind"), "--replay: case.json: kind", FUZZED_KINDS)
    try:
        config = kind.config_type.from_any(_json(directory, "config.json"))  # an encoder example's: ODEEncoderConfig
    except (ValueError, TypeError) as err:
        raise ValueError(str(err) if str(err).startswith("--replay") else f"--replay: config.json: {err}") from None
    x, mask = _array(directory, "x.npy"), _array(directory, "padding_mask.npy")
    if x.dtype != np.float64 or x.ndim != 3 or x.shape[2] != config.hidden_size:
        raise ValueError(f"--replay: x.npy: expected float64 (batch, seq, {config.hidden_size}); got {x.dtype} {x.shape}")
    if mask.dtype != np.bool_ or mask.shape != x.shape[:2]:
        raise ValueError(f"--replay: padding_mask.npy: expected bool {x.shape[:2]}; got {mask.dtype} {mask.shape}")
    params = _weights(directory)
    want = kind.param_shapes(config)
    if set(params) != set(want) or any(tuple(params[k].shape) != tuple(s) for k, s in want.items()):
        raise ValueError(f"--replay: weights.safetensors: expected the parameters {sorted(want)} of config.json's shapes")
    inputs = {}
    for name in kind.inputs:  # a grad example's cotangent of z(1)
        if not (directory / f"{name}.npy").is_file():
            raise ValueError(f"--replay: {str(directory)!r} is missing {name}.npy (an input of a {kind} example)")
        inputs[name] = _array(directory, f"{name}.npy")
        if inputs[name].dtype != np.float64 or inputs[name].shape != x.shape:
            raise ValueError(f"--replay: {name}.npy: expected float64 {x.shape}; got {inputs[name].dtype} {inputs[name].shape}")
    decoded = meta.get("decoded", 0)
    low = kind.min_decoded  # a decode example decodes at least one token after its prompt
    if isinstance(decoded, bool) or not isinstance(decoded, int) or not low <= decoded < max(x.shape[1], 1):
        raise ValueError(f"--replay: case.json: expected decoded an integer in [{low}, {x.shape[1] - 1}] (tokens "
                         f"after the prompt, of seq {x.shape[1]}); got {decoded!r}")
    case = case_of(config, {k: np.asarray(v, np.float64) for k, v in params.items()}, x,
                   mask if meta.get("has_padding_mask", True) else None, kind=kind, decoded=decoded,
                   name="fuzz_replay", dtype=dtype or meta.get("dtype", "float32"), inputs=inputs)
    return case, meta

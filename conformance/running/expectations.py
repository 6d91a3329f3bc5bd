"""A port's expectations file: what it is known to fail (xfail) or must not run (skip), checked in
beside the port and read by the main run, the fuzzer and the pytest plugin alike.

    {"odeattn_expectations": 1,
     "expectations": [
       {"backend": "mylib", "dtype": "float32", "case": "_rope", "mode": "xfail",
        "reason": "RoPE lands in 0.3", "link": "https://example.org/mylib/issues/12"},
       {"backend": "mylib", "config": {"positional_encoding": ["hope", "pape"]}, "mode": "skip",
        "reason": "not implemented; runs out of memory"}]}

An entry matches a (backend, dtype, case) when each selector it has matches: `backend` and `dtype`
(a name, a list of names, or "*"; absent: any), `case` (a regex searched in the golden case's
name), `kind` (block, decode, grad or encoder) and `config` (field -> a value or a list of
values, compared with the case's config; positional_encoding is the encoding in effect, "none"
when ode_use_pe is off). An entry with a `case` selects golden cases only;
one without selects drawn fuzz examples too: a fuzz region. `skip` wins over `xfail`: a skipped
case is not run at all. An xfail is strict: a case it matches that passes fails the run.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..adapters.support import settings_of
from ..cases.kinds import KINDS
import ode_ref as R
from ode_ref.precision import DTYPES

VERSION = 1
MODES = ("xfail", "skip")
FIELDS = {"backend", "dtype", "case", "kind", "config", "mode", "reason", "link"}


@dataclass(frozen=True)
class Expectation:
    index: int  # its place in its file, for the report's words
    mode: str
    reason: str
    backend: tuple = ()  # () matches any
    dtype: tuple = ()
    case: Optional[re.Pattern] = None
    kind: tuple = ()
    config: tuple = ()  # ((field, (value, ...)), ...)
    link: str = ""
    source: str = ""  # its file

    @property
    def label(self) -> str:
        """How the report names it: its file and place, and its reason (and link)."""
        return f"{self.source}: expectations[{self.index}] ({self.reason}{'; ' + self.link if self.link else ''})"

    def matches(self, backend: str, dtype: str, *, case: Optional[str] = None, kind=None,
                config=None) -> bool:
        """Whether it selects this result; case None: a drawn fuzz example, which no `case` selects."""
        if self.backend and backend not in self.backend or self.dtype and dtype not in self.dtype:
            return False
        if self.case is not None and (case is None or not self.case.search(case)):
            return False
        if self.kind and str(kind) not in self.kind:  # a case kind (cases/kinds.py) or its name
            return False
        values = settings_of(config) if config is not None else {}
        return all(field in values and values[field] in allowed for field, allowed in self.config)


class Expectations:
    """The entries of one or more files; skip() and xfail() answer for one result, and used()
    remembers which entries selected anything, so a run can name those that selected nothing."""

    def __init__(self, entries=()):
        self.entries = list(entries)
        self.hits = [0] * len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def _first(self, mode: str, backend: str, dtype: str, **what) -> Optional[Expectation]:
        for i, e in enumerate(self.entries):
            if e.mode == mode and e.matches(backend, dtype, **what):
                self.hits[i] += 1
                return e
        return None

    def skip(self, backend: str, dtype: str, **what) -> Optional[Expectation]:
        return self._first("skip", backend, dtype, **what)

    def xfail(self, backend: str, dtype: str, **what) -> Optional[Expectation]:
        return self._first("xfail", backend, dtype, **what)

    def unused(self, backends, partial: bool = False) -> list[str]:
        """A line per entry that selected nothing among the run's backends (those naming none of
        them are another port's), or that names a backend near one of them (a typo); partial: the
        run held part of the cases (a shard), where an entry's cases may be in another part."""
        out = []
        for e, hits in zip(self.entries, self.hits):
            typo = [(b, near[0]) for b in e.backend if b not in backends
                    for near in [difflib.get_close_matches(b, sorted(backends), n=1)] if near]
            if typo:
                out.append(f"{e.label}: names the backend {typo[0][0]!r}, which no backend of this run reports; "
                           f"did you mean {typo[0][1]!r}?")
            elif not hits and not partial and (not e.backend or set(e.backend) & set(backends)):
                out.append(f"{e.label}: selected nothing in this run")
        return out


def apply(result, expectation: Optional[Expectation]):
    """A result under its xfail expectation: a failure becomes xfailed, a pass xpassed (a failure)."""
    if expectation is None:
        return result
    if result.status in ("failed", "error"):
        result.status = "xfailed"
        result.message = f"{result.message} (expected: {expectation.label})"
    elif result.status == "passed":
        result.status = "xpassed"
        result.message = f"unexpected pass: {expectation.label} expects it to fail"
    return result


def _names(where: str, value, allowed=None) -> tuple:
    """A selector's names: a string, a list of strings, or "*" (any: ())."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise ValueError(f"{where}: expected a name, a list of names or \"*\"; got {value!r}")
    if "*" in items:
        return ()
    bad = [v for v in items if allowed is not None and v not in allowed]
    if bad:
        raise ValueError(f"{where}: expected one of {', '.join(allowed)} or \"*\"; got {bad[0]!r}")
    return tuple(items)


def _config_fields() -> dict:
    """field -> its Python type, over the block's and the encoder's configs."""

    types = {"int": int, "float": float, "bool": bool, "str": str}
    out = {}
    for cls in (R.ODEConfig, R.ODEEncoderConfig):
        for f in dataclasses.fields(cls):
            name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            out.setdefault(f.name, types.get(name.split(" ")[0].split("|")[0].strip()))
    return out


def _fits(value, kind) -> bool:
    if kind is None:
        return isinstance(value, (str, int, float, bool)) or value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _config(where: str, value) -> tuple:
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where}: expected an object of config fields, each a value or a list of values; got {value!r}")
    fields = _config_fields()
    out = []
    for field, allowed in value.items():
        if field not in fields:
            near = difflib.get_close_matches(field, sorted(fields), n=1)
            raise ValueError(f"{where}.{field}: expected a field of the block's or the encoder's config; got {field!r}"
                             + (f"; did you mean {near[0]!r}?" if near else ""))
        values = allowed if isinstance(allowed, list) else [allowed]
        wrong = next((v for v in values if not _fits(v, fields[field])), None) if values else "an empty list"
        if wrong is not None:
            kind = fields[field].__name__ if fields[field] else "a JSON scalar"
            raise ValueError(f"{where}.{field}: expected a {kind} or a list of them; got {wrong!r}")
        out.append((field, tuple(values)))
    return tuple(out)


def _entry(where: str, index: int, raw) -> Expectation:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with mode and reason; got {raw!r}")
    extra = sorted(set(raw) - FIELDS)
    if extra:
        near = difflib.get_close_matches(extra[0], sorted(FIELDS), n=1)
        raise ValueError(f"{where}: expected the fields {', '.join(sorted(FIELDS))}; got the unknown {extra[0]!r}"
                         + (f"; did you mean {near[0]!r}?" if near else ""))
    if raw.get("mode") not in MODES:
        raise ValueError(f"{where}.mode: expected one of {', '.join(MODES)}; got {raw.get('mode')!r}")
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"{where}.reason: expected a non-empty string (why, for the report); got {reason!r}")
    link = raw.get("link", "")
    if not isinstance(link, str):
        raise ValueError(f"{where}.link: expected a string; got {link!r}")
    case = raw.get("case")
    if case is not None:
        if not isinstance(case, str) or not case:
            raise ValueError(f"{where}.case: expected a regular expression; got {case!r}")
        try:
            case = re.compile(case)
        except re.error as err:
            raise ValueError(f"{where}.case: invalid regular expression {raw['case']!r} ({err})") from None
    return Expectation(index, raw["mode"], reason.strip(), _names(f"{where}.backend", raw.get("backend", "*")),
                       _names(f"{where}.dtype", raw.get("dtype", "*"), DTYPES), case,
                       _names(f"{where}.kind", raw.get("kind", "*"), KINDS),
                       _config(f"{where}.config", raw["config"]) if "config" in raw else (), link)


def parse(data, where: str) -> list[Expectation]:
    """The entries of a parsed file, or ValueError naming `where` (the file) and the field."""
    if not isinstance(data, dict) or set(data) != {"odeattn_expectations", "expectations"}:
        raise ValueError(f"{where}: expected {{\"odeattn_expectations\": {VERSION}, \"expectations\": [...]}}; got "
                         f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    if data["odeattn_expectations"] != VERSION or isinstance(data["odeattn_expectations"], bool):
        raise ValueError(f"{where}: odeattn_expectations: expected the format version {VERSION}; "
                         f"got {data['odeattn_expectations']!r}")
    if not isinstance(data["expectations"], list):
        raise ValueError(f"{where}: expectations: expected a list; got {type(data['expectations']).__name__}")
    return [dataclasses.replace(_entry(f"{where}: expectations[{i}]", i, raw), source=where)
            for i, raw in enumerate(data["expectations"])]


def read_json(path) -> tuple[bytes, object]:
    """(the file's bytes, its JSON parsed), or ValueError naming the file: unreadable, or not JSON
    (a nesting too deep for the parser included)."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        return data, json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None


def load(paths) -> Expectations:
    """The entries of each file in paths (JSON), or ValueError naming the file and the field."""
    return Expectations([e for path in paths for e in parse(read_json(path)[1], str(path))])

"""What a backend declares it runs, known before any case is built: a Python adapter's optional
`support` attribute, or an external worker's `supports` in its hello reply (protocol version 2):

    {"config": {FIELD: [VALUE, ...], ...}}

FIELD is a field of ode_ref.ODEConfig, or head_dim. A config whose FIELD holds a value outside its
list is not supported, without asking the backend (worker.unsupported); positional_encoding is
compared as the encoding in effect ("none" when ode_use_pe is off). A field left out: any value.
The fuzzer draws only within the declaration (fuzzing/draw.py), so a narrow port's budget is spent
on examples it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import ode_ref as R

FIELDS = (*(f.name for f in dataclasses.fields(R.ODEConfig)), "head_dim")
SCALARS = (str, int, float, bool)


def check_support(declared, where: str) -> dict:
    """field -> tuple of the values declared ({} for None), or ValueError naming `where` and the fault."""
    if declared is None:
        return {}
    config = declared.get("config", {}) if isinstance(declared, dict) else None
    if not isinstance(config, dict) or set(declared) - {"config"}:
        raise ValueError(f"{where}: expected {{\"config\": {{FIELD: [VALUE, ...]}}}}; got {declared!r}")
    out = {}
    for field, values in config.items():
        if field not in FIELDS:
            raise ValueError(f"{where}: config: expected fields of ode_ref.ODEConfig or head_dim; got {field!r}")
        if not isinstance(values, (list, tuple)) or not values or not all(isinstance(v, SCALARS) for v in values):
            raise ValueError(f"{where}: config.{field}: expected a non-empty list of values; got {values!r}")
        out[field] = tuple(values)
    return out


def support_of(adapter) -> dict:
    """An adapter's declared support (its `support` attribute, or an external worker's) as field
    -> values; {} where it declares none. ValueError for a malformed declaration."""
    return check_support(getattr(adapter, "support", None), "its declared support")


def value_of(config, field: str):
    """config's value of a field as support, expectations and triage compare it: positional_encoding
    as the encoding in effect ('none' with ode_use_pe off), where the config has one (the block's)."""
    if field == "positional_encoding" and hasattr(config, "position_encoding"):
        return config.position_encoding
    return getattr(config, field)


def settings_of(config) -> dict:
    """A config's fields, each as value_of reads it."""
    return {field: value_of(config, field) for field in config.to_dict()}


def outside(support: dict, config) -> Optional[str]:
    """Why config lies outside a declared support ('not supported: FIELD VALUE (declared: ...)'),
    or None."""
    for field, values in support.items():
        value = value_of(config, field)
        if value not in values:
            return f"not supported: {field} {value} (declared: {', '.join(map(str, values))})"
    return None

"""A case's run request as the worker reads it (worker.py), encoded once, and the largest reply it allows.

One function builds the request of every path that sends a case to a worker: the run (runner.py),
the triage's stage request (triage.py), the fuzzer and the plugin through a RemoteAdapter
(client.py). The case's kind (cases/kinds.py) adds its own fields and arrays: a decode case's
prompt, a grad case's z1_bar.
"""

from __future__ import annotations

from ..cases import Case
from ..cases.half import cast
from ..wire.frames import encode

MESSAGE_LIMIT = 1 << 20  # bytes a reply's message may add to its arrays (a traceback)


def inputs(params: dict, x, padding_mask) -> dict:
    """The arrays every run request carries: x, the padding mask if any, and param/<name>."""
    arrays = {"x": x, **{f"param/{k}": v for k, v in params.items()}}
    if padding_mask is not None:
        arrays["padding_mask"] = padding_mask
    return arrays


def stages_frame(config, params: dict, x, padding_mask, dtype: str, name: str = "stages") -> bytes:
    """The request for the backend's run_stages (f(0, x)'s stage values) on these inputs."""
    return encode({"op": "stages", "case": name, "dtype": dtype, "config": config.to_dict()},
                  inputs(params, x, padding_mask))


def request_frame(case: Case, dtype: str, stages: bool = False) -> bytes:
    """The run request for a case in a dtype, its inputs cast to dtype: the same bytes for every
    backend. stages: the request for f(0, x)'s stage values instead (triage.py), its inputs alone."""
    params = {k: cast(v, dtype) for k, v in case.params.items()}
    if stages:
        return stages_frame(case.config, params, cast(case.x, dtype), case.padding_mask, dtype, case.name)
    arrays = inputs(params, cast(case.x, dtype), case.padding_mask)
    arrays.update({k: cast(v, dtype) for k, v in case.kind.request_arrays(case).items()})
    return encode({"op": "run", "case": case.name, "kind": case.kind.name, "dtype": dtype, "config": case.config.to_dict(),
                   **case.kind.request_fields(case)}, arrays)


def reply_limit(case: Case) -> int:
    """The most bytes a correct reply for case can take: its kind's numbers (kinds.Kind.reply_values)
    in float64, twice over, plus MESSAGE_LIMIT. A larger announced reply is refused."""
    return 2 * 8 * case.kind.reply_values(case) + MESSAGE_LIMIT

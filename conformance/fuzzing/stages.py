"""The stage of f that diverges, for a fuzz finding: the adapter's optional run_stages asked and
its answer judged against the spec's stages (cases/stages.py, which says what the stages are).
"""

from __future__ import annotations

from typing import Optional

from ode_ref.precision import HALF_DTYPES

from ..cases.half import cast
from ..cases.stages import judge_stages, stages_failed
from ..running.client import BackendFault


def first_divergent_stage(adapter, case, dtype: str) -> Optional[dict]:
    """{"stage", "error", "tolerance", "localisation", "agree"} for the first stage of f(0, x) over
    its tolerance ("stage" None when every stage the adapter returned agrees), or None in a half
    dtype (the stages' half errors are not measured) or when run_stages raised."""
    if dtype in HALF_DTYPES:
        return None
    try:
        params = {k: cast(v, dtype) for k, v in case.params.items()}
        got = adapter.run_stages(case.config, params, cast(case.x, dtype), case.padding_mask, dtype)
    except BackendFault as err:  # in its worker: the error it raised there, or the worker lost
        return stages_failed(f"run_stages failed: {err}")
    except Exception as err:
        return stages_failed(f"run_stages raised {type(err).__name__}: {err}")
    return judge_stages(case, got, dtype)

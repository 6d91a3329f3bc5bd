"""The stages of f: the spec's stage values of f(0, x), and a backend's judged against them.

The optional adapter method run_stages,

    run_stages(config, params, x, padding_mask, dtype) -> {stage: array}

returns the first evaluation's intermediate values, f(0, x), under the spec's stage names (any
subset, in dtype):

    norm         the normed state h                                  (batch, seq, d_model)
    q, k, v      after preprocess_qkv (the rotation, where there is one)  (batch, seq, heads, head_dim)
    attn         the attention output, after postprocess_attn         (batch, seq, heads, head_dim)
    output_proj  the output projection: f(0, x) itself                (batch, seq, d_model)

A port whose SelfAttention mixes in ode_ref.attention.Stages (the spec, torch, JAX and Flax) gets
it from ode_ref.recording: a subclass of its attention that keeps each stage's first value. The ONNX
export records its own attention the same way as it builds the graph (export.block.stage_outputs:
the outputs stage_<name>), which the ONNX backends and every exec: runtime run; a native exec:
port answers the run kind "stages" (adapters/external.py). Each stage is judged as a quantity is
(tolerance.py), its e32 measured here on the spec, and the first one over its tolerance is named
and localised (localise.py), down to the heads for q, k, v and attn: by the fuzzer
(fuzzing/stages.py) and by a run's triage (running/triage.py).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import ode_ref as R
from ode_ref.recording import STAGES, recording

from .localise import localise
from .tolerance import quantity_tolerance, relative_error

DESCRIBED = {"norm": "the norm, h", "q": "q after preprocess_qkv", "k": "k after preprocess_qkv",
             "v": "v after preprocess_qkv", "attn": "the attention output", "output_proj": "the output projection"}


def spec_stages(config, params, x, padding_mask, base: type = R.SelfAttention) -> dict:
    """The spec's stage values of f(0, x) (base: a variant of the spec's SelfAttention)."""
    attention = recording(base)(config)
    R.ode_func(params, 0.0, x, config, padding_mask, attention=attention)
    return dict(type(attention).store)


def stages_failed(why: str) -> dict:
    """The judgement (judge_stages's form) when the stages could not be had: why, in "failed"."""
    return {"stage": None, "error": 0.0, "tolerance": 0.0, "localisation": {}, "agree": [], "failed": why}


def judge_stages(case, got: dict, dtype: str) -> dict:
    """{"stage", "error", "tolerance", "localisation", "agree"} for the stage values a backend
    returned (stage -> array): the first stage over its tolerance, "stage" None when every stage
    returned agrees (those in "agree"); stages_failed's for values that are no such dict."""
    if not isinstance(got, dict):
        return stages_failed(f"run_stages: expected a dict of stage -> array; got {type(got).__name__}")
    want = spec_stages(case.config, case.params, case.x, case.padding_mask)
    want32 = spec_stages(case.config, {k: v.astype(np.float32) for k, v in case.params.items()},
                         case.x.astype(np.float32), case.padding_mask)
    agree = []
    for stage in STAGES:
        if stage not in got:
            continue
        try:  # a port's garbage (a string, a ragged list, another shape) is said so, not raised
            value = np.asarray(got[stage], np.float64)
        except (TypeError, ValueError):
            return stages_failed(f"run_stages: stage {stage}: expected an array of numbers; got {type(got[stage]).__name__}")
        if value.shape != want[stage].shape:
            return stages_failed(f"run_stages: stage {stage}: expected shape {want[stage].shape}; got {value.shape}")
        tol = quantity_tolerance(dtype, relative_error(want32[stage], want[stage]))  # e32 measured here; no half error
        err = relative_error(value, want[stage])
        if not err <= tol:
            where = localise(stage, np.asarray(got[stage]), want[stage], tol, heads=case.config.num_heads)
            return {"stage": stage, "error": err, "tolerance": tol, "localisation": where, "agree": agree}
        agree.append(stage)
    return {"stage": None, "error": 0.0, "tolerance": 0.0, "localisation": {}, "agree": agree}


def format_stage(stage: Optional[dict]) -> str:
    """One line for a report."""
    if stage is None:
        return ""
    if stage.get("failed"):
        return stage["failed"]
    if stage["stage"] is None:
        return f"every stage of f(0, x) returned agrees ({', '.join(stage['agree']) or 'none returned'})"
    before = f" ({', '.join(stage['agree'])} agree)" if stage["agree"] else ""
    return (f"first divergent stage of f(0, x): {stage['stage']}, {DESCRIBED[stage['stage']]}{before}: relative error "
            f"{stage['error']:.2e} > tolerance {stage['tolerance']:.2e}; {stage['localisation']['summary']}")

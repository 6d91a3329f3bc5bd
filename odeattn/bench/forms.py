"""The export's three forms side by side: local functions (functions=True), inlined (the default)
and the Loop form (steps_input=True), on the bench's small and large shapes.

For each form: the file's size and the session's creation time at each count of FORM_STEPS (the
Loop form's file is one file for every count; the others are exported once per count), and the
time of a forward at `steps`, the three forms timed in the same interleaved rounds (timing.interleave)
so that their ratios, paired per round, hold on a machine whose speed drifts.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import ode_ref as R

from .paths import SHAPES
from .timing import Timed, interleave, round_medians, spread

FORMS = ("functions", "inlined", "loop")
FORM_STEPS = (1, 4, 16, 64)


def form_model(form: str, config, params):
    """The block exported in `form`, without a padding_mask input (as the bench's ort paths)."""
    from odeattn.export.block import export_model

    return export_model(config, params, padding_mask=False, steps_input=form == "loop", functions=form == "functions")


def _created(model, threads: int) -> tuple[float, object]:
    """(seconds to create the session, the session)."""
    from odeattn.export.runtime import session

    start = time.perf_counter()
    sess = session(model, threads=threads)
    return time.perf_counter() - start, sess


def form_costs(shape: str, *, solver: str, threads: int, rounds: int = 1) -> list[dict]:
    """Size and session creation per form and step count (the Loop form: one file, created per count
    too, so that its creation is seen not to grow). The sessions of one count are created in turn,
    `rounds` times: session_s is the median, vs_functions the creation time over the local-function
    form's, paired per round (median, min, max)."""
    _, _, d_model, heads = SHAPES[shape]
    rows = []
    for steps in FORM_STEPS:
        cfg = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps)
        params = R.init_params(cfg, seed=0)
        models = {form: form_model(form, cfg, params) for form in FORMS}
        times = {form: [] for form in FORMS}
        for _ in range(rounds):
            for form, model in models.items():
                times[form].append(_created(model, threads)[0])
        for form, model in models.items():
            rows.append({"shape": shape, "form": form, "steps": steps, "bytes": len(model.SerializeToString()),
                         "session_s": statistics.median(times[form]),
                         "vs_functions": spread([t / b for t, b in zip(times[form], times["functions"])])})
    return rows


def form_forwards(shape: str, *, solver: str, steps: int, threads: int, repeats: int, burst_s: float) -> dict:
    """form -> the forward's time at `steps` (median over rounds) and its ratio to the default
    form's, paired per round; the Loop form is fed steps."""
    batch, seq, d_model, heads = SHAPES[shape]
    cfg = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps)
    params = R.init_params(cfg, seed=0)
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model)).astype(np.float32)
    entries = []
    for form in FORMS:
        _, sess = _created(form_model(form, cfg, params), threads)
        feed = {"x": x, **({"steps": np.array(steps, np.int64)} if form == "loop" else {})}
        def fn(s=sess, f=feed):
            return s.run(["z"], f)
        fn()
        start = time.perf_counter()
        fn()
        entries.append(Timed(form, fn, 0.0, time.perf_counter() - start))
    interleave(entries, repeats, burst_s)
    base = round_medians(entries[0])
    return {e.name: {"median_s": statistics.median(round_medians(e)),
                     "vs_functions": spread([t / b for t, b in zip(round_medians(e), base)])} for e in entries}

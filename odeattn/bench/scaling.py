"""The scaling lines: how time, export and compile cost grow with the steps and the sequence.

All at one shape (the small one, or the first of --shape): PyTorch eager's forward against
ode_steps and against seq, the ONNX export's time and size against ode_steps (local functions and
inlined, the default), and JAX's compile time against ode_steps.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import ode_ref as R

from .paths import SHAPES, setup_torch
from .timing import measure

SCALING = {"steps": (1, 2, 4, 8), "seq": (64, 128, 256, 512), "export_steps": (1, 4, 16, 64),
           "compile_steps": (1, 4, 16, 64), "compile_repeats": 3}  # the scaling lines' points; compiles timed per point


def _torch_lines(out, base, params, x, threads, warmup, repeats) -> None:
    batch, _, d_model = x.shape
    for steps in SCALING["steps"]:
        fn, _ = setup_torch("torch-eager", R.ODEConfig(**base, ode_steps=steps), params, x, threads)
        out["time_vs_steps"].append({"steps": steps, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})
    for s in SCALING["seq"]:
        xs = np.random.default_rng(0).normal(size=(batch, s, d_model))
        fn, _ = setup_torch("torch-eager", R.ODEConfig(**base, ode_steps=4), params, xs, threads)
        out["time_vs_seq"].append({"seq": s, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})


def _export_lines(out, base, params) -> None:
    from odeattn.export.block import export_model
    from odeattn.export.deploy import inline

    for steps in SCALING["export_steps"]:
        cfg = R.ODEConfig(**base, ode_steps=steps)
        start = time.perf_counter()
        model = export_model(cfg, params, functions=True)  # bytes: the local functions; inlined_bytes: the default
        data = model.SerializeToString()
        out["export_vs_steps"].append({"steps": steps, "export_s": time.perf_counter() - start, "bytes": len(data),
                                       "inlined_bytes": len(inline(model).SerializeToString())})


def _jax_compile_lines(out, base, params, x, repeats) -> None:
    import jax

    from odeattn.backends.jax import ode_block

    ps = {k: v.astype(np.float32) for k, v in params.items()}
    xj = x.astype(np.float32)
    # the config static, as under a jit of the caller's own: ode_block_jit takes the steps as data and
    # compiles one program for every count, so its line would be flat by construction
    static = jax.jit(ode_block, static_argnames="config")

    def compile_once(cfg):
        jax.clear_caches()  # else a config compiled earlier in this run is a cache hit
        static.lower(ps, xj, config=cfg).compile()

    compile_once(R.ODEConfig(**base, ode_steps=2))  # first-use costs of the compiler, not of a config
    for steps in SCALING["compile_steps"]:
        cfg = R.ODEConfig(**base, ode_steps=steps)
        times = measure(lambda: compile_once(cfg), warmup=0, repeats=max(SCALING["compile_repeats"], repeats))
        out["jax_compile_vs_steps"].append({"steps": steps, "compile_s": statistics.median(times)})


def shape_text(sc: dict) -> str:
    """The shape of a scaling result, as its tables and plot name it: 'small (B1 T128 D256 H8)'."""
    label, (b, t, d, h) = sc.get("shape", "small"), sc.get("dims", SHAPES["small"])
    return f"{label} (B{b} T{t} D{d} H{h})"


def bench_scaling(threads: int, warmup: int, repeats: int, log, label: str = "small", shape=None) -> dict:
    """Time against steps and against seq (PyTorch eager), export time and size against steps,
    JAX compile time against steps (at the points of SCALING); all at shape (batch, seq, d_model,
    heads; default the small one), named label."""
    batch, seq, d_model, heads = shape or SHAPES["small"]
    out = {"shape": label, "dims": [batch, seq, d_model, heads],
           "time_vs_steps": [], "time_vs_seq": [], "export_vs_steps": [], "jax_compile_vs_steps": []}
    base = dict(hidden_size=d_model, num_heads=heads, ode_solver="rk4")
    params = R.init_params(R.ODEConfig(**base), seed=0)
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    try:
        _torch_lines(out, base, params, x, threads, warmup, repeats)
    except ImportError as err:
        log(f"  scaling with torch: skipped ({err})")
    try:
        _export_lines(out, base, params)
    except ImportError as err:
        log(f"  export scaling: skipped ({err})")
    try:
        _jax_compile_lines(out, base, params, x, repeats)
    except ImportError as err:
        log(f"  jax compile scaling: skipped ({err})")
    return out

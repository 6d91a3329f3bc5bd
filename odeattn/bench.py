"""`odeattn bench`: every execution path of the block timed in one run, against this machine's
own float32 matmul peak, measured in the same run.

Method. Each path is warmed up (compilation, caches), then timed `repeats` times; the table shows
the median and the spread (min .. max). Times are wall-clock seconds of one block forward.
FLOPs count the matrix products only (elementwise work is O(B T D + B H T^2), under 2% here):

    per evaluation of f:  qkv 6 B T D^2  +  scores 2 B T^2 D  +  a @ v 2 B T^2 D  +  out 2 B T D^2
                        = 8 B T D^2 + 4 B T^2 D
    per block forward:    stages(solver) * ode_steps evaluations

GFLOP/s = FLOPs / median time; "% peak" divides by the float32 matmul peak: the best median
GFLOP/s of a square float32 matmul (NumPy's BLAS and torch.mm, n = 2048) in this run. Ratios
to PyTorch eager come from the same run, so machine noise cancels to first order. The ONNX
Runtime rows also give the model's size and its max relative error against the spec in float64
on the timed batch: ort-int8 is the opset 17 export with its projections dynamically quantised to
int8 (`odeattn export --quantize int8`), lossy, so beside the float rows rather than conformant.

`odeattn bench --decode`: the next token's z at a context of n tokens, two ways, per runtime
(torch, jax, ort): a cached decode step (the cache holds the n - 1 tokens before it) against
recomputing the block on all n tokens. The two ways of one runtime are interleaved in short
bursts (one call to wake the runtime's threads, then `burst` timed calls, alternating) so that
the machine's drift hits both alike; the ratio of their medians is the speed-up.

`odeattn bench --memory`: peak activation memory and time of one forward+backward against
ode_steps (1 to 32), with and without activation checkpointing, torch and JAX (odeattn/memory.py
defines the peak for each runtime).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import ode_ref as R
from odeattn.cli import check_output_path, non_negative_int, positive_int

SHAPES = {  # name -> (batch, seq, d_model, heads)
    "small": (1, 128, 256, 8),
    "large": (8, 512, 512, 8),
}
PATHS = ("spec-f64", "spec-f32", "torch-eager", "torch-compile", "jax-jit", "ort-opset17", "ort-opset23", "ort-int8")


def flops(batch: int, seq: int, d_model: int, config: R.ODEConfig) -> float:
    per_eval = 8 * batch * seq * d_model**2 + 4 * batch * seq**2 * d_model
    return float(per_eval * R.TABLEAUS[config.ode_solver].num_stages * config.ode_steps)


def measure(fn, *, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def matmul_peak(threads: int, repeats: int) -> dict:
    """Median GFLOP/s of an n = 2048 float32 matmul in NumPy and in torch (if installed)."""
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    out = {"numpy": 2 * n**3 / statistics.median(measure(lambda: a @ a, warmup=1, repeats=repeats)) / 1e9}
    try:
        import torch

        torch.set_num_threads(threads)
        t = torch.from_numpy(a)
        out["torch"] = 2 * n**3 / statistics.median(measure(lambda: torch.mm(t, t), warmup=1, repeats=repeats)) / 1e9
    except ImportError:
        pass
    return out


def _onnx_model(path: str, config, params):
    """The model an ort path runs: the block exported at opset 17 or 23, or (ort-int8) the opset 17
    export with its projections dynamically quantised to int8 (odeattn export --quantize int8)."""
    from odeattn.export.block import export_model

    if path == "ort-int8":
        from odeattn.export.deploy import quantize_int8

        return quantize_int8(export_model(config, params, padding_mask=False))
    return export_model(config, params, opset=int(path[-2:]), padding_mask=False)


def _setup(path: str, config, params, x, threads: int, model=None):
    """A zero-argument callable running one forward on `path`, or raises ImportError; an ort path
    runs `model` (default: _onnx_model's)."""
    if path in ("spec-f64", "spec-f32"):
        xs = x.astype(np.float64 if path == "spec-f64" else np.float32)
        ps = {k: v.astype(xs.dtype) for k, v in params.items()}
        return lambda: R.ode_block(ps, xs, config)
    if path.startswith("torch"):
        import torch

        from odeattn.backends.torch import ODEAttentionBlock

        torch.set_num_threads(threads)
        block = ODEAttentionBlock.from_params(config, params)
        fn = torch.compile(block, fullgraph=True) if path == "torch-compile" else block
        xt = torch.from_numpy(x.astype(np.float32))

        def run():
            with torch.no_grad():
                return fn(xt)

        return run
    if path == "jax-jit":
        import jax

        from odeattn.backends.jax import ode_block_jit as f

        ps = {k: v.astype(np.float32) for k, v in params.items()}
        xj = jax.numpy.asarray(x.astype(np.float32))
        return lambda: f(ps, xj, config).block_until_ready()
    if path.startswith("ort"):
        from odeattn.export.runtime import session

        sess = session(model or _onnx_model(path, config, params), threads=threads)
        feed = {"x": x.astype(np.float32)}
        return lambda: sess.run(None, feed)
    raise ValueError(f"--paths: unknown path {path!r}; expected some of {', '.join(PATHS)}")


def bench_shape(name, shape, paths, *, solver, steps, warmup, repeats, threads, peak, log) -> list[dict]:
    batch, seq, d_model, heads = shape
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps)
    params = R.init_params(config, seed=0)
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    total = flops(batch, seq, d_model, config)
    rows, want = [], None
    for path in paths:
        try:
            model = _onnx_model(path, config, params) if path.startswith("ort") else None
            fn = _setup(path, config, params, x, threads, model)
        except ImportError as err:
            log(f"  {path}: skipped ({err})")
            continue
        start = time.perf_counter()
        out = fn()  # first call: compilation for the compiled paths, counted apart from the timing
        first = time.perf_counter() - start
        times = measure(fn, warmup=warmup, repeats=repeats)
        med = statistics.median(times)
        rows.append({"shape": name, "path": path, "median_s": med, "min_s": min(times), "max_s": max(times),
                     "first_call_s": first, "gflop": total / 1e9, "gflops": total / med / 1e9,
                     "peak_fraction": total / med / 1e9 / peak, "file_bytes": None, "max_rel_error": None})
        if model is not None:  # the file, and its error against the spec in float64 on this x
            from odeattn.conformance.tolerance import relative_error

            want = R.ode_block(params, x, config) if want is None else want
            rows[-1].update(file_bytes=len(model.SerializeToString()), max_rel_error=relative_error(out[0], want))
        log(f"  {name} {path:<14} median {med * 1e3:9.2f} ms")
    eager = next((r["median_s"] for r in rows if r["path"] == "torch-eager"), None)
    for r in rows:
        r["speedup_vs_torch_eager"] = eager / r["median_s"] if eager else None
    return rows


def scaling(threads: int, warmup: int, repeats: int, log) -> dict:
    """Time against steps and against seq (PyTorch eager), export time and size against steps,
    JAX compile time against steps; all on the small shape."""
    batch, seq, d_model, heads = SHAPES["small"]
    out = {"time_vs_steps": [], "time_vs_seq": [], "export_vs_steps": [], "jax_compile_vs_steps": []}
    base = dict(hidden_size=d_model, num_heads=heads, ode_solver="rk4")
    params = R.init_params(R.ODEConfig(**base), seed=0)
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    try:
        for steps in (1, 2, 4, 8):
            fn = _setup("torch-eager", R.ODEConfig(**base, ode_steps=steps), params, x, threads)
            out["time_vs_steps"].append({"steps": steps, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})
        for s in (64, 128, 256, 512):
            xs = np.random.default_rng(0).normal(size=(batch, s, d_model))
            fn = _setup("torch-eager", R.ODEConfig(**base, ode_steps=4), params, xs, threads)
            out["time_vs_seq"].append({"seq": s, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})
    except ImportError as err:
        log(f"  scaling with torch: skipped ({err})")
    try:
        from odeattn.export.block import export_model

        from odeattn.export.deploy import inline

        for steps in (1, 4, 16, 64):
            cfg = R.ODEConfig(**base, ode_steps=steps)
            start = time.perf_counter()
            model = export_model(cfg, params)
            data = model.SerializeToString()
            out["export_vs_steps"].append({"steps": steps, "export_s": time.perf_counter() - start, "bytes": len(data),
                                           "inlined_bytes": len(inline(model).SerializeToString())})
    except ImportError as err:
        log(f"  export scaling: skipped ({err})")
    try:
        import jax

        from odeattn.backends.jax import ode_block_jit

        ps = {k: v.astype(np.float32) for k, v in params.items()}
        xj = x.astype(np.float32)
        def compile_once(cfg):
            jax.clear_caches()  # else a config compiled earlier in this run is a cache hit
            ode_block_jit.lower(ps, xj, cfg).compile()

        compile_once(R.ODEConfig(**base, ode_steps=2))  # first-use costs of the compiler, not of a config
        for steps in (1, 4, 16, 64):
            cfg = R.ODEConfig(**base, ode_steps=steps)
            times = measure(lambda: compile_once(cfg), warmup=0, repeats=max(3, repeats))
            out["jax_compile_vs_steps"].append({"steps": steps, "compile_s": statistics.median(times)})
    except ImportError as err:
        log(f"  jax compile scaling: skipped ({err})")
    return out


DECODE_RUNTIMES = ("torch", "jax", "ort")
DECODE_CONTEXTS = (128, 512, 2048)
DECODE_SHAPE = (1, 256, 8)  # batch, d_model, heads


def _decode_paths(runtime: str, config, params, x, threads: int):
    """(cached step, recompute), zero-argument callables on `runtime` for context n = x.shape[1]:
    the step decodes token n - 1 from a cache of the n - 1 before it (the same step, replayed:
    the cache is immutable); the recompute runs the block on all n tokens."""
    n = x.shape[1]
    x32 = x.astype(np.float32)
    ps = {k: v.astype(np.float32) for k, v in params.items()}
    if runtime == "torch":
        import torch

        from odeattn.backends.torch import ODEAttentionBlock

        torch.set_num_threads(threads)
        block, xt = ODEAttentionBlock.from_params(config, params), torch.from_numpy(x32)
        with torch.no_grad():
            _, cache = block.prefill(xt[:, :-1], max_len=n)

        def step():
            with torch.no_grad():
                return block.decode_step(xt[:, -1:], cache)

        def full():
            with torch.no_grad():
                return block(xt)

        return step, full
    if runtime == "jax":
        from odeattn.backends import jax as J

        _, cache = J.prefill(ps, x32[:, :-1], config, max_len=n)
        x_t = J.block.jnp.asarray(x32[:, -1:])
        return (lambda: J.decode_step(ps, x_t, cache, config)[0].block_until_ready(),
                lambda: J.ode_block_jit(ps, x32, config).block_until_ready())
    if runtime == "ort":
        from odeattn.export.block import decode_names, export_decode_model, export_model
        from odeattn.export.runtime import session

        _, cache = R.prefill(ps, x32[:, :-1], config, max_len=n)  # the spec's cache, float32
        past, _ = decode_names(config)
        feed = {"x_t": x32[:, -1:], "index": np.array(n - 1), **dict(zip(past, [*cache.k, *cache.v, cache.padding_mask]))}
        dec = session(export_decode_model(config, params), threads=threads)
        blk = session(export_model(config, params, padding_mask=False), threads=threads)
        return (lambda: dec.run(["z"], feed)), (lambda: blk.run(["z"], {"x": x32}))
    raise ValueError(f"--decode-runtimes: unknown {runtime!r}; expected some of {', '.join(DECODE_RUNTIMES)}")


def bench_decode(contexts, runtimes, *, solver: str, steps: int, repeats: int, threads: int, log) -> list[dict]:
    """One row per (context, runtime): cached and recompute medians, tokens/s, speed-up, cache size."""
    batch, d_model, heads = DECODE_SHAPE
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps, mode="decoder",
                         ode_use_pe=True, positional_encoding="rope")
    params = R.init_params(config, seed=0)
    rows = []
    for n in contexts:
        x = np.random.default_rng(n).normal(size=(batch, n, d_model))
        for runtime in runtimes:
            try:
                step, full = _decode_paths(runtime, config, params, x, threads)
            except ImportError as err:
                log(f"  {runtime}: skipped ({err})")
                continue
            step(), full()  # compile and warm both
            times = {"cached": [], "recompute": []}
            burst = {"cached": 5, "recompute": 1}  # a burst of each lasts about as long
            for _ in range(repeats):
                for mode, fn in (("cached", step), ("recompute", full)):
                    fn()  # wake this path's threads
                    times[mode] += measure(fn, warmup=0, repeats=burst[mode])
            cached, recompute = statistics.median(times["cached"]), statistics.median(times["recompute"])
            rows.append({"context": n, "runtime": runtime, "cached_s": cached, "recompute_s": recompute,
                         "cached_tokens_per_s": batch / cached, "recompute_tokens_per_s": batch / recompute,
                         "speedup": recompute / cached,
                         "cache_mb": R.cache.cache_values(config, batch, n) * 4 / 1e6})
            log(f"  context {n} {runtime:<6} cached {cached * 1e3:8.2f} ms, recompute {recompute * 1e3:9.2f} ms")
    return rows


def format_decode(result: dict) -> str:
    b, d, h = DECODE_SHAPE
    lines = [f"cached decoding vs recomputing the prefix: batch {b}, d_model {d}, {h} heads, {result['solver']} x "
             f"{result['steps']} steps, RoPE, float32, threads {result['threads']}",
             f"{'context':>7}  {'runtime':<8}{'cached ms':>10}{'tokens/s':>10}{'recompute ms':>14}{'tokens/s':>10}"
             f"{'speed-up':>10}{'cache MB':>10}"]
    for r in result["decode"]:
        lines.append(f"{r['context']:>7}  {r['runtime']:<8}{r['cached_s'] * 1e3:>10.2f}{r['cached_tokens_per_s']:>10.1f}"
                     f"{r['recompute_s'] * 1e3:>14.2f}{r['recompute_tokens_per_s']:>10.2f}{r['speedup']:>9.1f}x"
                     f"{r['cache_mb']:>10.1f}")
    return "\n".join(lines)


def format_tables(result: dict) -> str:
    lines = [f"float32 matmul peak (n = 2048): " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in result["peak"].items()),
             f"threads: {result['threads']}", ""]
    w = max([6] + [len(r["shape"]) for r in result["paths"]]) + 2
    lines.append(f"{'shape':<{w}}{'path':<15}{'median ms':>11}{'min..max ms':>19}{'GFLOP':>9}{'GFLOP/s':>9}{'% peak':>8}"
                 f"{'vs eager':>9}{'file kB':>10}{'max err':>10}")
    for r in result["paths"]:
        vs = f"{r['speedup_vs_torch_eager']:.2f}x" if r["speedup_vs_torch_eager"] else "-"
        size = f"{r['file_bytes'] / 1e3:.1f}" if r.get("file_bytes") else "-"
        err = f"{r['max_rel_error']:.2e}" if r.get("max_rel_error") is not None else "-"
        lines.append(f"{r['shape']:<{w}}{r['path']:<15}{r['median_s'] * 1e3:>11.2f}"
                     f"{r['min_s'] * 1e3:>9.1f}..{r['max_s'] * 1e3:<8.1f}{r['gflop']:>9.3g}{r['gflops']:>9.1f}"
                     f"{100 * r['peak_fraction']:>7.1f}%{vs:>9}{size:>10}{err:>10}")
    sc = result.get("scaling") or {}
    if sc.get("time_vs_steps"):
        lines += ["", "time vs steps (torch eager, small shape): " + ", ".join(
            f"{e['steps']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_steps"])]
    if sc.get("time_vs_seq"):
        lines += ["time vs seq (torch eager, 4 rk4 steps):    " + ", ".join(
            f"{e['seq']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_seq"])]
    if sc.get("export_vs_steps"):
        lines += ["ONNX export vs steps:                      " + ", ".join(
            f"{e['steps']}: {e['export_s'] * 1e3:.0f} ms / {e['bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"])]
        lines += ["ONNX --inline file vs steps:               " + ", ".join(
            f"{e['steps']}: {e['inlined_bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"])]
    if sc.get("jax_compile_vs_steps"):
        lines += ["JAX compile vs steps:                      " + ", ".join(
            f"{e['steps']}: {e['compile_s'] * 1e3:.0f} ms" for e in sc["jax_compile_vs_steps"])]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    from odeattn.cli import pyplot

    plt = pyplot()

    sc = result["scaling"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [
        (axes[0, 0], "time_vs_steps", "steps", "median_s", "forward time (s) vs steps, torch eager"),
        (axes[0, 1], "time_vs_seq", "seq", "median_s", "forward time (s) vs seq, torch eager"),
        (axes[1, 0], "export_vs_steps", "steps", "bytes", "ONNX file size (bytes) vs steps"),
        (axes[1, 1], "jax_compile_vs_steps", "steps", "compile_s", "JAX compile time (s) vs steps"),
    ]
    for ax, key, xk, yk, title in panels:
        data = sc.get(key) or []
        if data:
            ax.plot([e[xk] for e in data], [e[yk] for e in data], marker="o")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)  # from zero: a flat line must look flat
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xk)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_shape(text: str) -> tuple:
    """(batch, seq, d_model, heads); ValueError naming --shape unless four positive integers with
    d_model a multiple of heads."""
    try:
        batch, seq, d_model, heads = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--shape: expected batch,seq,d_model,heads (four integers); got {text!r}") from None
    if min(batch, seq, d_model, heads) < 1 or d_model % heads:
        raise ValueError(f"--shape: expected four positive integers with d_model a multiple of heads; got {text!r}")
    return batch, seq, d_model, heads


def cmd_bench(args) -> int:
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = args.threads or os.cpu_count() or 1
    paths = args.paths.split(",") if args.paths else list(PATHS)
    bad = [p for p in paths if p not in PATHS]
    try:
        if bad:
            raise ValueError(f"--paths: unknown {bad}; expected some of {', '.join(PATHS)}")
        if args.plot and args.no_scaling:
            raise ValueError("--plot: the plot shows the scaling tables, which --no-scaling skips; drop one of them")
        check_output_path("--json", args.json, ".json")
        check_output_path("--plot", args.plot, ".png")
        shapes = {"x".join(map(str, parse_shape(s))): parse_shape(s) for s in args.shape} if args.shape else SHAPES
    except ValueError as err:
        print(f"odeattn bench: {err}", file=sys.stderr)
        return 2
    if args.decode and args.memory:
        print("odeattn bench: --memory: measures training, --decode decoding; drop one of them", file=sys.stderr)
        return 2
    if args.decode:
        return _cmd_decode(args, threads, log)
    if args.memory:
        return _cmd_memory(args, threads, log)
    log(f"measuring the float32 matmul peak ({threads} threads)...")
    peak = matmul_peak(threads, max(3, args.repeats))
    result = {"threads": threads, "peak": peak, "solver": args.solver, "steps": args.steps, "paths": [],
              "flop_formula": "stages * steps * (8 B T D^2 + 4 B T^2 D)"}
    for name, shape in shapes.items():
        log(f"shape {name} {shape} (batch, seq, d_model, heads):")
        result["paths"] += bench_shape(name, shape, paths, solver=args.solver, steps=args.steps, warmup=args.warmup,
                                       repeats=args.repeats, threads=threads, peak=max(peak.values()), log=log)
    result["scaling"] = None if args.no_scaling else scaling(threads, args.warmup, args.repeats, log)
    print(format_tables(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot and result["scaling"]:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _cmd_decode(args, threads: int, log) -> int:
    try:
        contexts = [int(c) if c.strip().isdigit() and int(c) >= 2 else -1 for c in args.contexts.split(",")]
        if -1 in contexts:
            raise ValueError(f"--contexts: expected comma-separated integers >= 2; got {args.contexts!r}")
        runtimes = args.decode_runtimes.split(",")
        bad = [r for r in runtimes if r not in DECODE_RUNTIMES]
        if bad:
            raise ValueError(f"--decode-runtimes: unknown {bad}; expected some of {', '.join(DECODE_RUNTIMES)}")
        if args.plot:
            raise ValueError("--plot: the decode table has no plot; drop --plot")
    except ValueError as err:
        print(f"odeattn bench: {err}", file=sys.stderr)
        return 2
    result = {"threads": threads, "solver": args.solver, "steps": args.steps, "shape": DECODE_SHAPE,
              "decode": bench_decode(contexts, runtimes, solver=args.solver, steps=args.steps, repeats=args.repeats,
                                     threads=threads, log=log)}
    print(format_decode(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def _comma_list(option: str, text: str, allowed=None, *, positive_ints: bool = False) -> list:
    """The comma-separated values of an option; ValueError naming it unless each is allowed (or,
    with positive_ints, an integer >= 1)."""
    items = [v.strip() for v in text.split(",")]
    if positive_ints:
        if not all(v.isdigit() and int(v) >= 1 for v in items):
            raise ValueError(f"{option}: expected comma-separated integers >= 1; got {text!r}")
        return [int(v) for v in items]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise ValueError(f"{option}: unknown {bad}; expected some of {', '.join(allowed)}")
    return items


def _cmd_memory(args, threads: int, log) -> int:
    from odeattn import memory as M

    try:
        steps = _comma_list("--memory-steps", args.memory_steps, positive_ints=True)
        runtimes = _comma_list("--memory-runtimes", args.memory_runtimes, M.MEMORY_RUNTIMES)
        if len(args.shape) > 1:
            raise ValueError(f"--shape: --memory takes one shape; got {len(args.shape)}")
        shape = parse_shape(args.shape[0]) if args.shape else M.MEMORY_SHAPE
        if args.plot:
            from odeattn.cli import require

            require("matplotlib")  # a missing extra is named before the work starts
    except ValueError as err:
        print(f"odeattn bench: {err}", file=sys.stderr)
        return 2
    rows = M.bench_memory(shape, steps, runtimes, solver=args.solver, repeats=args.repeats, threads=threads, log=log)
    result = {"threads": threads, "solver": args.solver, "shape": shape, "memory": rows, "ratios": M.ratios(rows),
              "target_ratio": M.TARGET_RATIO}
    print(M.format_memory(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot:
        M.plot_memory(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="time every execution path against this machine's matmul peak",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], metavar="B,T,D,H",
                   help="benchmark this shape instead of small and large (repeatable)")
    p.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--solver", default="rk4", choices=list(R.SOLVERS))
    p.add_argument("--steps", type=positive_int, default=4)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=non_negative_int, default=0, help="default (0): every core")
    p.add_argument("--no-scaling", action="store_true", help="skip the scaling tables")
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="PNG of the scaling tables")
    p.add_argument("--decode", action="store_true",
                   help="instead: cached decoding against recomputing the prefix (see below)")
    p.add_argument("--contexts", default=",".join(map(str, DECODE_CONTEXTS)), help="with --decode: context lengths")
    p.add_argument("--decode-runtimes", default=",".join(DECODE_RUNTIMES), help="with --decode: some of torch,jax,ort")
    p.add_argument("--memory", action="store_true",
                   help="instead: training memory and time against steps, with and without checkpointing (see below)")
    p.add_argument("--memory-steps", default="1,2,4,8,16,32", help="with --memory: the ode_steps values")
    p.add_argument("--memory-runtimes", default="torch,jax", help="with --memory: some of torch,jax")
    p.set_defaults(func=cmd_bench)


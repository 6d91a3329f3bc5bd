"""A full run of the main table: memory probes, then per shape every path and the peak's kernels
timed in interleaved rounds, then long context, scaling and the targets, into one result dict
(what `bench --json` writes and format_tables prints).
"""

from __future__ import annotations

import statistics
import time

import ode_ref as R
from ode_ref.cache import evaluations as cached_evaluations
from odeattn.backends.cpu import cpu_info

from .memory import long_context_table, memory_table
from .paths import LONG_SHAPE, PATH_SPECS, SHAPES, TORCH_PLAIN, Skip, flops, path_inputs, to_numpy
from .peak import PEAK_LIBS, ort_projections, peak_kernels, product_kernels
from .scaling import bench_scaling
from .targets import check_targets
from .timing import BURST_S, Timed, first_and_warm, interleave, round_medians, spread

PEAK_SIZES = (256, 512, 1024, 2048)  # square float32 matmuls of the peak, beside the block's projection
DEFAULT_REPEATS = 5  # rounds of the main table; timed calls (or bursts) of --decode, --memory and the scaling lines
QUICK = {"shapes": {"small": SHAPES["small"]}, "repeats": 3, "burst_s": 0.05, "peak_sizes": (256, 512, 1024),
         "long_shape": (1, 2048, 256, 8)}
FLOP_FORMULA = "evaluations * (8 B T D^2 + 4 B T^2 D)"  # evaluations of f: stages * steps for a tableau


def _set_up_paths(label, shape, names, *, solver, steps, warmup, threads, log) -> tuple[list[Timed], list[dict]]:
    """Every path set up and first-called: (the Timed of those that run, a row for every path with
    its setup and first-call times, file size and max error against the spec in float64)."""
    from odeattn.conformance.cases.tolerance import relative_error

    batch, seq, d_model, _ = shape
    entries, rows, reference = [], [], {}
    for name in names:
        config, params, x = path_inputs(shape, name, solver, steps)
        row = {"shape": label, "path": name, "use_bitnet": config.use_bitnet}
        try:
            start = time.perf_counter()
            fn, model = PATH_SPECS[name].setup(name, config, params, x, threads)
            setup = time.perf_counter() - start
            out, first, last = first_and_warm(fn, warmup)
        except (ImportError, Skip) as err:
            log(f"  {label} {name}: skipped ({err})")
            rows.append({**row, "skipped": str(err)})
            continue
        if config.use_bitnet not in reference:  # the spec in float64 on this input, once per config
            reference[config.use_bitnet] = to_numpy(out) if name == "spec-f64" else R.ode_block(params, x, config)
        row.update(setup_s=setup, first_call_s=first, file_bytes=len(model.SerializeToString()) if model is not None else None,
                   max_rel_error=relative_error(to_numpy(out), reference[config.use_bitnet]))
        del out
        rows.append(row)
        entries.append(Timed(name, fn, flops(batch, seq, d_model, config), last))
        log(f"  {label} {name:<15} setup {setup:6.2f} s, first call {first:7.2f} s, then {last * 1e3:9.2f} ms")
    return entries, rows


def _kernels(shape, *, solver, steps, peak_sizes, threads, projections: bool, log):
    """(the peak's matmuls, {library: the products alone}, {form: ONNX Runtime's projections alone},
    the flop of one forward) at shape, as Timed; the projections only when asked."""
    batch, seq, d_model, heads = shape
    projection = (batch * seq, d_model, 3 * d_model)
    matmuls = [Timed(f"{lib} {m}x{k}x{n}", fn, 2.0 * m * k * n, 0.0)
               for lib, (m, k, n), fn in peak_kernels([(s, s, s) for s in peak_sizes] + [projection], threads, log)]
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps)
    evaluations, forward = cached_evaluations(config), flops(batch, seq, d_model, config)
    products = {lib: Timed(f"products {lib}", fn, forward, 0.0) for lib, fn in product_kernels(shape, evaluations, threads, log)}
    alone = {}
    if projections:
        try:
            alone = {form: Timed(f"projections {form}", ort_projections(shape, evaluations, threads, integer=form == "int"),
                                 8.0 * batch * seq * d_model**2 * evaluations, 0.0) for form in ("float", "int")}
        except ImportError as err:
            log(f"  projections: skipped ({err})")
    return matmuls, products, alone, forward


def _round_best(matmuls: list[Timed], libs) -> list[tuple[float, str]]:
    """Per round, the best GFLOP/s of the matmuls of libs, and the library whose matmul reached it."""
    per_kernel = [[(k.flop / t / 1e9, k.name.rsplit(" ", 1)[0]) for t in round_medians(k)]
                  for k in matmuls if k.name.rsplit(" ", 1)[0] in libs]
    return [max(col) for col in zip(*per_kernel)] if per_kernel else []


def _limit(best: list[tuple[float, str]]) -> dict | None:
    """The limit, the median of the rounds' peaks, and the library that reached a round's peak in
    most rounds (the first of PEAK_LIBS' order on a tie), with how many."""
    if not best:
        return None
    libs = [lib for _, lib in best]
    lib = max(PEAK_LIBS, key=libs.count)
    return {"gflops": statistics.median(g for g, _ in best), "library": lib, "rounds": libs.count(lib), "of": len(libs)}


def _fill_rows(rows, entries: list[Timed], peak, xla, products, burst_s: float) -> None:
    """Each timed row's times, GFLOP/s, and its ratios paired per round (% peak, % of the products
    alone in the fastest library of that round, vs plain)."""
    timed = {e.name: e for e in entries}
    alone = [min(col) for col in zip(*(round_medians(k) for k in products.values()))]
    plain = round_medians(timed[TORCH_PLAIN]) if TORCH_PLAIN in timed else None
    for row in rows:
        e = timed.get(row["path"])
        if e is None:
            continue
        med = round_medians(e)
        gflops = [e.flop / t / 1e9 for t in med]
        row.update(round_s=med, median_s=statistics.median(med), min_s=min(min(t) for t in e.rounds),
                   burst=e.burst(burst_s), gflop=e.flop / 1e9, gflops=e.flop / statistics.median(med) / 1e9,
                   peak_fraction=statistics.median(g / p for g, p in zip(gflops, peak)) if peak else None,
                   xla_fraction=statistics.median(g / p for g, p in zip(gflops, xla)) if xla else None,
                   products_fraction=statistics.median(a / t for a, t in zip(alone, med)) if alone else None,
                   vs_plain=spread([p / t for p, t in zip(plain, med)]) if plain and not row["use_bitnet"] else None)


def bench_shape(label, shape, names, *, solver, steps, warmup, repeats, burst_s, peak_sizes, threads, log) -> dict:
    """The main table's rows of one shape, and its peak: every path set up and first-called, then
    the paths and the peak's matmuls timed in interleaved rounds."""
    entries, rows = _set_up_paths(label, shape, names, solver=solver, steps=steps, warmup=warmup, threads=threads, log=log)
    matmuls, products, projections, forward = _kernels(
        shape, solver=solver, steps=steps, peak_sizes=peak_sizes, threads=threads, log=log,
        projections=any(e.name == "ort-bitnet-int" for e in entries))
    kernels = matmuls + list(products.values()) + list(projections.values())
    for kernel in kernels:
        kernel.call_s = first_and_warm(kernel.fn, max(warmup, 1))[2]
    log(f"  {label}: {repeats} rounds of {len(entries)} paths and {len(kernels)} matmuls and products...")
    interleave(entries + kernels, repeats, burst_s)
    best = _round_best(matmuls, PEAK_LIBS)
    peak, xla = [g for g, _ in best], [g for g, _ in _round_best(matmuls, ("xla dot",))]
    _fill_rows(rows, entries, peak, xla, products, burst_s)
    kernel_rows = [{"library": k.name.rsplit(" ", 1)[0], "size": k.name.rsplit(" ", 1)[1],
                    "gflops": statistics.median(k.flop / t / 1e9 for t in round_medians(k))} for k in matmuls]
    return {"rows": rows, "peak": {"shape": label, "kernels": kernel_rows, "limit": _limit(best), "round_gflops": peak,
                                   "xla_round_gflops": xla,
                                   "products_round_s": {lib: round_medians(k) for lib, k in products.items()}, "flop": forward,
                                   "ort_projections_round_s": {form: round_medians(k) for form, k in projections.items()}}}


def run_bench(shapes: dict, names, *, solver: str, steps: int, warmup: int, threads: int, quick: bool = False,
              repeats: int | None = None, long_context: bool = False, scaling: bool = True, log) -> dict:
    """The main table's full result for shapes {label: (batch, seq, d_model, heads)} and the paths
    `names` (in PATHS' order): peak memory of each in a fresh process, then each shape's rounds,
    then (if asked) long context, the scaling lines (not with quick) and the targets. quick: fewer
    rounds, shorter bursts and smaller peak matmuls (QUICK); repeats overrides the rounds."""
    repeats = repeats or (QUICK["repeats"] if quick else DEFAULT_REPEATS)
    burst_s = QUICK["burst_s"] if quick else BURST_S
    peak_sizes = QUICK["peak_sizes"] if quick else PEAK_SIZES
    result = {"machine": cpu_info(), "threads": threads, "solver": solver, "steps": steps, "quick": quick, "repeats": repeats,
              "burst_s": burst_s, "paths": [], "peaks": [], "flop_formula": FLOP_FORMULA}
    log(f"peak memory, one fresh process per path and shape ({min(2, threads)} at a time)...")
    memory = memory_table([(n, label, shape) for label, shape in shapes.items() for n in names], solver,
                          steps, threads, log, parallel=min(2, threads))
    for label, shape in shapes.items():
        log(f"shape {label} {shape} (batch, seq, d_model, heads):")
        got = bench_shape(label, shape, names, solver=solver, steps=steps, warmup=warmup,
                          repeats=repeats, burst_s=burst_s, peak_sizes=peak_sizes, threads=threads, log=log)
        for row in got["rows"]:
            row["memory"] = memory.get((row["path"], label))
        result["paths"] += got["rows"]
        result["peaks"].append(got["peak"])
    result["long_context"] = long_context_table(names, QUICK["long_shape"] if quick else LONG_SHAPE, solver,
                                                steps, threads, log) if long_context else None
    first = next(iter(shapes))  # the scaling lines run at the first shape of the table
    result["scaling"] = bench_scaling(threads, warmup, repeats, log, first, shapes[first]) if scaling and not quick else None
    result["targets"] = check_targets(result)
    return result

"""The bench's text tables: the main table with its peak and targets, --decode's, and --memory's.

Formatting only: each takes the result dict its run wrote (the same dict --json saves) and returns
the text printed.
"""

from __future__ import annotations

import statistics

from .compile import compile_lines
from .decode import DECODE_SHAPE
from .memory import TARGET_RATIO
from .peak import PEAK_LIBS
from .scaling import shape_text
from .timing import spread


def machine_text(machine: dict | None) -> str:
    """'AuthenticAMD, AMD EPYC ..., AVX-512 (avx512_vnni)': what the run's CPU said of itself."""
    m = machine or {}
    features = f" ({', '.join(m['features'])})" if m.get("features") else ""
    return ", ".join(m.get(k) or f"{k} unknown" for k in ("vendor", "model", "isa")) + features


def _mb(value) -> str:
    return f"{value / 1e6:.1f}" if value is not None else "-"


def _peak_lines(peak: dict) -> list[str]:
    """One shape's matmul GFLOP/s table, its peak per round, and the products alone."""
    sizes = list(dict.fromkeys(k["size"] for k in peak["kernels"]))
    libs = list(dict.fromkeys(k["library"] for k in peak["kernels"]))
    got = {(k["library"], k["size"]): k["gflops"] for k in peak["kernels"]}
    lines = [f"float32 matmul GFLOP/s, shape {peak['shape']} (median over rounds; m x k x n):",
             f"{'':<12}" + "".join(f"{s:>16}" for s in sizes)]
    for lib in libs:
        lines.append(f"{lib:<12}" + "".join(f"{got[lib, s]:>16.1f}" for s in sizes))
    if peak.get("limit"):
        lim = peak["limit"]
        lines.append(f"the limit: {lim['gflops']:.1f} GFLOP/s (the median of each round's best), reached by "
                     f"{lim['library']} in {lim['rounds']} of {lim['of']} rounds")
    for what, key in (("peak (best of " + ", ".join(PEAK_LIBS) + ")", "round_gflops"), ("XLA's own", "xla_round_gflops")):
        if peak[key]:
            s = spread(peak[key])
            lines.append(f"{what} per round: median {s['median']:.1f}, min {s['min']:.1f}, max {s['max']:.1f} GFLOP/s")
    products = peak.get("products_round_s") or {}
    if products:
        lines.append("the block's products alone (one forward's: evaluations x qkv, scores, a @ v, out), median ms "
                     "and GFLOP/s: " + ", ".join(f"{lib} {statistics.median(t) * 1e3:.2f} ms {peak['flop'] / statistics.median(t) / 1e9:.1f}"
                                             for lib, t in products.items()))
    projections = peak.get("ort_projections_round_s") or {}
    if projections:
        lines.append("ONNX Runtime's two projections alone (one forward's), median ms: " + ", ".join(
            f"{form} {statistics.median(t) * 1e3:.2f}" for form, t in projections.items()))
    return lines + [""]


def _path_lines(paths: list[dict]) -> list[str]:
    """The main table: one line per (shape, path), then its legend and any failed memory probe."""
    w = max([6] + [len(r["shape"]) for r in paths]) + 2
    lines = [f"{'shape':<{w}}{'path':<16}{'median ms':>11}{'min ms':>10}{'setup+first s':>14}{'GFLOP/s':>9}{'% peak':>8}{'% prod':>8}"
             f"{'vs plain (min..max)':>22}{'peak MB':>9}{'live MB':>9}{'file kB':>9}{'max err':>10}"]
    for r in paths:
        mem = r.get("memory") or {}
        peak_mb = _mb(mem.get("peak_rss_bytes")) if "error" not in mem else "failed"
        if "skipped" in r:
            lines.append(f"{r['shape']:<{w}}{r['path']:<16}skipped: {r['skipped']}")
            continue
        vs = r.get("vs_plain")
        vs = f"{vs['median']:.2f}x ({vs['min']:.2f}..{vs['max']:.2f})" if vs else "-"
        pf, pp = (f"{100 * r[k]:.1f}%" if r.get(k) is not None else "-" for k in ("peak_fraction", "products_fraction"))
        size = f"{r['file_bytes'] / 1e3:.1f}" if r.get("file_bytes") else "-"
        lines.append(f"{r['shape']:<{w}}{r['path']:<16}{r['median_s'] * 1e3:>11.2f}{r['min_s'] * 1e3:>10.2f}"
                     f"{r['setup_s'] + r['first_call_s']:>14.2f}{r['gflops']:>9.1f}{pf:>8}{pp:>8}{vs:>22}{peak_mb:>9}"
                     f"{_mb(mem.get('live_tensor_bytes')):>9}{size:>9}{r['max_rel_error']:>10.2e}")
    lines.append("% prod: the share of the block's products alone in that round's fastest library; "
                 "vs plain: torch-plain's time / the path's (same config; the bitnet rows run use_bitnet); "
                 "peak MB: RSS high-water increase in a fresh process; live MB: torch tensor storages")
    failed = [f"{r['shape']} {r['path']}: {r['memory']['error']}" for r in paths if "error" in (r.get("memory") or {})]
    return lines + [f"memory failed: {f}" for f in failed]


def _long_context_lines(long: dict | None) -> list[str]:
    if not long:
        return []
    lines = ["", "long context: B{} T{} D{} H{}, one fresh process per path (peak MB as above; forward s: the "
             "fastest of the {} forward(s) after the first)".format(*long["shape"], long["calls"]),
             f"{'path':<16}{'peak MB':>10}{'live MB':>10}{'setup+first s':>15}{'forward s':>11}"]
    for name, m in long["rows"].items():
        if "skipped" in m or "error" in m:
            lines.append(f"{name:<16}{'skipped: ' + m['skipped'] if 'skipped' in m else 'failed: ' + m['error']}")
            continue
        fwd = f"{m['call_s']:.2f}" if m.get("call_s") is not None else "-"
        lines.append(f"{name:<16}{_mb(m['peak_rss_bytes']):>10}{_mb(m.get('live_tensor_bytes')):>10}"
                     f"{m['setup_and_first_call_s']:>15.2f}{fwd:>11}")
    return lines


def _scaling_lines(sc: dict | None) -> list[str]:
    sc, lines = sc or {}, []
    if sc:
        lines += ["", f"scaling lines, at the shape {shape_text(sc)}:"]
    if sc.get("time_vs_steps"):
        lines += ["time vs steps (torch eager):               " + ", ".join(
            f"{e['steps']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_steps"])]
    if sc.get("time_vs_seq"):
        lines += ["time vs seq (torch eager, 4 rk4 steps):    " + ", ".join(
            f"{e['seq']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_seq"])]
    if sc.get("export_vs_steps"):
        lines += ["ONNX export vs steps (--functions file):   " + ", ".join(
            f"{e['steps']}: {e['export_s'] * 1e3:.0f} ms / {e['bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"])]
        lines += ["ONNX default (inlined) file vs steps:      " + ", ".join(
            f"{e['steps']}: {e['inlined_bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"])]
    if sc.get("jax_compile_vs_steps"):
        lines += ["JAX compile vs steps:                      " + ", ".join(
            f"{e['steps']}: {e['compile_s'] * 1e3:.0f} ms" for e in sc["jax_compile_vs_steps"])]
    return lines


def _target_lines(targets: list[dict]) -> list[str]:
    lines = ["", "targets (ratios from this run):"]
    for t in targets:
        met = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        lines.append(f"  {t['target']:<58}{t['value']:<35} {met}" + (f"; {t['note']}" if t["note"] else ""))
    return lines


def format_tables(result: dict) -> str:
    """The main table's text: per shape the peak, then every path, long context, scaling, targets."""
    lines = ["machine: " + machine_text(result.get("machine")),
             f"threads {result['threads']}; {result['solver']} x {result['steps']} steps, float32 unless f64; "
             f"{result['repeats']} interleaved rounds, bursts of about {result['burst_s']} s; ratios paired per round", ""]
    for peak in result["peaks"]:
        lines += _peak_lines(peak)
    lines += _path_lines(result["paths"])
    lines += _long_context_lines(result.get("long_context"))
    lines += _scaling_lines(result.get("scaling"))
    lines += _target_lines(result["targets"])
    return "\n".join(lines)


def format_compile(result: dict) -> str:
    """The --compile table: the JAX block's first call against its warm call, and its targets."""
    return "\n".join(compile_lines(result["compile"]) + _target_lines(result["targets"]))


def format_decode(result: dict) -> str:
    """The --decode table: per context and runtime, cached against recompute."""
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


def format_memory(result: dict) -> str:
    """The --memory table: per runtime and steps, peak and time without and with checkpointing."""
    b, t, d, h = result["shape"]
    lines = [f"training memory vs steps: forward+backward of sum(z(1)), batch {b}, seq {t}, d_model {d}, {h} heads, "
             f"{result['solver']}, float32, threads {result['threads']}",
             "peak: torch, live tensor bytes created by forward+backward; jax, the compiled program's temp bytes",
             f"{'runtime':<8}{'steps':>6}{'peak MB':>12}{'ckpt MB':>12}{'ms':>11}{'ckpt ms':>11}{'time x':>8}"]
    by = {(r["runtime"], r["steps"], r["checkpoint"]): r for r in result["memory"]}
    for (runtime, steps, checkpoint), plain in by.items():
        if checkpoint:
            continue
        ck = by[runtime, steps, True]
        lines.append(f"{runtime:<8}{steps:>6}{plain['peak_bytes'] / 1e6:>12.3f}{ck['peak_bytes'] / 1e6:>12.3f}"
                     f"{plain['median_s'] * 1e3:>11.2f}{ck['median_s'] * 1e3:>11.2f}{ck['median_s'] / plain['median_s']:>7.2f}x")
    for r in result["ratios"]:
        verdict = "" if r["meets_target"] is None else \
            f"  target <= {TARGET_RATIO}x: {'met' if r['meets_target'] else 'MISSED'}"
        lines.append(f"{r['runtime']:<6} {'with' if r['checkpoint'] else 'without'} checkpointing: peak "
                     f"{r['to_steps']} steps / {r['from_steps']} step{'s' if r['from_steps'] > 1 else ''} = "
                     f"{r['peak_ratio']:.2f}x{verdict}")
    return "\n".join(lines)

"""The performance targets, each judged from ratios measured in the same run.

Each target gives its value, met (True, False, or None where this run did not measure it) and a
note with what the products alone allow, so a missed target tells how far it is from this
machine's libraries.
"""

from __future__ import annotations

import statistics

from .paths import TORCH_PLAIN
from .peak import PRODUCT_LIBS
from .timing import paired_ratio


def _target(target: str, value: str, met, note: str = "") -> dict:
    return {"target": target, "value": value, "met": met, "note": note}


def _ratio_text(r) -> str:
    return f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})" if r else "not measured"


def _products_fraction(peaks: dict, shape: str, libs) -> float | None:
    """The block's products alone, at the fastest of libs in each round, as a fraction of that
    round's peak (median over rounds); None where not timed."""
    p = peaks.get(shape, {})
    times = [p.get("products_round_s", {}).get(lib) for lib in libs]
    times = [t for t in times if t]
    if not times or not p.get("round_gflops"):
        return None
    return statistics.median(p["flop"] / min(col) / 1e9 / g for *col, g in zip(*times, p["round_gflops"]))


def _eager_vs_plain(rows, path: dict, peaks: dict) -> dict:
    r = paired_ratio(rows, "small", TORCH_PLAIN, "torch-eager")
    plain, torch_products = path.get(("small", TORCH_PLAIN)), peaks.get("small", {}).get("products_round_s", {}).get("torch")
    note = ""
    if plain and torch_products:
        alone = statistics.median(p / t for p, t in zip(plain["round_s"], torch_products))
        note = f"torch-plain takes {alone:.2f}x its products alone in torch (the same kernels eager runs)"
    return _target("torch-eager >= 1.25x torch-plain (small)", _ratio_text(r), r["median"] >= 1.25 if r else None, note)


def _fastest(rows, peaks: dict, shape: str) -> dict:
    timed = [x for x in rows if x["shape"] == shape and x.get("peak_fraction") is not None]
    best = max(timed, key=lambda x: x["peak_fraction"]) if timed else None
    alone = _products_fraction(peaks, shape, PRODUCT_LIBS)
    return _target(f"fastest path >= 85% of peak ({shape})", f"{best['path']} {100 * best['peak_fraction']:.1f}%"
                   if best else "not measured", best["peak_fraction"] >= 0.85 if best else None,
                   f"the block's float products alone, in the fastest library: {100 * alone:.1f}%" if alone else "")


# The float32 paths that compute the block to float32's tolerance and are meant to be fast (the
# spec is the reference, torch-plain the baseline, ort-int8 lossy, the bitnet rows another config).
EXACT_PATHS = ("torch-eager", "torch-onednn", "torch-compile", "jax-jit", "ort-opset17", "ort-opset23")


def _exact_vs_products(path: dict, shape: str = "large") -> dict:
    timed = {n: path[shape, n]["products_fraction"] for n in EXACT_PATHS
             if (shape, n) in path and path[shape, n].get("products_fraction") is not None}
    worst = min(timed, key=timed.get) if timed else None
    return _target(f"every exact path >= 80% of products alone ({shape})",
                   f"slowest {worst} {100 * timed[worst]:.1f}%" if worst else "not measured",
                   timed[worst] >= 0.80 if worst else None,
                   ", ".join(f"{n} {100 * f:.0f}%" for n, f in timed.items()))


def _eager_vs_fastest(rows, path: dict, shape: str = "large") -> dict:
    timed = [n for n in EXACT_PATHS if (shape, n) in path and n != "torch-eager"]
    if (shape, "torch-eager") not in path or not timed:
        return _target(f"torch-eager within 10% of the fastest exact path ({shape})", "not measured", None)
    fastest = min(timed, key=lambda n: statistics.median(path[shape, n]["round_s"]))
    r = paired_ratio(rows, shape, fastest, "torch-eager")  # its speed as a share of the fastest's
    return _target(f"torch-eager within 10% of the fastest exact path ({shape})", f"{_ratio_text(r)} of {fastest}",
                   r["median"] >= 0.9, "")


def _jax(path: dict, peaks: dict) -> dict:
    jax = path.get(("large", "jax-jit"))
    bound, value, met, note = _products_fraction(peaks, "large", ("xla",)), "not measured", None, ""
    if jax and jax.get("peak_fraction") is not None:
        value, met = f"{100 * jax['peak_fraction']:.1f}%", jax["peak_fraction"] >= 0.70
        if bound:
            # the alternative: XLA's products alone cannot reach 70%, and jax-jit reaches 70% of them
            limit = bound < 0.70 and jax["peak_fraction"] / bound >= 0.70
            note = (f"the block's products alone in XLA: {100 * bound:.1f}% of peak; jax-jit runs at "
                    f"{100 * jax['peak_fraction'] / bound:.0f}% of that, so XLA's CPU matmul is "
                    f"{'the limit' if limit else 'not the only limit' if bound < 0.70 else 'not the limit'}")
            if not met and limit:
                met, value = True, value + " (the alternative)"
    return _target("jax-jit >= 70% of peak (large)", value, met, note)


def _opset(rows, shape: str) -> dict:
    r = paired_ratio(rows, shape, "ort-opset17", "ort-opset23")  # the two run next to each other in every round
    return _target(f"ort-opset23 >= ort-opset17 ({shape})", _ratio_text(r), r["median"] >= 1.0 if r else None)


def _bitnet(rows, path: dict, peaks: dict) -> dict:
    r = paired_ratio(rows, "large", "ort-bitnet", "ort-bitnet-int")
    bitnet, projections = path.get(("large", "ort-bitnet")), peaks.get("large", {}).get("ort_projections_round_s") or {}
    note = ""
    if r and bitnet and {"float", "int"} <= set(projections):
        rounds = list(zip(bitnet["round_s"], projections["float"], projections["int"]))
        bound = statistics.median(t / (t - f + i) for t, f, i in rounds)
        share_float, share_int = (statistics.median(p / t for t, p in zip(bitnet["round_s"], projections[k]))
                                  for k in ("float", "int"))
        note = (f"estimate {bound:.2f}x: ort-bitnet with its projections at ONNX Runtime's integer speed (the float "
                f"projections alone are {100 * share_float:.0f}% of its time, the integer ones {100 * share_int:.0f}%)")
    return _target("ort-bitnet-int >= 1.5x ort-bitnet (large)", _ratio_text(r), r["median"] >= 1.5 if r else None, note)


def _long_memory(result: dict) -> dict:
    long = (result.get("long_context") or {}).get("rows", {})
    torch_long = long.get("torch-eager", {})
    shape = (result.get("long_context") or {}).get("shape")
    label = "B{} T{} D{} H{}".format(*shape) if shape else "long context"
    return _target(f"torch-eager peak memory < 1 GB ({label})",
                   f"{torch_long['peak_rss_bytes'] / 1e6:.0f} MB" if "peak_rss_bytes" in torch_long else "not measured",
                   torch_long["peak_rss_bytes"] < 1e9 if "peak_rss_bytes" in torch_long else None)


def check_targets(result: dict) -> list[dict]:
    """The performance issue's targets, each from ratios measured in this run: met True/False, or
    None where this run did not measure it."""
    rows = result["paths"]
    peaks = {p["shape"]: p for p in result["peaks"]}
    path = {(x["shape"], x["path"]): x for x in rows if x.get("round_s")}
    return [_eager_vs_plain(rows, path, peaks), _fastest(rows, peaks, "small"), _fastest(rows, peaks, "large"),
            _exact_vs_products(path), _eager_vs_fastest(rows, path), _jax(path, peaks), _opset(rows, "small"),
            _opset(rows, "large"), _bitnet(rows, path, peaks), _long_memory(result)]

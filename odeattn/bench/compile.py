"""The JAX block's compile cost as a user pays it: each config's first call against its warm call.

Each config runs in a fresh Python process with JAX's persistent compilation cache off, so the
first call traces, lowers and compiles from nothing. The process first imports JAX and the port,
starts the CPU client and builds its inputs (none of it timed), then times the first call of
ode_block_jit and `calls` warm calls after it. Its figure is first - warm (the warm call's median):
what compiling costs. The configs take turns in rounds, the start rotating by one per round, and
the ratios (rk4 and rk38 against euler, 16 steps against 1) are paired per round.
"""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
import time

from .paths import SHAPES, path_inputs
from .timing import spread

COMPILE_SHAPE = SHAPES["small"]
COMPILE_CONFIGS = (("euler", 4), ("rk2_gated", 4), ("rk4", 4), ("rk38", 4), ("rk4", 1), ("rk4", 16))  # (solver, steps)
COMPILE_CALLS = 5  # warm calls after the first in a probe
COMPILE_REPEATS = 7  # rounds of fresh processes: the medians of enough rounds to outlast a shared machine's swings (docs/performance-method.md)
RATIOS = (("rk4 x 4", "euler x 4"), ("rk38 x 4", "euler x 4"), ("rk4 x 16", "rk4 x 1"))  # paired per round
BLOCK = "odeattn.backends.jax:ode_block_jit"  # the jitted block a probe times, "module:name"


def _key(solver: str, steps: int) -> str:
    return f"{solver} x {steps}"


def compile_probe(solver: str, steps: int, shape=COMPILE_SHAPE, calls: int = COMPILE_CALLS, block: str = BLOCK) -> dict:
    """Run in a fresh process: {first_s, warm_s, first_minus_warm_s, first_minus_warm_cpu_s} of
    `block` (module:name, a jitted ode_block) on the bench's float32 inputs at shape, with no
    persistent cache. The CPU figure (this process's threads) moves less with other processes' load."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # a user's first call, whatever the environment sets
    import jax.numpy as jnp

    module, name = block.split(":")
    fn = getattr(importlib.import_module(module), name)
    config, params, x = path_inputs(shape, "jax-jit", solver, steps)
    ps = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    xj = jnp.asarray(x, jnp.float32)
    jnp.zeros(1).block_until_ready()  # the CPU client starts before the timing
    times = []  # (wall s, this process's CPU s) of each call
    for _ in range(1 + calls):
        start, cpu = time.perf_counter(), time.process_time()
        fn(ps, xj, config).block_until_ready()
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    warm_s, warm_cpu_s = (statistics.median(t[j] for t in times[1:]) for j in (0, 1))
    return {"first_s": times[0][0], "warm_s": warm_s, "first_minus_warm_s": times[0][0] - warm_s,
            "first_minus_warm_cpu_s": times[0][1] - warm_cpu_s}


def run_compile_probe(solver: str, steps: int, shape=COMPILE_SHAPE, calls: int = COMPILE_CALLS,
                      block: str = BLOCK) -> dict:
    """compile_probe in a fresh Python process; {"error": last line of its stderr} if it fails."""
    args = json.dumps({"solver": solver, "steps": steps, "shape": list(shape), "calls": calls, "block": block})
    code = ("import json, sys; from odeattn.bench.compile import compile_probe; "
            "print(json.dumps(compile_probe(**json.loads(sys.argv[1]))))")
    proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _paired(rounds: dict, slow: str, fast: str) -> dict | None:
    """slow's first - warm over fast's, per round where both ran."""
    pairs = [(s, f) for s, f in zip(rounds.get(slow, []), rounds.get(fast, [])) if s is not None and f is not None]
    return spread([s / f for s, f in pairs]) if pairs else None


def bench_compile(log, *, configs=None, shape=None, repeats: int = COMPILE_REPEATS, calls: int = COMPILE_CALLS,
                  blocks: dict | None = None) -> dict:
    """`repeats` rounds of one fresh process per config (and per block of blocks, {label: module:name},
    default {"": BLOCK}) of configs (default COMPILE_CONFIGS) at shape (COMPILE_SHAPE), the start rotating by one per round: per config its first - warm and warm
    times per round, their medians, and the ratios paired per round (of wall times, and of CPU times)."""
    configs, shape, blocks = configs or COMPILE_CONFIGS, shape or COMPILE_SHAPE, blocks or {"": BLOCK}
    jobs = [(label, solver, steps) for solver, steps in configs for label in blocks]
    names = {job: (f"{job[0]} " if job[0] else "") + _key(*job[1:]) for job in jobs}
    rounds, cpu, warm = ({name: [] for name in names.values()} for _ in range(3))
    for r in range(repeats):
        k = r % len(jobs)
        for job in jobs[k:] + jobs[:k]:
            label, solver, steps = job
            res = run_compile_probe(solver, steps, shape, calls, blocks[label])
            if "error" in res:
                log(f"  compile {names[job]}: failed: {res['error']}")
                res = {"first_minus_warm_s": None, "first_minus_warm_cpu_s": None, "warm_s": None}
            for got, key in ((rounds, "first_minus_warm_s"), (cpu, "first_minus_warm_cpu_s"), (warm, "warm_s")):
                got[names[job]].append(res[key])
            if res["warm_s"] is None:
                continue
            log(f"  compile {names[job]:<22} round {r + 1}: first - warm {res['first_minus_warm_s']:.3f} s, "
                f"warm {res['warm_s'] * 1e3:.1f} ms")
    rows = [{"config": name, "round_first_minus_warm_s": rounds[name], "round_first_minus_warm_cpu_s": cpu[name],
             "round_warm_s": warm[name], "first_minus_warm_s": _median(rounds[name]),
             "first_minus_warm_cpu_s": _median(cpu[name]), "warm_s": _median(warm[name])} for name in rounds]
    prefix = {label: (f"{label} " if label else "") for label in blocks}
    ratios = {kind: {f"{p}{slow} / {p}{fast}": _paired(times, p + slow, p + fast)
                     for p in prefix.values() for slow, fast in RATIOS} for kind, times in (("wall", rounds), ("cpu", cpu))}
    return {"shape": list(shape), "repeats": repeats, "calls": calls, "rows": rows,
            "ratios": {k: v for k, v in ratios["wall"].items() if v is not None},
            "cpu_ratios": {k: v for k, v in ratios["cpu"].items() if v is not None}}


def _median(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


# The targets for the first call, with the small shape's figures: rk4 x 4 at most this much
# over its warm call; rk4 and rk38 at most this times euler; 16 steps at most this times 1 step.
FIRST_CALL_S, STAGES_RATIO, STEPS_RATIO = 0.5, 1.2, 1.25


def compile_targets(result: dict | None) -> list[dict]:
    """The first-call targets from a bench_compile result (met None where not measured)."""
    result = result or {"rows": [], "ratios": {}}
    row = {r["config"]: r for r in result["rows"]}.get("rk4 x 4", {})
    first, ratios = row.get("first_minus_warm_s"), result["ratios"]

    def text(r):
        return f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})" if r else "not measured"

    def target(name, value, met):
        return {"target": name, "value": value, "met": met, "note": ""}

    stages = [ratios.get(f"{s} x 4 / euler x 4") for s in ("rk4", "rk38")]
    steps = ratios.get("rk4 x 16 / rk4 x 1")
    spread_s = [v for v in row.get("round_first_minus_warm_s", []) if v is not None]
    return [
        target(f"JAX first call - warm, rk4 x 4 <= {FIRST_CALL_S} s (small)",
               f"{first:.2f} s ({min(spread_s):.2f}..{max(spread_s):.2f})" if first is not None else "not measured",
               first <= FIRST_CALL_S if first is not None else None),
        target(f"JAX first call - warm, rk4, rk38 <= {STAGES_RATIO}x euler",
               " / ".join(text(r) for r in stages), all(r["median"] <= STAGES_RATIO for r in stages) if all(stages) else None),
        target(f"JAX first call - warm, rk4 x 16 <= {STEPS_RATIO}x rk4 x 1", text(steps),
               steps["median"] <= STEPS_RATIO if steps else None),
    ]


def compile_lines(result: dict | None) -> list[str]:
    """The bench's text for a bench_compile result: per config first - warm (median, min..max over
    rounds, and CPU), the warm call, then the paired ratios."""
    if not result:
        return []
    b, t, d, h = result["shape"]
    lines = [f"JAX first call - warm call, fresh process, no persistent cache: B{b} T{t} D{d} H{h}, float32, "
             f"{result['repeats']} rounds",
             f"{'config':<22}{'first - warm s':>15}{'min..max':>14}{'CPU s':>8}{'warm ms':>9}"]
    for r in result["rows"]:
        got = [v for v in r["round_first_minus_warm_s"] if v is not None]
        if not got:
            lines.append(f"{r['config']:<22}failed")
            continue
        lines.append(f"{r['config']:<22}{r['first_minus_warm_s']:>15.2f}{f'{min(got):.2f}..{max(got):.2f}':>14}"
                     f"{r['first_minus_warm_cpu_s']:>8.2f}{r['warm_s'] * 1e3:>9.1f}")
    for name, r in result["ratios"].items():
        cpu = result.get("cpu_ratios", {}).get(name)
        lines.append(f"{name:<32}{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})"
                     + (f"; CPU {cpu['median']:.2f}x" if cpu else ""))
    return lines


def compile_result(log, *, repeats: int = COMPILE_REPEATS) -> dict:
    """What `bench --compile` prints and saves: the first-call rounds and their targets."""
    result = {"compile": bench_compile(log, repeats=repeats)}
    result["targets"] = compile_targets(result["compile"])
    return result

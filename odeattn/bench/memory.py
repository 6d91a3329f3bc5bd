"""Memory: each path's peak host memory in a fresh process, and training memory against steps.

Peak memory (the main table's `peak MB`, and --long-context) is the rise of a fresh process's
resident high-water mark over a baseline taken after its imports, so one path's runtime never
counts toward another's. Training memory (`bench --memory`) is the peak activation memory of one
forward+backward against ode_steps, with and without activation checkpointing: torch's counted
by LiveTensorBytes, JAX's from the compiled program's memory analysis.
"""

from __future__ import annotations

import gc
import importlib
import json
import statistics
import subprocess
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import ode_ref as R

from .paths import PATH_SPECS, Skip, path_inputs
from .timing import interleaved_times, measure

MEMORY_CALLS = 2  # forwards after the first in a memory process
MEMORY_SHAPE = (1, 128, 64, 4)  # batch, seq, d_model, heads
MEMORY_STEPS = (1, 2, 4, 8, 16, 32)
MEMORY_RUNTIMES = ("torch", "jax")
TARGET_RATIO = 1.5  # with checkpointing, peak(32 steps) / peak(1 step) at most this


# Peak memory of a path, in a fresh process per path


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def memory_probe(name: str, shape, solver: str, steps: int, threads: int, calls: int = MEMORY_CALLS) -> dict:
    """Run in a fresh process: the peak RSS increase of path `name` from a baseline taken after
    its imports, its runtime's start and the inputs, through setup, the first call and `calls`
    more (docs/performance-method.md); with the time of the first call and of the fastest other."""
    spec = PATH_SPECS[name]
    for module in spec.imports:
        importlib.import_module(module)
    if spec.prime:
        spec.prime(threads)
    config, params, x = path_inputs(shape, name, solver, steps)
    gc.collect()
    base = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    start = time.perf_counter()
    try:
        fn, _ = spec.setup(name, config, params, x, threads)
    except (ImportError, Skip) as err:
        return {"skipped": str(err)}
    fn()
    first = time.perf_counter() - start
    times = measure(fn, warmup=0, repeats=calls)
    out = {"peak_rss_bytes": _status_bytes("VmHWM") - base, "setup_and_first_call_s": first,
           "call_s": min(times) if times else None, "live_tensor_bytes": None}
    if spec.live_bytes:
        out["live_tensor_bytes"] = torch_peak_bytes(fn)
    return out


def run_memory_probe(name: str, shape, solver: str, steps: int, threads: int, calls: int = MEMORY_CALLS) -> dict:
    """memory_probe in a fresh Python process; {"error": last line of its stderr} if it fails."""
    args = json.dumps({"name": name, "shape": list(shape), "solver": solver, "steps": steps, "threads": threads,
                       "calls": calls})
    code = "import json, sys; from odeattn.bench.memory import memory_probe; print(json.dumps(memory_probe(**json.loads(sys.argv[1]))))"
    proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        if proc.returncode < 0:
            why = f"killed by signal {-proc.returncode}" + (" (out of memory?)" if proc.returncode == -9 else "")
        return {"error": why}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_table(jobs, solver: str, steps: int, threads: int, log, *, parallel: int = 1,
                 calls: int = MEMORY_CALLS) -> dict:
    """{(path, shape name): probe result} for jobs [(path, shape name, shape)]; `parallel`
    processes at a time (each measures its own RSS, so they do not disturb each other's figure)."""
    def one(job):
        name, label, shape = job
        res = run_memory_probe(name, shape, solver, steps, threads, calls)
        mb = (f"{res['peak_rss_bytes'] / 1e6:.0f} MB" if "peak_rss_bytes" in res
              else f"skipped ({res['skipped']})" if "skipped" in res else f"failed: {res['error']}")
        log(f"  memory {label} {name}: {mb}")
        return (name, label), res

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return dict(pool.map(one, jobs))


def long_context_table(names, shape, solver: str, steps: int, threads: int, log, calls: int = 1) -> dict:
    """Peak memory and the time of one forward of each path at a long context, one fresh process
    per path, one after another; a path with a long_context reason is skipped with it."""
    log(f"long context {shape} (batch, seq, d_model, heads), one path at a time:")
    rows = {}
    for name in names:
        reason = PATH_SPECS[name].long_context
        if reason:
            rows[name] = {"skipped": reason}
            log(f"  {name}: skipped ({reason})")
            continue
        rows.update(((n, res) for (n, _), res in
                     memory_table([(name, "long", shape)], solver, steps, threads, log, calls=calls).items()))
    return {"shape": list(shape), "calls": calls, "rows": rows}


# Training memory against steps (bench --memory)


def live_tensor_bytes_mode():
    """A new LiveTensorBytes (a torch dispatch mode; the class is built on first use, so that
    importing this module does not import torch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveTensorBytes(TorchDispatchMode):
        """Within `with LiveTensorBytes() as m:`, m.live is the bytes of the storages that
        operations created and are still alive, m.peak its maximum. A storage counts once however
        many views share it; it stops counting when it is freed (a weakref finalizer), which may
        be after the block ends. A oneDNN tensor, which has no storage, counts its elements' bytes."""

        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self._sizes = {}  # storage data pointer -> bytes, for the live storages counted

        def _free(self, key):
            self.live -= self._sizes.pop(key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    if t.is_mkldnn:  # oneDNN's opaque layout (a packed weight, gemm.py) has no storage
                        owner, key, size = t, ("mkldnn", id(t)), t.numel() * t.element_size()
                    else:
                        owner = t.untyped_storage()
                        key, size = owner.data_ptr(), owner.nbytes()
                    if size and key not in self._sizes:
                        self._sizes[key] = size
                        self.live += size
                        weakref.finalize(owner, self._free, key)
            self.peak = max(self.peak, self.live)
            return out

    return LiveTensorBytes()


def torch_train_step(block, x, padding_mask=None):
    """A zero-argument callable: one forward+backward of block on x (batch, seq, d_model), loss
    sum(z(1)), the gradients reset first (set to None, so each call allocates them anew)."""

    def run():
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x, padding_mask=padding_mask).sum().backward()

    return run


def torch_peak_bytes(run) -> int:
    """LiveTensorBytes' peak over one call of run (call it once before, to warm up)."""
    mode = live_tensor_bytes_mode()
    with mode:
        run()
    return mode.peak


def _torch_paths(config, params, x, threads: int):
    """{checkpoint: (train step, peak bytes)} for the torch block in float32, in training mode."""
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    torch.set_num_threads(threads)
    out = {}
    for checkpoint in (False, True):
        block = ODEAttentionBlock.from_params(config, params, checkpoint=checkpoint).train()
        run = torch_train_step(block, torch.from_numpy(x.astype(np.float32)).requires_grad_())
        run()
        out[checkpoint] = run, {"peak_bytes": torch_peak_bytes(run)}
    return out


def jax_train_program(config, params, x, checkpoint: bool):
    """(jitted grad of sum(z(1)) with respect to (params, x), its compiled memory analysis)."""
    import jax

    from odeattn.backends.jax import ode_block

    loss = lambda p, xs: ode_block(p, xs, config, checkpoint=checkpoint).sum()  # noqa: E731
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return grad, grad.lower(params, x).compile().memory_analysis()


def _jax_paths(config, params, x, threads: int):
    """{checkpoint: (train step, memory figures)} for the JAX block in float32."""
    import jax

    ps = {k: v.astype(np.float32) for k, v in params.items()}
    xs = jax.numpy.asarray(x.astype(np.float32))
    out = {}
    for checkpoint in (False, True):
        grad, mem = jax_train_program(config, ps, xs, checkpoint)
        run = lambda g=grad: jax.block_until_ready(g(ps, xs))  # noqa: E731
        run()
        out[checkpoint] = run, {"peak_bytes": mem.temp_size_in_bytes, "argument_bytes": mem.argument_size_in_bytes,
                                "output_bytes": mem.output_size_in_bytes}
    return out


def bench_memory(shape, steps_list, runtimes, *, solver: str, repeats: int, threads: int, log, burst: int = 2) -> list[dict]:
    """One row per (runtime, steps, checkpoint): peak activation memory (docs/performance-method.md) and the
    forward+backward time."""
    batch, seq, d_model, heads = shape
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    rows = []
    for runtime in runtimes:
        for steps in steps_list:
            config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps)
            params = R.init_params(config, seed=0)
            try:
                paths = (_torch_paths if runtime == "torch" else _jax_paths)(config, params, x, threads)
            except ImportError as err:
                log(f"  {runtime}: skipped ({err})")
                break
            times = interleaved_times({k: fn for k, (fn, _) in paths.items()}, repeats=repeats, burst=burst)
            for checkpoint, (_, memory) in paths.items():
                t = times[checkpoint]
                rows.append({"runtime": runtime, "steps": steps, "checkpoint": checkpoint, **memory,
                             "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)})
                log(f"  {runtime:<5} steps {steps:>3} checkpoint {checkpoint!s:<5} peak {memory['peak_bytes'] / 1e6:9.3f} MB"
                    f"  median {statistics.median(t) * 1e3:9.2f} ms")
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Per (runtime, checkpoint): peak at the most steps / peak at the fewest, and the target's verdict
    (checkpointing only; the target compares 32 steps with 1)."""
    out = []
    for runtime in dict.fromkeys(r["runtime"] for r in rows):
        for checkpoint in (True, False):
            mine = sorted((r for r in rows if r["runtime"] == runtime and r["checkpoint"] == checkpoint),
                          key=lambda r: r["steps"])
            if len(mine) < 2:
                continue
            first, last = mine[0], mine[-1]
            ratio = last["peak_bytes"] / first["peak_bytes"]
            out.append({"runtime": runtime, "checkpoint": checkpoint, "from_steps": first["steps"], "to_steps": last["steps"],
                        "peak_ratio": ratio, "time_ratio": last["median_s"] / first["median_s"],
                        "meets_target": ratio <= TARGET_RATIO if checkpoint else None})
    return out


def memory_result(shape, steps_list, runtimes, *, solver: str, repeats: int, threads: int, log) -> dict:
    """What `bench --memory --json` writes: the settings, bench_memory's rows and their ratios."""
    rows = bench_memory(shape, steps_list, runtimes, solver=solver, repeats=repeats, threads=threads, log=log)
    return {"threads": threads, "solver": solver, "shape": shape, "memory": rows, "ratios": ratios(rows),
            "target_ratio": TARGET_RATIO}

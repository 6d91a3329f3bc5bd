"""`odeattn bench --memory`: training memory and time of one forward+backward against ode_steps,
with and without activation checkpointing (torch: ODEAttentionBlock(config, checkpoint=True);
JAX: ode_block(..., checkpoint=True)).

Peak activation memory, per runtime (parameters and the input x are excluded in both):

    torch  the peak, over one forward+backward, of the bytes of tensor storages that the
           forward's and the backward's operations created and that are still alive: what
           autograd saved for backward (with checkpointing: the step inputs it keeps, and the
           activations of the step being recomputed), the temporaries, and the gradients.
           Counted exactly by LiveTensorBytes, a dispatch mode that sees every operation's
           output storage and its release (the C++ allocator itself has no CPU statistics).
    jax    temp_size_in_bytes of the compiled forward+backward program's memory analysis: the
           peak of XLA's buffer assignment for everything that is neither an argument nor an
           output (the gradients are outputs, so not counted).

Time: the median wall-clock seconds of one forward+backward; the two modes of a (runtime, steps)
pair are interleaved in short bursts (one call to wake the runtime, then `burst` timed calls,
alternating), as in `bench --decode`, so the machine's drift hits both alike. Memory is measured
apart from the timed calls (the counting mode slows torch down).
"""

from __future__ import annotations

import statistics
import weakref

import numpy as np

import ode_ref as R

MEMORY_SHAPE = (1, 128, 64, 4)  # batch, seq, d_model, heads
MEMORY_STEPS = (1, 2, 4, 8, 16, 32)
MEMORY_RUNTIMES = ("torch", "jax")
TARGET_RATIO = 1.5  # with checkpointing, peak(32 steps) / peak(1 step) at most this


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
        be after the block ends."""

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
                    storage = t.untyped_storage()
                    key, size = storage.data_ptr(), storage.nbytes()
                    if size and key not in self._sizes:
                        self._sizes[key] = size
                        self.live += size
                        weakref.finalize(storage, self._free, key)
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


def interleaved_times(fns: dict, *, repeats: int, burst: int) -> dict:
    """{key: [seconds, ...]}: for each repeat, each fn in turn is called once (to wake its
    threads), then timed `burst` times."""
    from odeattn.bench import measure

    times = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            fn()
            times[key] += measure(fn, warmup=0, repeats=burst)
    return times


def bench_memory(shape, steps_list, runtimes, *, solver: str, repeats: int, threads: int, log, burst: int = 2) -> list[dict]:
    """One row per (runtime, steps, checkpoint): peak activation memory (module docstring) and the
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


def format_memory(result: dict) -> str:
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


def plot_memory(result: dict, path) -> None:
    """Two panels, log-log: peak activation memory vs steps, and time vs steps; both modes."""
    from odeattn.plotting import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for runtime in dict.fromkeys(r["runtime"] for r in result["memory"]):
        for checkpoint, style in ((False, "o-"), (True, "s--")):
            mine = [r for r in result["memory"] if r["runtime"] == runtime and r["checkpoint"] == checkpoint]
            label = f"{runtime}, {'checkpoint' if checkpoint else 'no checkpoint'}"
            steps = [r["steps"] for r in mine]
            axes[0].plot(steps, [r["peak_bytes"] / 1e6 for r in mine], style, label=label)
            axes[1].plot(steps, [r["median_s"] * 1e3 for r in mine], style, label=label)
    for ax, title in ((axes[0], "peak activation memory (MB) vs steps"), (axes[1], "forward+backward time (ms) vs steps")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ode_steps")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""`odeattn bench`: every execution path of the block timed interleaved in one run, against a plain
PyTorch block and this machine's own float32 matmul peak, both measured in the same run.

Method (the main table). Timings on a shared machine swing up to 4x minute to minute, so only
ratios of times taken close together are stable. For each shape, every path is set up and called
once (the time of the setup and that first call, which includes torch.compile, JAX compilation,
the ONNX export and ONNX Runtime session creation, is reported apart, as `setup+first s`), then
called `--warmup` more times untimed. Then `--repeats` rounds: in each round every path, and
every matmul of the peak (below), takes its turn (the starting point rotates by one each round):
SETTLE_S idle (the previous runtime's spinning threads settle), one untimed call to wake its
runtime's threads (left out when a call takes over 0.5 s: the
wake-up is a small part of such a call), then a burst of timed calls lasting about BURST_S
seconds (at least one call, at most MAX_BURST; sized from the last warm-up call, then from the
path's previous burst median). Rotating the
turn keeps its neighbours: the paths a target compares (torch-plain and torch-eager, ort-opset17
and ort-opset23, ort-bitnet and ort-bitnet-int) are side by side in PATHS (the order the paths run in, whatever the order
of --paths), so they run seconds apart in every round. A path's time in a round is its burst
median. Per round:

    vs plain  = torch-plain's time / the path's time, both of that round
    % peak    = the path's GFLOP/s / the peak of that round

and the table gives the median over rounds of these paired ratios (vs plain with its min..max),
beside the median over rounds of the path's time and the minimum of all its timed calls, in ms.
torch-plain is the block written plainly, the seed module's way (nn.LayerNorm, nn.Linear,
matmul, masked_fill, softmax, matmul, an explicit Runge-Kutta loop over the tableau), with the
same weights: the baseline the ports are measured against.

FLOPs count the matrix products only (elementwise work is O(B T D + B H T^2), under 2% here):

    per evaluation of f:  qkv 6 B T D^2  +  scores 2 B T^2 D  +  a @ v 2 B T^2 D  +  out 2 B T D^2
                        = 8 B T D^2 + 4 B T^2 D
    per block forward:    stages(solver) * ode_steps evaluations

The peak of a round is the best GFLOP/s, in that round, of a float32 matmul in torch.mm, NumPy
(a @ b, its BLAS) and ONNX Runtime (a one-node MatMul model), each at the square sizes
PEAK_SIZES and at the block's own qkv projection (B T, D) x (D, 3 D). XLA's matmul (jax.jit of
jnp.dot) at the same sizes is timed in the same rounds and shown apart: the jax-jit row is also
compared with it, to tell XLA's CPU matmul from the block's own overhead.

Products alone. Also timed in the same rounds, per library (torch, NumPy, ONNX Runtime, XLA):
the block's matrix products of a forward and nothing else (product_chain: those flops() counts,
at the shape's own sizes, the scores written out). That is how fast a path could run whose
products ran at that library's speed and whose norms, softmax, masks and Runge-Kutta sums were
free: a bound for the paths that write all their scores out (torch-plain, the opset 17 export),
not for a fused attention kernel that never does (SDPA's, in torch-eager and torch-compile), nor
for jax-jit past 4 MiB of scores (it computes them a tile of heads at a time, so they stay in
cache). The targets
give it beside the measured value: the fastest library's, as a fraction of the peak (the 85%
target); torch-plain over torch's (what torch-eager would gain over the plain block doing
nothing but its products, with the same kernels); XLA's against the peak (the JAX target's
alternative: when XLA's products cannot reach 70% and jax-jit reaches 70% of them, XLA's CPU
matmul is the limit). Where ort-bitnet-int runs, ONNX
Runtime's two projections of a forward alone are timed too, as float MatMuls and as the integer
export's MatMulIntegers: ort-bitnet with its projections' time replaced by the integer one's
bounds what integer BitLinear can gain.

Peak memory (`peak MB`): each path runs in a fresh Python process of its own, which imports the
path's runtime, starts it, builds the weights and the input, and then records its resident set
size (VmRSS) and resets the kernel's high-water mark (VmHWM, via /proc/self/clear_refs); then it
sets the path up, calls it once, then twice more. The figure is VmHWM minus that baseline: every
byte the path touched in host memory for setup and forwards, the copy of the weights it holds,
the exported ONNX model and ONNX Runtime's session, compiled code, thread stacks, activations and
the output; not what the imports themselves cost, nor processes it starts (torch.compile's
compile workers). For the torch eager paths `live MB` is also given: the peak bytes of live
tensor storages that the forward's operations create (odeattn.memory.LiveTensorBytes), the
activations alone. `--long-context` adds a table of peak memory and the time of one forward at
LONG_SHAPE, the same way, one path after another.

Threads: `--threads` (default: every core) sets torch's and ONNX Runtime's intra-op threads;
NumPy's BLAS and XLA keep their own defaults (every core).

The ONNX Runtime rows also give the model's size, and every row its max relative error against
the spec in float64 on the same input (`max err`): ort-int8 is the opset 17 export with its
projections dynamically quantised to int8 (`odeattn export --quantize int8`), lossy, so beside
the float rows rather than conformant; ort-bitnet and ort-bitnet-int run the block with
use_bitnet (BitLinear projections), as a float export and with integer BitLinear.

`odeattn bench --quick`: the same table, on the small shape only, with fewer rounds, shorter
bursts and smaller peak matmuls, in about a minute.

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

import dataclasses
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

import ode_ref as R
from odeattn.commands.args import check_output_path, non_negative_int, positive_int

SHAPES = {  # name -> (batch, seq, d_model, heads)
    "small": (1, 128, 256, 8),
    "large": (8, 512, 512, 8),
}
LONG_SHAPE = (1, 8192, 512, 8)  # --long-context
PEAK_SIZES = (256, 512, 1024, 2048)  # square float32 matmuls of the peak, beside the block's projection
BURST_S = 0.25  # seconds of timed calls per path per round
WAKE_LIMIT_S = 0.5  # no wake call before a burst of calls longer than this
# Idle time before each turn: the previous turn's runtime keeps its threads spinning for a while
# after its last call (OpenMP's and ONNX Runtime's pools, NumPy's BLAS) and they take the cores
# from whatever runs next. Measured without it (bench --quick): torch-plain, which ran right
# after the NumPy paths, came out 2.57x slower than torch-eager; run apart from them, 0.98x.
SETTLE_S = 0.2
MAX_BURST = 30  # timed calls per burst at most
DEFAULT_REPEATS = 5  # rounds of the main table; timed calls (or bursts) of --decode, --memory and the scaling lines
QUICK = {"shapes": {"small": SHAPES["small"]}, "repeats": 3, "burst_s": 0.05, "peak_sizes": (256, 512, 1024),
         "long_shape": (1, 2048, 256, 8)}
MEMORY_CALLS = 2  # forwards after the first in a memory process
TORCH_PLAIN = "torch-plain"  # the baseline of `vs plain`


class Skip(Exception):
    """A path that cannot run here, with the reason printed in its place."""


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


# ---------------------------------------------------------------------------------------------
# torch-plain: the block written plainly, the seed module's way


def plain_torch_block(config, params):
    """The block as the seed module writes it, in float32, loaded with `params` by their seed
    state_dict names: ode_func.norm (nn.LayerNorm), ode_func.qkv and ode_func.out_proj (nn.Linear,
    no bias); f = norm, qkv, split heads, matmul, scale, masked_fill (decoder), softmax, matmul,
    merge heads, out_proj; an explicit Runge-Kutta loop over the tableau. Plain float block only:
    ValueError naming the field for a config it does not cover."""
    import torch
    from torch import nn

    cfg = R.ODEConfig.from_any(config)
    tableau = R.TABLEAUS[cfg.ode_solver]
    for field, expected in (("norm_type", "layer_norm"), ("use_bitnet", False), ("ode_use_pe", False)):
        if getattr(cfg, field) != expected:
            raise ValueError(f"{field}: torch-plain covers the plain float block, {field} {expected!r}; "
                             f"got {getattr(cfg, field)!r}")
    if tableau.gated:
        raise ValueError(f"ode_solver: torch-plain covers the fixed tableaus, not a gated one; got {cfg.ode_solver!r}")
    d, heads = cfg.hidden_size, cfg.num_heads

    class ODEFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.out_proj = nn.Linear(d, d, bias=False)
            self.head_dim = d // heads
            self.scale = self.head_dim**-0.5

        def forward(self, t, x):
            b, n, _ = x.shape
            qkv = self.qkv(self.norm(x)).reshape(b, n, 3, heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            if cfg.mode == "decoder":
                future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
                scores = scores.masked_fill(future, float("-inf"))
            attn = torch.softmax(scores, dim=-1)
            y = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d)
            return self.out_proj(y)

    class ODEAttentionBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ode_func = ODEFunc()

        def forward(self, x):
            dt = 1.0 / cfg.ode_steps
            z = x
            for step in range(cfg.ode_steps):
                t, ks = step * dt, []
                for c, row in zip(tableau.c, tableau.a):
                    zi = z
                    for a, k in zip(row, ks):
                        if a:
                            zi = zi + (dt * a) * k
                    ks.append(self.ode_func(t + c * dt, zi))
                for b, k in zip(tableau.b, ks):
                    if b:
                        z = z + (dt * b) * k
            return z

    block = ODEAttentionBlock().eval()
    block.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in params.items()}, strict=True)
    return block


# ---------------------------------------------------------------------------------------------
# The paths: one entry each


def _prime_torch(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _prime_jax(threads: int) -> None:
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # starts the CPU client


def _prime_ort(threads: int) -> None:
    pass


def _setup_spec(name, config, params, x, threads):
    dtype = np.float64 if name == "spec-f64" else np.float32
    xs, ps = x.astype(dtype), {k: v.astype(dtype) for k, v in params.items()}
    return (lambda: R.ode_block(ps, xs, config)), None


def _setup_torch(name, config, params, x, threads):
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    torch.set_num_threads(threads)
    if name == TORCH_PLAIN:
        fn = plain_torch_block(config, params)
    else:
        block = ODEAttentionBlock.from_params(config, params)
        fn = torch.compile(block, fullgraph=True) if name == "torch-compile" else block
    xt = torch.from_numpy(x.astype(np.float32))

    def run():
        with torch.no_grad():
            return fn(xt)

    return run, None


def _setup_jax(name, config, params, x, threads):
    import jax.numpy as jnp

    from odeattn.backends.jax import ode_block_jit

    ps = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    xj = jnp.asarray(x, jnp.float32)
    return (lambda: ode_block_jit(ps, xj, config).block_until_ready()), None


def _onnx_model(name: str, config, params):
    """The model an ort path runs: the block exported at opset 17 or 23; ort-int8: the opset 17
    export with its projections dynamically quantised to int8 (odeattn export --quantize int8);
    ort-bitnet: the opset 17 export of the BitLinear block; ort-bitnet-int: the same with integer
    BitLinear (export_model(..., bitlinear="integer"))."""
    from odeattn.export.block import export_model

    if name == "ort-int8":
        from odeattn.export.deploy import quantize_int8

        return quantize_int8(export_model(config, params, padding_mask=False))
    if name == "ort-bitnet-int":
        return export_model(config, params, opset=17, padding_mask=False, bitlinear="integer")
    return export_model(config, params, opset=23 if name == "ort-opset23" else 17, padding_mask=False)


def _setup_ort(name, config, params, x, threads):
    from odeattn.export.runtime import session

    model = _onnx_model(name, config, params)
    sess = session(model, threads=threads)
    feed = {"x": x.astype(np.float32)}
    return (lambda: sess.run(None, feed)[0]), model


@dataclasses.dataclass(frozen=True)
class PathSpec:
    setup: Callable  # (name, config, params, x, threads) -> (zero-argument forward, ONNX model or None)
    imports: tuple = ()  # modules a memory process imports before its baseline
    prime: Callable | None = None  # (threads) -> None: starts the runtime before the baseline
    bitnet: bool = False  # runs the block with use_bitnet (BitLinear projections)
    live_bytes: bool = False  # torch eager: LiveTensorBytes' peak too
    long_context: str | None = None  # the reason it is left out of --long-context, if it is


_SPEC_LONG = "the NumPy spec materialises heads x T x T scores ({} GB each at B1 T8192 H8, several alive) and takes minutes per forward"
_TORCH = ("torch", "odeattn.backends.torch")
_ORT = ("onnx", "onnxruntime", "odeattn.export.block", "odeattn.export.runtime", "odeattn.export.deploy")
PATH_SPECS = {
    "spec-f64": PathSpec(_setup_spec, long_context=_SPEC_LONG.format(4.3)),
    "spec-f32": PathSpec(_setup_spec, long_context=_SPEC_LONG.format(2.1)),
    TORCH_PLAIN: PathSpec(_setup_torch, _TORCH, _prime_torch, live_bytes=True),
    "torch-eager": PathSpec(_setup_torch, _TORCH, _prime_torch, live_bytes=True),
    "torch-compile": PathSpec(_setup_torch, _TORCH, _prime_torch),
    "jax-jit": PathSpec(_setup_jax, ("jax", "odeattn.backends.jax"), _prime_jax),
    "ort-opset17": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-opset23": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-int8": PathSpec(_setup_ort, _ORT, _prime_ort),
    "ort-bitnet": PathSpec(_setup_ort, _ORT, _prime_ort, bitnet=True),
    "ort-bitnet-int": PathSpec(_setup_ort, _ORT, _prime_ort, bitnet=True),
}
PATHS = tuple(PATH_SPECS)


def _inputs(shape, name: str, solver: str, steps: int):
    """(config, params, x) of a path at a shape: the same x and, per config, the same weights for
    every path (seed 0); the bitnet paths' config has use_bitnet."""
    batch, seq, d_model, heads = shape
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps,
                         use_bitnet=PATH_SPECS[name].bitnet)
    return config, R.init_params(config, seed=0), np.random.default_rng(0).normal(size=(batch, seq, d_model))


def _output(out) -> np.ndarray:
    return out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) else np.asarray(out)


# ---------------------------------------------------------------------------------------------
# Peak memory, in a fresh process per path


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def memory_probe(name: str, shape, solver: str, steps: int, threads: int, calls: int = MEMORY_CALLS) -> dict:
    """Run in a fresh process: the peak RSS increase of path `name` from a baseline taken after
    its imports, its runtime's start and the inputs, through setup, the first call and `calls`
    more (see the module's docstring); with the time of the first call and of the fastest other."""
    spec = PATH_SPECS[name]
    for module in spec.imports:
        importlib.import_module(module)
    if spec.prime:
        spec.prime(threads)
    config, params, x = _inputs(shape, name, solver, steps)
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
        from odeattn.memory import torch_peak_bytes

        out["live_tensor_bytes"] = torch_peak_bytes(fn)
    return out


def run_memory_probe(name: str, shape, solver: str, steps: int, threads: int, calls: int = MEMORY_CALLS) -> dict:
    """memory_probe in a fresh Python process; {"error": last line of its stderr} if it fails."""
    args = json.dumps({"name": name, "shape": list(shape), "solver": solver, "steps": steps, "threads": threads,
                       "calls": calls})
    code = "import json, sys; from odeattn.bench import memory_probe; print(json.dumps(memory_probe(**json.loads(sys.argv[1]))))"
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


# ---------------------------------------------------------------------------------------------
# Interleaved timing


@dataclasses.dataclass
class Timed:
    """One thing timed in the rounds: a path, or a matmul of the peak."""

    name: str
    fn: Callable
    flop: float
    call_s: float  # one call's time before the rounds: sizes the burst
    rounds: list = dataclasses.field(default_factory=list)  # per round: the burst's times (s)

    def burst(self, burst_s: float) -> int:
        return max(1, min(MAX_BURST, round(burst_s / max(self.call_s, 1e-9))))


def interleave(entries: list[Timed], repeats: int, burst_s: float) -> None:
    """`repeats` rounds; in each, every entry in turn (the start rotating by one per round): a
    wake call (for calls under WAKE_LIMIT_S), then a burst of timed calls, appended to its rounds.
    Each burst is sized from the entry's previous burst median, so bursts keep their length as
    the machine's speed moves."""
    for r in range(repeats):
        k = r % len(entries)
        for e in entries[k:] + entries[:k]:
            time.sleep(SETTLE_S)
            if e.call_s < WAKE_LIMIT_S:
                e.fn()
            e.rounds.append(measure(e.fn, warmup=0, repeats=e.burst(burst_s)))
            e.call_s = statistics.median(e.rounds[-1])


def round_medians(e: Timed) -> list[float]:
    return [statistics.median(t) for t in e.rounds]


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


PEAK_LIBS = ("torch.mm", "numpy", "ort MatMul")  # the peak; "xla dot" is timed beside it, apart


def peak_kernels(sizes, threads: int, log) -> list[tuple[str, tuple, Callable]]:
    """[(library, (m, k, n), zero-argument float32 matmul)] for every library installed."""
    rng = np.random.default_rng(1)
    out = []
    for m, k, n in sizes:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        out.append(("numpy", (m, k, n), lambda a=a, b=b: a @ b))
        try:
            import torch

            torch.set_num_threads(threads)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            out.append(("torch.mm", (m, k, n), lambda ta=ta, tb=tb: torch.mm(ta, tb)))
        except ImportError as err:
            log(f"  peak: torch.mm skipped ({err})")
        try:
            from onnx import TensorProto, helper

            run = _ort_session([helper.make_node("MatMul", ["a", "b"], ["c"])], {"a": a},
                               {"c": (TensorProto.FLOAT, (m, n))}, {"b": b}, threads)
            out.append(("ort MatMul", (m, k, n), run))
        except ImportError as err:
            log(f"  peak: ONNX Runtime MatMul skipped ({err})")
        try:
            import jax
            import jax.numpy as jnp

            dot = jax.jit(jnp.dot)
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            dot(ja, jb).block_until_ready()  # compiles
            out.append(("xla dot", (m, k, n), lambda ja=ja, jb=jb, dot=dot: dot(ja, jb).block_until_ready()))
        except ImportError as err:
            log(f"  peak: XLA dot skipped ({err})")
    return out


PRODUCT_LIBS = ("torch", "numpy", "ort", "xla")


def product_chain(h, q, a, w_qkv, kt, v, w_out, evaluations: int):
    """The block's float32 matrix products over a forward, and nothing else: per evaluation the qkv
    projection h @ w_qkv (B T, D) x (D, 3 D), the output projection h @ w_out (B T, D) x (D, D),
    the scores q @ kt (B H, T, d_h) x (B H, d_h, T) and the weighted values a @ v (B H, T, T) x
    (B H, T, d_h): flops()'s count. Each evaluation's operands are the previous one's products
    (h from h @ w_out, q from a @ v, a from q @ kt; the qkv projections summed), so no runtime can
    merge or drop a repeated product, and only the last ones are returned. The scores are written
    out, as the plain block and the opset 17 export do (JAX too, below 4 MiB of them). The same code for NumPy, torch and
    traced JAX arrays (`@` and `+`)."""
    total = None
    for _ in range(evaluations):
        qkv = h @ w_qkv
        total = qkv if total is None else total + qkv
        q, a, h = a @ v, q @ kt, h @ w_out
    return h, q, a, total


CHAIN_ARGS = ("h", "q", "a", "w_qkv", "kt", "v", "w_out")


def product_operands(shape) -> dict:
    """product_chain's float32 operands at shape, scaled so that the chained products keep unit
    variance (w_out by 1 / sqrt(D), kt by 1 / sqrt(d_h), v by 1 / sqrt(T))."""
    batch, seq, d_model, heads = shape
    bt, bh, dh = batch * seq, batch * heads, d_model // heads
    rng = np.random.default_rng(2)

    def draw(*s, scale=1.0):
        return rng.standard_normal(s, dtype=np.float32) * np.float32(scale)

    return {"h": draw(bt, d_model), "q": draw(bh, seq, dh), "a": draw(bh, seq, seq), "w_qkv": draw(d_model, 3 * d_model),
            "kt": draw(bh, dh, seq, scale=dh**-0.5), "v": draw(bh, seq, dh, scale=seq**-0.5),
            "w_out": draw(d_model, d_model, scale=d_model**-0.5)}


def _ort_session(nodes, inputs: dict, outputs: dict, initializers: dict, threads: int):
    """A zero-argument run of a one-graph ONNX model over `inputs` (name -> array); outputs maps
    names to (element type, shape)."""
    from onnx import helper, numpy_helper

    from odeattn.export.runtime import session

    def info(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, list(shape))

    graph = helper.make_graph(nodes, "products", [info(k, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                                                  for k, x in inputs.items()],
                              [info(k, *t) for k, t in outputs.items()],
                              [numpy_helper.from_array(x, k) for k, x in initializers.items()])
    sess = session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), threads=threads)
    return lambda: sess.run(None, inputs)


def _running_sum(nodes: list, total: str | None, term: str) -> str:
    """The name of total + term, appending its Add node to nodes; term itself when total is None."""
    if total is None:
        return term
    from onnx import helper

    nodes.append(helper.make_node("Add", [total, term], [f"{term}_sum"]))
    return f"{term}_sum"


def _ort_product_chain(ops: dict, evaluations: int, threads: int):
    """product_chain as an ONNX graph (inputs h, q, a; the rest initializers)."""
    from onnx import TensorProto, helper

    nodes, names = [], {"h": "h", "q": "q", "a": "a"}
    for e in range(evaluations):
        nodes.append(helper.make_node("MatMul", [names["h"], "w_qkv"], [f"qkv{e}"]))
        names["total"] = _running_sum(nodes, names.get("total"), f"qkv{e}")
        nodes += [helper.make_node("MatMul", [names["a"], "v"], [f"q{e + 1}"]),
                  helper.make_node("MatMul", [names["q"], "kt"], [f"a{e + 1}"]),
                  helper.make_node("MatMul", [names["h"], "w_out"], [f"h{e + 1}"])]
        names.update(q=f"q{e + 1}", a=f"a{e + 1}", h=f"h{e + 1}")
    shapes = {"h": ops["h"].shape, "q": ops["q"].shape, "a": ops["a"].shape,
              "total": (ops["h"].shape[0], ops["w_qkv"].shape[1])}  # product_chain's results
    outputs = {names[k]: (TensorProto.FLOAT, s) for k, s in shapes.items()}
    return _ort_session(nodes, {k: ops[k] for k in ("h", "q", "a")}, outputs,
                        {k: ops[k] for k in CHAIN_ARGS if k not in ("h", "q", "a")}, threads)


def ort_projections(shape, evaluations: int, threads: int, *, integer: bool):
    """A zero-argument run of ONNX Runtime's two projections of a forward and nothing else: per
    evaluation h @ W_qkv and h @ W_out, each evaluation's h an input of its own (the same array, so
    no product is merged), their results summed. Float: float32 MatMul, as the float BitLinear
    export runs them; integer: MatMulInteger of uint8 levels (zero point 128) by int8 ternary
    weights into int32, as export_model(..., bitlinear="integer") does, without its quantisation
    and scale (elementwise passes both forms have in some form)."""
    from onnx import TensorProto, helper

    batch, seq, d_model, _ = shape
    rng = np.random.default_rng(3)
    if integer:
        h = rng.integers(0, 256, (batch * seq, d_model), dtype=np.uint8)
        w = {k: rng.integers(-1, 2, (d_model, n * d_model), dtype=np.int8) for k, n in (("w_qkv", 3), ("w_out", 1))}
        initializers, elem = {**w, "zero": np.array(128, np.uint8)}, TensorProto.INT32
    else:
        h = rng.standard_normal((batch * seq, d_model), dtype=np.float32)
        initializers = {k: np.sign(rng.standard_normal((d_model, n * d_model), dtype=np.float32))
                        for k, n in (("w_qkv", 3), ("w_out", 1))}
        elem = TensorProto.FLOAT
    nodes, total = [], {}
    for e in range(evaluations):
        for w in ("w_qkv", "w_out"):
            args = [f"h{e}", w, "zero"] if integer else [f"h{e}", w]
            nodes.append(helper.make_node("MatMulInteger" if integer else "MatMul", args, [f"{w}{e}"]))
            total[w] = _running_sum(nodes, total.get(w), f"{w}{e}")
    outputs = {total["w_qkv"]: (elem, (batch * seq, 3 * d_model)), total["w_out"]: (elem, (batch * seq, d_model))}
    return _ort_session(nodes, {f"h{e}": h for e in range(evaluations)}, outputs, initializers, threads)


def product_kernels(shape, evaluations: int, threads: int, log) -> list[tuple[str, Callable]]:
    """[(library, zero-argument fn)]: product_chain for a forward of `evaluations` evaluations at
    shape, in each library installed. Timed like a path, it is how fast a path could run whose
    products ran at that library's speed, written out, and whose norms, softmax, masks and
    Runge-Kutta sums cost nothing: for a path that writes all its scores out (torch-plain,
    ort-opset17) a bound. A fused attention kernel that never writes the scores (SDPA's, in
    torch-eager and torch-compile) can beat it, and so can jax-jit's tiles of heads."""
    ops = product_operands(shape)
    args = [ops[k] for k in CHAIN_ARGS]
    out = [("numpy", lambda: product_chain(*args, evaluations))]
    try:
        import torch

        torch.set_num_threads(threads)
        targs = [torch.from_numpy(x) for x in args]
        out.append(("torch", lambda: product_chain(*targs, evaluations)))
    except ImportError as err:
        log(f"  products: torch skipped ({err})")
    try:
        out.append(("ort", _ort_product_chain(ops, evaluations, threads)))
    except ImportError as err:
        log(f"  products: ONNX Runtime skipped ({err})")
    try:
        import jax
        import jax.numpy as jnp

        fn = jax.jit(product_chain, static_argnums=(7,))
        jargs = [jnp.asarray(x) for x in args]
        jax.block_until_ready(fn(*jargs, evaluations))  # compiles
        out.append(("xla", lambda: jax.block_until_ready(fn(*jargs, evaluations))))
    except ImportError as err:
        log(f"  products: XLA skipped ({err})")
    return out


def _first_and_warm(fn, warmup: int) -> tuple[object, float, float]:
    """(first output, first call s, last call s): the first call, then `warmup` more."""
    start = time.perf_counter()
    out = fn()
    first = last = time.perf_counter() - start
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        last = time.perf_counter() - start
    return out, first, last


def bench_shape(label, shape, names, *, solver, steps, warmup, repeats, burst_s, peak_sizes, threads, log) -> dict:
    """The main table's rows of one shape, and its peak: every path set up and first-called, then
    the paths and the peak's matmuls timed in interleaved rounds."""
    from odeattn.conformance.tolerance import relative_error

    batch, seq, d_model, _ = shape
    entries, rows, reference = [], [], {}
    for name in names:
        config, params, x = _inputs(shape, name, solver, steps)
        row = {"shape": label, "path": name, "use_bitnet": config.use_bitnet}
        try:
            start = time.perf_counter()
            fn, model = PATH_SPECS[name].setup(name, config, params, x, threads)
            setup = time.perf_counter() - start
            out, first, last = _first_and_warm(fn, warmup)
        except (ImportError, Skip) as err:
            log(f"  {label} {name}: skipped ({err})")
            rows.append({**row, "skipped": str(err)})
            continue
        if config.use_bitnet not in reference:  # the spec in float64 on this input, once per config
            reference[config.use_bitnet] = _output(out) if name == "spec-f64" else R.ode_block(params, x, config)
        row.update(setup_s=setup, first_call_s=first, file_bytes=len(model.SerializeToString()) if model is not None else None,
                   max_rel_error=relative_error(_output(out), reference[config.use_bitnet]))
        del out
        rows.append(row)
        entries.append(Timed(name, fn, flops(batch, seq, d_model, config), last))
        log(f"  {label} {name:<15} setup {setup:6.2f} s, first call {first:7.2f} s, then {last * 1e3:9.2f} ms")
    projection = (batch * seq, d_model, 3 * d_model)
    matmuls = [Timed(f"{lib} {m}x{k}x{n}", fn, 2.0 * m * k * n, 0.0)
               for lib, (m, k, n), fn in peak_kernels([(s, s, s) for s in peak_sizes] + [projection], threads, log)]
    evaluations = R.TABLEAUS[solver].num_stages * steps
    forward = flops(batch, seq, d_model, R.ODEConfig(hidden_size=d_model, num_heads=shape[3], ode_solver=solver,
                                                     ode_steps=steps))
    products = {lib: Timed(f"products {lib}", fn, forward, 0.0) for lib, fn in product_kernels(shape, evaluations, threads, log)}
    projections = {}
    if any(e.name == "ort-bitnet-int" for e in entries):
        try:
            projections = {form: Timed(f"projections {form}", ort_projections(shape, evaluations, threads, integer=form == "int"),
                                       8.0 * batch * seq * d_model**2 * evaluations, 0.0) for form in ("float", "int")}
        except ImportError as err:
            log(f"  projections: skipped ({err})")
    kernels = matmuls + list(products.values()) + list(projections.values())
    for kernel in kernels:
        kernel.call_s = _first_and_warm(kernel.fn, max(warmup, 1))[2]
    log(f"  {label}: {repeats} rounds of {len(entries)} paths and {len(kernels)} matmuls and products...")
    interleave(entries + kernels, repeats, burst_s)

    def round_peak(libs):
        per_kernel = [[k.flop / t / 1e9 for t in round_medians(k)] for k in matmuls if k.name.rsplit(" ", 1)[0] in libs]
        return [max(col) for col in zip(*per_kernel)] if per_kernel else []

    peak, xla = round_peak(PEAK_LIBS), round_peak(("xla dot",))
    timed = {e.name: e for e in entries}
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
                   vs_plain=_spread([p / t for p, t in zip(plain, med)]) if plain and not row["use_bitnet"] else None)
    kernel_rows = [{"library": k.name.rsplit(" ", 1)[0], "size": k.name.rsplit(" ", 1)[1],
                    "gflops": statistics.median(k.flop / t / 1e9 for t in round_medians(k))} for k in matmuls]
    return {"rows": rows, "peak": {"shape": label, "kernels": kernel_rows, "round_gflops": peak, "xla_round_gflops": xla,
                                   "products_round_s": {lib: round_medians(k) for lib, k in products.items()}, "flop": forward,
                                   "ort_projections_round_s": {form: round_medians(k) for form, k in projections.items()}}}


def paired_ratio(rows, shape: str, slow: str, fast: str) -> dict | None:
    """slow's time / fast's time per round (both timed in that round), its median, min and max."""
    got = {r["path"]: r for r in rows if r["shape"] == shape and "round_s" in r}
    if slow not in got or fast not in got:
        return None
    return _spread([s / f for s, f in zip(got[slow]["round_s"], got[fast]["round_s"])])


SCALING = {"steps": (1, 2, 4, 8), "seq": (64, 128, 256, 512), "export_steps": (1, 4, 16, 64),
           "compile_steps": (1, 4, 16, 64), "compile_repeats": 3}  # the scaling lines' points; compiles timed per point


def scaling(threads: int, warmup: int, repeats: int, log) -> dict:
    """Time against steps and against seq (PyTorch eager), export time and size against steps,
    JAX compile time against steps (at the points of SCALING); all on the small shape."""
    batch, seq, d_model, heads = SHAPES["small"]
    out = {"time_vs_steps": [], "time_vs_seq": [], "export_vs_steps": [], "jax_compile_vs_steps": []}
    base = dict(hidden_size=d_model, num_heads=heads, ode_solver="rk4")
    params = R.init_params(R.ODEConfig(**base), seed=0)
    x = np.random.default_rng(0).normal(size=(batch, seq, d_model))
    try:
        for steps in SCALING["steps"]:
            fn, _ = _setup_torch("torch-eager", R.ODEConfig(**base, ode_steps=steps), params, x, threads)
            out["time_vs_steps"].append({"steps": steps, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})
        for s in SCALING["seq"]:
            xs = np.random.default_rng(0).normal(size=(batch, s, d_model))
            fn, _ = _setup_torch("torch-eager", R.ODEConfig(**base, ode_steps=4), params, xs, threads)
            out["time_vs_seq"].append({"seq": s, "median_s": statistics.median(measure(fn, warmup=warmup, repeats=repeats))})
    except ImportError as err:
        log(f"  scaling with torch: skipped ({err})")
    try:
        from odeattn.export.block import export_model

        from odeattn.export.deploy import inline

        for steps in SCALING["export_steps"]:
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
        for steps in SCALING["compile_steps"]:
            cfg = R.ODEConfig(**base, ode_steps=steps)
            times = measure(lambda: compile_once(cfg), warmup=0, repeats=max(SCALING["compile_repeats"], repeats))
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


def targets(result: dict) -> list[dict]:
    """The performance issue's targets, each from ratios measured in this run: met True/False, or
    None where this run did not measure it."""
    rows, out = result["paths"], []

    def add(target, value, met, note=""):
        out.append({"target": target, "value": value, "met": met, "note": note})

    peaks = {p["shape"]: p for p in result["peaks"]}
    path = {(x["shape"], x["path"]): x for x in rows if x.get("round_s")}

    def products_fraction(shape, libs):
        """The block's products alone, at the fastest of libs in each round, as a fraction of that
        round's peak (median over rounds); None where not timed."""
        p = peaks.get(shape, {})
        times = [p.get("products_round_s", {}).get(lib) for lib in libs]
        times = [t for t in times if t]
        if not times or not p.get("round_gflops"):
            return None
        return statistics.median(p["flop"] / min(col) / 1e9 / g for *col, g in zip(*times, p["round_gflops"]))

    r = paired_ratio(rows, "small", TORCH_PLAIN, "torch-eager")
    plain, torch_products = path.get(("small", TORCH_PLAIN)), peaks.get("small", {}).get("products_round_s", {}).get("torch")
    note = ""
    if plain and torch_products:
        alone = statistics.median(p / t for p, t in zip(plain["round_s"], torch_products))
        note = f"torch-plain takes {alone:.2f}x its products alone in torch (the same kernels eager runs)"
    add("torch-eager >= 1.25x torch-plain (small)", f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})"
        if r else "not measured", r["median"] >= 1.25 if r else None, note)
    for shape in ("small", "large"):
        timed = [x for x in rows if x["shape"] == shape and x.get("peak_fraction") is not None]
        best = max(timed, key=lambda x: x["peak_fraction"]) if timed else None
        alone = products_fraction(shape, PRODUCT_LIBS)
        add(f"fastest path >= 85% of peak ({shape})", f"{best['path']} {100 * best['peak_fraction']:.1f}%"
            if best else "not measured", best["peak_fraction"] >= 0.85 if best else None,
            f"the block's float products alone, in the fastest library: {100 * alone:.1f}%" if alone else "")
    jax = path.get(("large", "jax-jit"))
    bound, value, met, note = products_fraction("large", ("xla",)), "not measured", None, ""
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
    add("jax-jit >= 70% of peak (large)", value, met, note)
    for shape in ("small", "large"):  # the two exports run next to each other in every round
        r = paired_ratio(rows, shape, "ort-opset17", "ort-opset23")
        add(f"ort-opset23 >= ort-opset17 ({shape})", f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})"
            if r else "not measured", r["median"] >= 1.0 if r else None)
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
    add("ort-bitnet-int >= 1.5x ort-bitnet (large)", f"{r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})"
        if r else "not measured", r["median"] >= 1.5 if r else None, note)
    long = (result.get("long_context") or {}).get("rows", {})
    torch_long = long.get("torch-eager", {})
    shape = (result.get("long_context") or {}).get("shape")
    label = "B{} T{} D{} H{}".format(*shape) if shape else "long context"
    add(f"torch-eager peak memory < 1 GB ({label})",
        f"{torch_long['peak_rss_bytes'] / 1e6:.0f} MB" if "peak_rss_bytes" in torch_long else "not measured",
        torch_long["peak_rss_bytes"] < 1e9 if "peak_rss_bytes" in torch_long else None)
    return out


def _mb(value) -> str:
    return f"{value / 1e6:.1f}" if value is not None else "-"


def format_tables(result: dict) -> str:
    lines = [f"threads {result['threads']}; {result['solver']} x {result['steps']} steps, float32 unless f64; "
             f"{result['repeats']} interleaved rounds, bursts of about {result['burst_s']} s; ratios paired per round", ""]
    for peak in result["peaks"]:
        sizes = list(dict.fromkeys(k["size"] for k in peak["kernels"]))
        libs = list(dict.fromkeys(k["library"] for k in peak["kernels"]))
        got = {(k["library"], k["size"]): k["gflops"] for k in peak["kernels"]}
        lines.append(f"float32 matmul GFLOP/s, shape {peak['shape']} (median over rounds; m x k x n):")
        lines.append(f"{'':<12}" + "".join(f"{s:>16}" for s in sizes))
        for lib in libs:
            lines.append(f"{lib:<12}" + "".join(f"{got[lib, s]:>16.1f}" for s in sizes)
                         + ("   (apart from the peak)" if lib not in PEAK_LIBS else ""))
        for what, key in (("peak (best of " + ", ".join(PEAK_LIBS) + ")", "round_gflops"), ("XLA's own", "xla_round_gflops")):
            if peak[key]:
                s = _spread(peak[key])
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
        lines.append("")
    w = max([6] + [len(r["shape"]) for r in result["paths"]]) + 2
    lines.append(f"{'shape':<{w}}{'path':<16}{'median ms':>11}{'min ms':>10}{'setup+first s':>14}{'GFLOP/s':>9}{'% peak':>8}"
                 f"{'vs plain (min..max)':>22}{'peak MB':>9}{'live MB':>9}{'file kB':>9}{'max err':>10}")
    for r in result["paths"]:
        mem = r.get("memory") or {}
        peak_mb = _mb(mem.get("peak_rss_bytes")) if "error" not in mem else "failed"
        if "skipped" in r:
            lines.append(f"{r['shape']:<{w}}{r['path']:<16}skipped: {r['skipped']}")
            continue
        vs = r.get("vs_plain")
        vs = f"{vs['median']:.2f}x ({vs['min']:.2f}..{vs['max']:.2f})" if vs else "-"
        pf = f"{100 * r['peak_fraction']:.1f}%" if r.get("peak_fraction") is not None else "-"
        size = f"{r['file_bytes'] / 1e3:.1f}" if r.get("file_bytes") else "-"
        lines.append(f"{r['shape']:<{w}}{r['path']:<16}{r['median_s'] * 1e3:>11.2f}{r['min_s'] * 1e3:>10.2f}"
                     f"{r['setup_s'] + r['first_call_s']:>14.2f}{r['gflops']:>9.1f}{pf:>8}{vs:>22}{peak_mb:>9}"
                     f"{_mb(mem.get('live_tensor_bytes')):>9}{size:>9}{r['max_rel_error']:>10.2e}")
    lines.append("vs plain: torch-plain's time / the path's (same config; the bitnet rows run use_bitnet); "
                 "peak MB: RSS high-water increase in a fresh process; live MB: torch tensor storages")
    failed = [f"{r['shape']} {r['path']}: {r['memory']['error']}" for r in result["paths"] if "error" in (r.get("memory") or {})]
    lines += [f"memory failed: {f}" for f in failed]
    long = result.get("long_context")
    if long:
        lines += ["", "long context: B{} T{} D{} H{}, one fresh process per path (peak MB as above; forward s: the "
                  "fastest of the {} forward(s) after the first)".format(*long["shape"], long["calls"]),
                  f"{'path':<16}{'peak MB':>10}{'live MB':>10}{'setup+first s':>15}{'forward s':>11}"]
        for name, m in long["rows"].items():
            if "skipped" in m or "error" in m:
                lines.append(f"{name:<16}{'skipped: ' + m['skipped'] if 'skipped' in m else 'failed: ' + m['error']}")
                continue
            fwd = f"{m['call_s']:.2f}" if m.get("call_s") is not None else "-"
            lines.append(f"{name:<16}{_mb(m['peak_rss_bytes']):>10}{_mb(m.get('live_tensor_bytes')):>10}"
                         f"{m['setup_and_first_call_s']:>15.2f}{fwd:>11}")
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
    lines += ["", "targets (ratios from this run):"]
    for t in result["targets"]:
        met = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        lines.append(f"  {t['target']:<52}{t['value']:<36}{met}" + (f"; {t['note']}" if t["note"] else ""))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    from odeattn.plotting import pyplot

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
    names = [p.strip() for p in args.paths.split(",")] if args.paths else list(PATHS)
    bad = [p for p in names if p not in PATHS]
    names = [p for p in PATHS if p in names]  # PATHS' order: the compared paths side by side
    try:
        if bad:
            raise ValueError(f"--paths: unknown {bad}; expected some of {', '.join(PATHS)}")
        if args.plot and (args.no_scaling or args.quick):
            raise ValueError(f"--plot: the plot shows the scaling tables, which {'--quick' if args.quick else '--no-scaling'} "
                             "skips; drop one of them")
        check_output_path("--json", args.json, ".json")
        check_output_path("--plot", args.plot, ".png")
        if args.plot:
            from odeattn.commands.args import require

            require("matplotlib")  # a missing extra is named before the work starts
        named = {shape: name for name, shape in SHAPES.items()}  # a named shape keeps its name (and targets)
        shapes = ({named.get(parse_shape(s), "x".join(map(str, parse_shape(s)))): parse_shape(s) for s in args.shape}
                  if args.shape else QUICK["shapes"] if args.quick else SHAPES)
    except ValueError as err:
        print(f"odeattn bench: {err}", file=sys.stderr)
        return 2
    if args.decode and args.memory:
        print("odeattn bench: --memory: measures training, --decode decoding; drop one of them", file=sys.stderr)
        return 2
    table_only = [o for o, on in (("--long-context", args.long_context), ("--quick", args.quick), ("--paths", args.paths))
                  if on]
    if (args.decode or args.memory) and table_only:
        mode = "--decode" if args.decode else "--memory"
        print(f"odeattn bench: {table_only[0]}: an option of the main table, which {mode} replaces; drop one of them",
              file=sys.stderr)
        return 2
    if args.decode:
        return _cmd_decode(args, threads, log)
    if args.memory:
        return _cmd_memory(args, threads, log)
    repeats = args.repeats or (QUICK["repeats"] if args.quick else DEFAULT_REPEATS)
    burst_s = QUICK["burst_s"] if args.quick else BURST_S
    peak_sizes = QUICK["peak_sizes"] if args.quick else PEAK_SIZES
    result = {"threads": threads, "solver": args.solver, "steps": args.steps, "quick": args.quick, "repeats": repeats,
              "burst_s": burst_s, "paths": [], "peaks": [], "flop_formula": "stages * steps * (8 B T D^2 + 4 B T^2 D)"}
    log(f"peak memory, one fresh process per path and shape ({min(2, threads)} at a time)...")
    memory = memory_table([(n, label, shape) for label, shape in shapes.items() for n in names], args.solver,
                          args.steps, threads, log, parallel=min(2, threads))
    for label, shape in shapes.items():
        log(f"shape {label} {shape} (batch, seq, d_model, heads):")
        got = bench_shape(label, shape, names, solver=args.solver, steps=args.steps, warmup=args.warmup,
                          repeats=repeats, burst_s=burst_s, peak_sizes=peak_sizes, threads=threads, log=log)
        for row in got["rows"]:
            row["memory"] = memory.get((row["path"], label))
        result["paths"] += got["rows"]
        result["peaks"].append(got["peak"])
    result["long_context"] = long_context(names, QUICK["long_shape"] if args.quick else LONG_SHAPE, args.solver,
                                          args.steps, threads, log) if args.long_context else None
    result["scaling"] = None if args.no_scaling or args.quick else scaling(threads, args.warmup, repeats, log)
    result["targets"] = targets(result)
    print(format_tables(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot and result["scaling"]:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def long_context(names, shape, solver: str, steps: int, threads: int, log, calls: int = 1) -> dict:
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
              "decode": bench_decode(contexts, runtimes, solver=args.solver, steps=args.steps, repeats=args.repeats or DEFAULT_REPEATS,
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
            from odeattn.commands.args import require

            require("matplotlib")  # a missing extra is named before the work starts
    except ValueError as err:
        print(f"odeattn bench: {err}", file=sys.stderr)
        return 2
    rows = M.bench_memory(shape, steps, runtimes, solver=args.solver, repeats=args.repeats or DEFAULT_REPEATS, threads=threads, log=log)
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
    p = sub.add_parser("bench", help="time every execution path, interleaved, against a plain PyTorch block and this machine's matmul peak",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], metavar="B,T,D,H",
                   help="benchmark this shape instead of small and large (repeatable)")
    p.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--solver", default="rk4", choices=list(R.SOLVERS))
    p.add_argument("--steps", type=positive_int, default=4)
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed calls after the first, before the rounds")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="interleaved rounds of the main table (default 5, --quick 3); timed calls of the other tables")
    p.add_argument("--quick", action="store_true",
                   help="the main table on the small shape, with fewer rounds and smaller peak matmuls (about a minute)")
    p.add_argument("--long-context", action="store_true",
                   help="add peak memory and one forward's time per path at B1 T8192 D512 H8 (with --quick: B1 T2048 D256 H8)")
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


"""What stops the torch paths on a small shape: one forward's time split by the kind of work, for
torch-eager (the port) and torch-plain (the block written plainly), from torch's profiler.

    python benchmarks/torch_floor.py [--shape 1,128,256,8] [--forwards 20] [--threads 2]

Each path's forward is timed alone first (the median of `forwards` calls, no profiler), then
profiled over the same number of calls; every operator's self time (its own work, not its
children's) is put in one kind by its name (KINDS, first match), and each kind's share of the
profiled total is printed beside the operator count of one forward. The profiler adds a few
microseconds to every operator, so the shares overstate the small operators somewhat; the count
times a trivial operator's own cost (timed here, `torch.add` of two one-element tensors) is the
dispatch floor: what a forward costs with its arithmetic free.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import ode_ref as R
from odeattn.backends.torch import ODEAttentionBlock
from odeattn.bench.baseline import plain_torch_block

KINDS = (  # (kind, operator names or name prefixes), the first match wins
    ("GEMM (projections)", ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::linear")),
    ("attention (fused SDPA)", ("aten::_scaled_dot_product_flash_attention_for_cpu",)),
    ("attention (bmm, softmax)", ("aten::bmm", "aten::_softmax", "aten::softmax")),
    ("norms", ("aten::native_layer_norm", "aten::_fused_rms_norm", "aten::layer_norm")),
    ("reductions (finiteness checks, norms' scale)", ("aten::sum", "aten::isfinite", "aten::amax", "aten::max",
                                                      "aten::min", "aten::abs", "aten::ne", "aten::eq", "aten::item",
                                                      "aten::_local_scalar_dense")),
    ("elementwise (Runge-Kutta sums, masks, scale)", ("aten::add", "aten::mul", "aten::sub", "aten::div",
                                                      "aten::where", "aten::masked_fill", "aten::copy_",
                                                      "aten::_to_copy", "aten::fill_", "aten::exp2", "aten::ldexp")),
)
OTHER = "the rest (views, allocation, dispatch)"


def kind_of(name: str) -> str:
    return next((kind for kind, names in KINDS if any(name == n or name.startswith(n + ".") for n in names)), OTHER)


def median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def trivial_op_us(calls: int = 20000) -> float:
    a, b = torch.ones(1), torch.ones(1)
    for _ in range(1000):
        torch.add(a, b)
    start = time.perf_counter()
    for _ in range(calls):
        torch.add(a, b)
    return 1e6 * (time.perf_counter() - start) / calls


def split(fn, forwards: int) -> tuple[dict, int]:
    """({kind: profiled self ms per forward}, operators per forward)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(forwards):
            fn()
    per_kind, count = defaultdict(float), Counter()
    for event in prof.key_averages():
        per_kind[kind_of(event.key)] += event.self_cpu_time_total / 1e3 / forwards
        count[event.key] += event.count
    return dict(per_kind), sum(count.values()) // forwards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1,128,256,8", help="B,T,D,H (default: the bench's small shape)")
    p.add_argument("--forwards", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    batch, seq, d_model, heads = (int(v) for v in args.shape.split(","))
    torch.set_num_threads(args.threads)
    config = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver="rk4", ode_steps=4)
    params = R.init_params(config, seed=0)
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(batch, seq, d_model)).astype(np.float32))
    paths = {"torch-eager": ODEAttentionBlock.from_params(config, params), "torch-plain": plain_torch_block(config, params)}
    op_us = trivial_op_us()
    print(f"B{batch} T{seq} D{d_model} H{heads}, rk4 x 4 steps, float32, {args.threads} threads; "
          f"a trivial operator: {op_us:.2f} us")
    with torch.no_grad():
        for name, block in paths.items():
            fn = lambda block=block: block(x)  # noqa: E731
            for _ in range(3):
                fn()
            wall = median_ms(fn, args.forwards)
            kinds, ops = split(fn, args.forwards)
            total = sum(kinds.values())
            print(f"\n{name}: {wall:.2f} ms a forward unprofiled; {ops} operators a forward, whose dispatch alone "
                  f"is {ops * op_us / 1e3:.2f} ms ({100 * ops * op_us / 1e3 / wall:.0f}%)")
            for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
                print(f"  {kind:<48}{100 * ms / total:5.1f}%")


if __name__ == "__main__":
    main()

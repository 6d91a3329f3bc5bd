"""`bench --decode`: the next token at a context of n tokens, a cached decode step against
recomputing the block on all n, per runtime (torch, jax, ort).

The two ways of one runtime are interleaved in short bursts so that the machine's drift hits
both alike; the ratio of their medians is the speed-up.
"""

from __future__ import annotations

import statistics

import numpy as np

import ode_ref as R

from .timing import interleaved_times

DECODE_RUNTIMES = ("torch", "jax", "ort")
DECODE_CONTEXTS = (128, 512, 2048)
DECODE_SHAPE = (1, 256, 8)  # batch, d_model, heads
DECODE_BURST = {"cached": 5, "recompute": 1}  # a burst of each lasts about as long


def _torch_paths(config, params, x32, threads: int):
    import torch

    from odeattn.backends.torch import ODEAttentionBlock

    n = x32.shape[1]
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


def _jax_paths(config, ps, x32):
    from odeattn.backends import jax as J

    _, cache = J.prefill(ps, x32[:, :-1], config, max_len=x32.shape[1])
    x_t = J.block.jnp.asarray(x32[:, -1:])
    return (lambda: J.decode_step(ps, x_t, cache, config)[0].block_until_ready(),
            lambda: J.ode_block_jit(ps, x32, config).block_until_ready())


def _ort_paths(config, params, ps, x32, threads: int):
    """The decode-step model fed through OnnxDecoder (only z fetched), and the block's export."""
    from odeattn.export.block import export_decode_model, export_model
    from odeattn.export.decode import OnnxCache, OnnxDecoder
    from odeattn.export.runtime import session

    _, cache = R.prefill(ps, x32[:, :-1], config, max_len=x32.shape[1])  # the spec's cache, float32
    feed = OnnxDecoder(config).step_feed(x32[:, -1:], OnnxCache.from_spec(cache))
    dec = session(export_decode_model(config, params), threads=threads)
    blk = session(export_model(config, params, padding_mask=False), threads=threads)
    return (lambda: dec.run(["z"], feed)), (lambda: blk.run(["z"], {"x": x32}))


def decode_paths(runtime: str, config, params, x, threads: int):
    """(cached step, recompute), zero-argument callables on `runtime` for context n = x.shape[1]:
    the step decodes token n - 1 from a cache of the n - 1 before it (the same step, replayed:
    the cache is immutable); the recompute runs the block on all n tokens."""
    x32 = x.astype(np.float32)
    ps = {k: v.astype(np.float32) for k, v in params.items()}
    if runtime == "torch":
        return _torch_paths(config, params, x32, threads)
    if runtime == "jax":
        return _jax_paths(config, ps, x32)
    if runtime == "ort":
        return _ort_paths(config, params, ps, x32, threads)
    raise ValueError(f"runtime: unknown {runtime!r}; expected one of {', '.join(DECODE_RUNTIMES)}")


def decode_config(solver: str, steps: int) -> R.ODEConfig:
    """The decoder block --decode times: DECODE_SHAPE's width, RoPE."""
    _, d_model, heads = DECODE_SHAPE
    return R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver=solver, ode_steps=steps, mode="decoder",
                       ode_use_pe=True, positional_encoding="rope")


def bench_decode(contexts, runtimes, *, solver: str, steps: int, repeats: int, threads: int, log) -> list[dict]:
    """One row per (context, runtime): cached and recompute medians, tokens/s, speed-up, cache size."""
    batch, d_model, _ = DECODE_SHAPE
    config = decode_config(solver, steps)
    params = R.init_params(config, seed=0)
    rows = []
    for n in contexts:
        x = np.random.default_rng(n).normal(size=(batch, n, d_model))
        for runtime in runtimes:
            try:
                step, full = decode_paths(runtime, config, params, x, threads)
            except ImportError as err:
                log(f"  {runtime}: skipped ({err})")
                continue
            step(), full()  # compile and warm both
            times = interleaved_times({"cached": step, "recompute": full}, repeats=repeats, burst=DECODE_BURST)
            cached, recompute = statistics.median(times["cached"]), statistics.median(times["recompute"])
            rows.append({"context": n, "runtime": runtime, "cached_s": cached, "recompute_s": recompute,
                         "cached_tokens_per_s": batch / cached, "recompute_tokens_per_s": batch / recompute,
                         "speedup": recompute / cached,
                         "cache_mb": R.cache.cache_values(config, batch, n) * 4 / 1e6})
            log(f"  context {n} {runtime:<6} cached {cached * 1e3:8.2f} ms, recompute {recompute * 1e3:9.2f} ms")
    return rows


def decode_result(contexts, runtimes, *, solver: str, steps: int, repeats: int, threads: int, log) -> dict:
    """What `bench --decode --json` writes: the settings and bench_decode's rows."""
    return {"threads": threads, "solver": solver, "steps": steps, "shape": DECODE_SHAPE,
            "decode": bench_decode(contexts, runtimes, solver=solver, steps=steps, repeats=repeats, threads=threads, log=log)}

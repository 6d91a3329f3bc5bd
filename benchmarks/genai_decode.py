"""One decode step at a context of n tokens in ONNX Runtime on the CPU: today's decode-step model
(export_decode_model, its fixed-size cache written with Where, out of place), the GenAI folder's
concat form (each present array the past one with the token appended) and its shared-buffer form
(TensorScatter and Attention-24 writing GenAI's max_length buffers in place).

    python benchmarks/genai_decode.py [--contexts 128 512 2048] [--rounds 7] [--calls 5] [--threads 2]

The block is `odeattn bench --decode`'s (batch 1, d_model 256, 8 heads, rk4 x 4 steps, RoPE,
float32): 16 evaluations of f, so 16 cache layers of K and V. The language model around it has one
block and a vocabulary of 64 (its embedding and head cost little beside the block). The shared
form runs as GenAI runs it, each present output bound to its past input's buffer (IOBinding),
the token written at slot n - 1 of n; every step is replayed on the same buffers (the same slot
written again). Method (as benchmarks/opset_forms.py): rounds, each path once to wake the threads
then `calls` timed calls, the median per round; a ratio is today's time over the form's within a
round, printed as the median over the rounds with its min..max.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import ode_ref as R
from odeattn.bench.decode import DECODE_SHAPE
from odeattn.bench.timing import interleaved_times
from odeattn.export.block import export_decode_model
from odeattn.export.decode import OnnxCache, OnnxDecoder
from odeattn.export.genai import PAST, PRESENT, cache_layers, export_genai_model
from odeattn.export.runtime import session


def paths(n: int, threads: int) -> dict:
    """{path: a zero-argument callable running one decode step at context n}."""
    import onnxruntime as ort

    batch, d_model, heads = DECODE_SHAPE
    cfg = R.LMConfig(vocab_size=64, num_layers=1, hidden_size=d_model, num_heads=heads, ode_solver="rk4", ode_steps=4,
                     ode_use_pe=True, positional_encoding="rope")
    block = cfg.block_config
    params = R.init_lm_params(cfg, seed=0)
    layers, hd = cache_layers(cfg), block.head_dim
    rng = np.random.default_rng(n)

    bp = {k[len("blocks.0."):]: v for k, v in params.items() if k.startswith("blocks.0.")}
    x = rng.normal(size=(batch, n, d_model)).astype(np.float32)
    _, cache = R.prefill({k: v.astype(np.float32) for k, v in bp.items()}, x[:, :-1], block, max_len=n)
    feed = OnnxDecoder(block).step_feed(x[:, -1:], OnnxCache.from_spec(cache))
    today = session(export_decode_model(block, bp), threads=threads)

    token, mask = np.array([[5]], np.int64), np.ones((batch, n), np.int64)
    kv = lambda seq: rng.normal(size=(batch, heads, seq, hd)).astype(np.float32)  # noqa: E731
    concat = session(export_genai_model(cfg, params), threads=threads)
    concat_feed = {"input_ids": token, "attention_mask": mask,
                   **{PAST % e + name: kv(n - 1) for e in range(layers) for name in ("key", "value")}}

    shared = session(export_genai_model(cfg, params, shared_buffer=True), threads=threads)
    binding = shared.io_binding()
    binding.bind_cpu_input("input_ids", token)
    binding.bind_cpu_input("attention_mask", mask)
    buffers = []
    for e in range(layers):
        for name in ("key", "value"):
            buffer = ort.OrtValue.ortvalue_from_numpy(kv(n))
            buffers.append(buffer)  # kept alive while the binding uses it
            binding.bind_ortvalue_input(PAST % e + name, buffer)
            binding.bind_ortvalue_output(PRESENT % e + name, buffer)
    binding.bind_output("logits", "cpu")

    return {"today": lambda: today.run(["z"], feed),
            "concat": lambda: concat.run(["logits"], concat_feed),
            "shared": lambda: shared.run_with_iobinding(binding)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    print(f"one decode step, batch 1, d_model {DECODE_SHAPE[1]}, {DECODE_SHAPE[2]} heads, rk4 x 4 steps, RoPE; "
          f"{args.rounds} rounds x {args.calls} calls, {args.threads} threads")
    for n in args.contexts:
        fns = paths(n, args.threads)
        for fn in fns.values():
            fn()
        rounds = {k: [] for k in fns}
        for _ in range(args.rounds):  # each round: every path, its median over `calls` calls
            times = interleaved_times(fns, repeats=1, burst=args.calls)
            for k, t in times.items():
                rounds[k].append(statistics.median(t))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        line = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items())
        for form in ("concat", "shared"):
            ratios = [a / b for a, b in zip(rounds["today"], rounds[form])]
            line += f"; today / {form} {statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"
        print(f"context {n}: {line}", flush=True)


if __name__ == "__main__":
    main()

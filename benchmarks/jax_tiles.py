"""JAX on the CPU: attention over tiles of heads (backends/jax/attention.py, tiled) against the
untiled form, and against XLA's products alone. The figures beside SCORE_TILE_BYTES come from
this script.

    python benchmarks/jax_tiles.py [--shape large] [--rounds 5]

The block (rk4, 4 steps, float32, jax-jit) with the default attention (SCORE_TILE_BYTES), with
tiles of two heads, and untiled; beside them the block's products alone in XLA (odeattn bench's
product_chain). Timed as odeattn bench times its paths (bench.interleave: rounds, each entry in
turn, the start rotating); printed per entry: the median over rounds of its time, and of its
speed against the untiled block and against the products alone, paired per round (min..max).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import ode_ref as R
from odeattn.backends.jax import ode_block_jit
from odeattn.backends.jax.attention import SCORE_TILE_BYTES, SelfAttention
from odeattn.bench import (CHAIN_ARGS, SHAPES, Timed, first_and_warm, interleave, product_chain, product_operands,
                           round_medians)


PRODUCTS = "XLA's products alone"


def entries(shape) -> list[Timed]:
    batch, seq, d_model, heads = shape
    cfg = R.ODEConfig(hidden_size=d_model, num_heads=heads, ode_solver="rk4", ode_steps=4)
    params = {k: jnp.asarray(v, jnp.float32) for k, v in R.init_params(cfg, seed=0).items()}
    x = jnp.asarray(np.random.default_rng(0).normal(size=(batch, seq, d_model)), jnp.float32)
    head = batch * seq * seq * 4  # one head's float32 scores over the batch
    forms = {f"tiles of {SCORE_TILE_BYTES // 2**20} MiB (default)": SCORE_TILE_BYTES, "tiles of two heads": 2 * head,
             "untiled": 2**62}
    fns = {name: (lambda a=SelfAttention(cfg).with_tiles(size): ode_block_jit(params, x, cfg, attention=a).block_until_ready())
           for name, size in forms.items()}
    ops = product_operands(shape)
    chain, operands = jax.jit(product_chain, static_argnums=(7,)), [jnp.asarray(ops[k]) for k in CHAIN_ARGS]
    fns[PRODUCTS] = lambda: jax.block_until_ready(chain(*operands, 4 * 4))
    # the first call compiles; the warm one's time sizes the first burst
    return [Timed(name, fn, 0.0, first_and_warm(fn, 1)[2]) for name, fn in fns.items()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="large")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    timed = entries(SHAPES[args.shape])
    interleave(timed, args.rounds, burst_s=0.25)
    medians = {e.name: round_medians(e) for e in timed}

    def paired(name, base):
        ratios = [b / t for b, t in zip(medians[base], medians[name])]
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"

    print(f"jax-jit, shape {args.shape} {SHAPES[args.shape]}, rk4 x 4 steps, float32, {args.rounds} rounds")
    print(f"{'':32}{'median ms':>10}  {'vs untiled':>20}  {'vs products alone':>20}")
    for e in timed:
        print(f"{e.name:32}{1e3 * statistics.median(medians[e.name]):10.1f}  {paired(e.name, 'untiled'):>20}  "
              f"{paired(e.name, PRODUCTS):>20}")


if __name__ == "__main__":
    main()

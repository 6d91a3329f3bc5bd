"""Runs ode_block and its gradient sharded over 2 host devices; test_sharding.py runs it in a
process of its own, since XLA's host device count is read once, when JAX starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python sharded_run.py OUT.npz

It writes, per case and per layout (batch, heads): z(1), the gradients of the loss (cases())
with respect to every parameter and x, each array's shard shape, and the compiled programs'
collectives (JSON in the npz's "report" entry); for batch_psum (batch_parallel_grad) the
parameters' gradients and the collectives.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import ode_ref as R
from odeattn.backends.jax import SelfAttention, ode_block
from odeattn.backends.jax import sharding as S
from odeattn.conformance.adapters import jax_with_cache


def cases():
    """[(name, config, params, x (4, 6, 16), padding_mask, w)]; the loss is sum(w * z(1)). One
    config covers the decoder mask, padding, RoPE and the gated solver's gate (each compile of
    the gradient costs seconds, so the cases are few)."""
    cfg = R.ODEConfig(hidden_size=16, num_heads=4, norm_type="derf", ode_solver="rk2_gated", ode_steps=2,
                      mode="decoder", ode_use_pe=True, positional_encoding="rope")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 16))
    mask = np.ones((4, 6), bool)
    mask[1, 4:] = mask[3, 2:] = False  # padded rows in both halves of the batch
    return [("decoder_rope_rk2_gated", cfg, R.init_params(cfg, 1, perturb_norms=True), x, mask, rng.normal(size=x.shape))]


def value_and_grads(block, params, x, mask, w, config):
    """(z(1), d loss / d params, d loss / d x) of loss = sum(w * block(params, x, config, mask))."""
    z = block(params, x, config, mask)
    g_p, g_x = jax.grad(lambda p, x: jnp.sum(w * block(p, x, config, mask)), argnums=(0, 1))(params, x)
    return z, g_p, g_x


def run(name, cfg, params, x, mask, w, layout):
    """The arrays and the report of one case sharded by layout ('batch' or 'heads')."""
    mesh = S.make_mesh(layout)
    if layout == S.BATCH:
        args, block = S.shard_batch(params, x, mask, mesh), ode_block
    else:
        args, block = S.shard_heads(params, x, mask, mesh, cfg), S.ode_block_heads
    fn = jax.jit(value_and_grads, static_argnums=(0, 5))
    lowered = fn.lower(block, *args, w, cfg)
    compiled = lowered.compile()
    z, g_p, g_x = compiled(*args, w)
    if layout == S.HEADS:
        g_p = S.merge_heads(g_p, cfg)
    arrays = {f"{name}/{layout}/z": z, f"{name}/{layout}/grad/x": g_x}
    arrays.update({f"{name}/{layout}/grad/{k}": v for k, v in g_p.items()})
    tiles = SelfAttention(cfg).with_tiles(one_head(x))  # attention over tiles of one head each
    report = {
        "shards": {k: list(v.addressable_shards[0].data.shape) for k, v in [("x", args[1]), *args[0].items()]},
        # batch: its gradient's program, which holds the forward too, shows all it communicates
        "forward": S.collectives(jax.jit(block, static_argnums=2).lower(args[0], args[1], cfg, args[2])
                                 .compile().as_text()) if layout == S.HEADS else None,
        "with_grad": S.collectives(compiled.as_text()),
        # attention.tiled over one head a tile: a loop over the heads
        "tiled_forward": S.collectives(jax.jit(lambda p, x, m: block(p, x, cfg, m, attention=tiles))
                                       .lower(*args).compile().as_text()),
    }
    return {k: np.asarray(v) for k, v in arrays.items()}, report


def one_head(x) -> int:
    """Bytes of one head's scores over the batch: a tile of one head."""
    batch, seq = x.shape[:2]
    return batch * seq * seq * x.dtype.itemsize


def run_psum(name, cfg, params, x, mask, w):
    """batch_parallel_grad's gradient of the loss and its report (layout 'batch_psum')."""
    mesh = S.make_mesh(S.BATCH)
    params, x, mask = S.shard_batch(params, x, mask, mesh)
    loss = lambda p, b: jnp.sum(b[2] * ode_block(p, b[0], cfg, b[1]))  # noqa: E731  (a sum over rows)
    compiled = jax.jit(S.batch_parallel_grad(loss, mesh)).lower(params, (x, mask, w)).compile()
    g_p = compiled(params, (x, mask, w))
    arrays = {f"{name}/batch_psum/grad/{k}": np.asarray(v) for k, v in g_p.items()}
    return arrays, {"with_grad": S.collectives(compiled.as_text())}


def main(path):
    assert jax.device_count() == 2, jax.devices()
    jax_with_cache()  # as every test process: a second run reads the sharded programs from the cache
    arrays, report = {}, {}
    with jax.enable_x64(True):
        for case in cases():
            for layout in (S.BATCH, S.HEADS):
                a, r = run(*case, layout)
                arrays.update(a)
                report[f"{case[0]}/{layout}"] = r
            a, report[f"{case[0]}/batch_psum"] = run_psum(*case)
            arrays.update(a)
    np.savez(path, report=np.asarray(json.dumps(report)), **arrays)


if __name__ == "__main__":
    main(sys.argv[1])

"""ode_block over several devices with jax.sharding: data parallel and head (tensor) parallel.

    make_mesh(axis, devices=None)                   a 1-D Mesh
    shard_batch(params, x, padding_mask, mesh)      data parallel: x and the mask split by batch rows,
                                                    every parameter replicated
    shard_heads(params, x, padding_mask, mesh, config)
                                                    tensor parallel: the qkv and out_proj weights
                                                    split by heads, x and the mask replicated
    ode_block_heads(params, x, config, padding_mask=None)
                                                    ode_block on parameters in the head layout
    batch_parallel_grad(loss, mesh)                 data parallel by hand: each device's gradient,
                                                    then one all-reduce of them (shard_map, psum)
    collectives(hlo_text)                           the collectives of a compiled program

Nothing here changes the block: jax.jit runs ode_block on sharded arrays and XLA inserts the
communication (collectives() lists it).

Data parallel under jit: the replicated parameters' gradient is reduced inside the backward
loops, one all-reduce of every ode_func parameter's gradient per evaluation of f (the stage
loop's body) and one of the gate's per step (ode_steps x (stages x ode_func parameters + gate
parameters) values in all). batch_parallel_grad reduces once, after the backward pass: the parameters' size.

Head parallel: each device evaluates its own heads; the out_proj product then leaves partial
sums, one all-reduce of (batch, seq, d_model) per evaluation of f. The qkv weight's spec layout
is (3 d_model, d_model) with q, k and v blocks, so one device's heads are not one block of rows:
it is stored here as (3, heads, head_dim, d_model), split on the heads axis, and reshaped back
in ode_block_heads; XLA gathers that weight before the loop (the reshape has no head-split
sharding).

The same code runs across hosts: after jax.distributed.initialize(), jax.devices() lists every
host's devices and a Mesh over them shards the same way.
"""

from __future__ import annotations

import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ode_ref.config import ODEConfig
from ode_ref.params import OUT_PROJ, QKV

from .block import ode_block

BATCH, HEADS = "batch", "heads"
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def make_mesh(axis: str, devices=None) -> Mesh:
    """A 1-D mesh named axis over devices (default: every device, on every host)."""
    return Mesh(np.asarray(jax.devices() if devices is None else devices), (axis,))


def _put(a, mesh: Mesh, *spec):
    """a placed on mesh, split as PartitionSpec(*spec) says (no spec: replicated)."""
    return jax.device_put(a, NamedSharding(mesh, PartitionSpec(*spec)))


def shard_batch(params: dict, x, padding_mask, mesh: Mesh, axis: str = BATCH):
    """(params, x, padding_mask) for data parallel: x (batch, seq, d_model) and the mask (batch,
    seq) split by batch rows over axis, the parameters replicated. batch % devices == 0."""
    _check_divides(x.shape[0], mesh, axis, "batch")
    mask = None if padding_mask is None else _put(padding_mask, mesh, axis)
    return {k: _put(v, mesh) for k, v in params.items()}, _put(x, mesh, axis), mask


def split_heads(params: dict, config) -> dict:
    """params with the qkv weight (3 d_model, d_model) as (3, heads, head_dim, d_model)."""
    cfg = ODEConfig.from_any(config)
    return {**params, QKV: params[QKV].reshape(3, cfg.num_heads, cfg.head_dim, cfg.hidden_size)}


def merge_heads(params: dict, config) -> dict:
    """split_heads undone: the qkv weight back to the spec's (3 d_model, d_model)."""
    cfg = ODEConfig.from_any(config)
    return {**params, QKV: params[QKV].reshape(3 * cfg.hidden_size, cfg.hidden_size)}


def shard_heads(params: dict, x, padding_mask, mesh: Mesh, config, axis: str = HEADS):
    """(params in the head layout, x, padding_mask) for head parallel: the qkv weight (3, heads,
    head_dim, d_model) split on heads, out_proj (d_model, d_model) split by columns (heads x
    head_dim), the rest replicated. heads % devices == 0."""
    cfg = ODEConfig.from_any(config)
    _check_divides(cfg.num_heads, mesh, axis, "num_heads")
    split = {QKV: (None, axis), OUT_PROJ: (None, axis)}
    placed = {k: _put(v, mesh, *split.get(k, ())) for k, v in split_heads(params, cfg).items()}
    return placed, _put(x, mesh), None if padding_mask is None else _put(padding_mask, mesh)


def ode_block_heads(params: dict, x, config, padding_mask=None, **kwargs):
    """ode_block on parameters in the head layout (split_heads); jit it with config static."""
    return ode_block(merge_heads(params, config), x, config, padding_mask, **kwargs)


def batch_parallel_grad(loss, mesh: Mesh, axis: str = BATCH):
    """(params, batch) -> the gradient of loss(params, batch) with respect to params, replicated.

    loss must be a sum over batch rows (a mean: divide by the global batch size inside it).
    Every array of the pytree batch is split on its axis 0 over mesh's axis; each device takes
    the gradient on its rows, then one psum (all-reduce) adds them up. check_vma=False: with
    JAX's replication checking on, the gradient of the replicated params is summed where they
    are used, inside the step loop, as under plain jit."""

    def local(params, batch):
        return jax.lax.psum(jax.grad(loss)(params, batch), axis)

    return jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(axis)),
                         out_specs=PartitionSpec(), check_vma=False)


def _check_divides(n: int, mesh: Mesh, axis: str, name: str) -> None:
    if n % mesh.shape[axis]:
        raise ValueError(f"{name}: expected a multiple of the {mesh.shape[axis]} devices on axis {axis!r}; got {n}")


_OP = re.compile(r"= (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_ARRAY = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")


_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) ")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")


def collectives(hlo_text: str) -> list[dict]:
    """The collectives of a compiled program (jit(f).lower(...).compile().as_text()), in order:
    [{"op": "all-reduce", "shapes": [[4, 6, 16]], "elements": 384, "in_loop": True}, ...].
    in_loop: the op is in a while loop's body (the scan over the steps or the stages)."""
    bodies = set(_BODY.findall(hlo_text))
    found, computation = [], None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = _COMPUTATION.match(line)
            computation = m.group(1) if m else None
        m = _OP.search(line)
        if m is None:
            continue
        shapes = [[int(n) for n in dims.split(",") if n] for _, dims in _ARRAY.findall(m.group(1))]
        found.append({"op": m.group(2), "shapes": shapes, "elements": int(sum(np.prod(s) for s in shapes)),
                      "in_loop": computation in bodies})
    return found

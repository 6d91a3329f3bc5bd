"""Data-parallel training of ODE blocks with torch.nn.parallel.DistributedDataParallel.

    host_store(world_size)                           the rendezvous, on a free loopback port, held
                                                      by the process that starts the ranks
    with process_group(rank, world_size, port):      gloo, meeting at host_store's port; the ranks
                                                      tear it down together on leaving
    ode_model(config, layers, out_features)          ODE blocks then a linear head
    data_parallel(model)                             (DDP-wrapped model, the list it records
                                                      each gradient all-reduce's size in)
    sgd_step(model, x, target, lr)                   one step of plain SGD on the mean squared error

Past one machine, only the rendezvous changes: under torchrun (or any launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT) call dist.init_process_group(backend) instead of
entering process_group here, and the rest trains across nodes unchanged. What it communicates
per step: one all-reduce of every parameter's gradient (averaged), in buckets; DDP also
broadcasts rank 0's parameters once, when it wraps the model.
"""

from __future__ import annotations

import contextlib
import datetime
import gc

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from .block import ODEAttentionBlock


def host_store(world_size: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """The store the ranks meet through: a TCPStore on a free port of 127.0.0.1, hosted by the
    calling process, which starts the ranks and outlives them; pass its .port to each rank. Not
    a store in rank 0 (the tcp:// default: a rank still tearing down after rank 0 exits waits on
    a store that is gone) nor a file (a rank that deletes the FileStore's file on its way out
    leaves the other waiting for it)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


@contextlib.contextmanager
def process_group(rank: int, world_size: int, port: int, backend: str = "gloo", timeout_s: float = 60.0):
    """A with-block in which this process is rank `rank` of a group of world_size processes on
    this machine, meeting at the store host_store put on `port`. A collective or rendezvous that
    waits longer than timeout_s for another rank raises.

    Leaving the block normally, the ranks tear the group down together: a barrier, then the
    group destroyed with nothing else holding it (a DistributedDataParallel model made inside the
    block must be gone by then: make it in a function called inside the block), then every rank
    waits at the store until all have. A group whose last reference went at interpreter exit,
    after another rank had already exited, was seen to hang that rank's exit."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        yield
        gc.collect()  # a DDP model in a reference cycle would keep the group alive past destroy
        dist.barrier()
    finally:
        dist.destroy_process_group()
    store.set(f"torn_down/{rank}", "1")
    store.wait([f"torn_down/{r}" for r in range(world_size)])  # raises after timeout_s


def ode_model(config, layers: int = 2, out_features: int = 1) -> nn.Sequential:
    """layers ODEAttentionBlocks then Linear(d_model -> out_features):
    (batch, seq, d_model) -> (batch, seq, out_features). Seed torch first for equal weights."""
    blocks = [ODEAttentionBlock(config) for _ in range(layers)]
    return nn.Sequential(*blocks, nn.Linear(blocks[0].config.hidden_size, out_features))


def data_parallel(model: nn.Module) -> tuple[DistributedDataParallel, list[int]]:
    """(model under DDP, sizes): each gradient all-reduce appends its bucket's element count to
    sizes, then runs DDP's default all-reduce (sum, divided by the world size)."""
    ddp = DistributedDataParallel(model)
    sizes: list[int] = []

    def recording_allreduce(state, bucket):
        sizes.append(bucket.buffer().numel())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, recording_allreduce)
    return ddp, sizes


def sgd_step(model: nn.Module, x, target, lr: float) -> float:
    """One step of SGD (no momentum) on mean((model(x) - target)^2); returns the loss. The
    gradients stay in each parameter's .grad (averaged over processes under DDP)."""
    model.zero_grad(set_to_none=True)
    loss = torch.mean((model(x) - target) ** 2)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return loss.item()

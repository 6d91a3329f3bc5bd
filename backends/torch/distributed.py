"""Data-parallel training of ODE blocks with torch.nn.parallel.DistributedDataParallel.

    init_process_group(rank, world_size, rendezvous) gloo, meeting through a file on this machine
    ode_model(config, layers, out_features)          ODE blocks then a linear head
    data_parallel(model)                             (DDP-wrapped model, the list it records
                                                      each gradient all-reduce's size in)
    sgd_step(model, x, target, lr)                   one step of plain SGD on the mean squared error

Past one machine, only the rendezvous changes: under torchrun (or any launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT) call dist.init_process_group(backend) instead of
init_process_group here, and the rest trains across nodes unchanged. What it communicates
per step: one all-reduce of every parameter's gradient (averaged), in buckets; DDP also
broadcasts rank 0's parameters once, when it wraps the model.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from .block import ODEAttentionBlock


def init_process_group(rank: int, world_size: int, rendezvous, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Join a process group of world_size processes on this machine, meeting through the file
    `rendezvous` (absent or empty at first; torch's FileStore). A file, not a TCP store: a TCP
    store lives in rank 0's process, so a rank still tearing its group down when rank 0 has exited
    could wait forever. A collective that waits longer than timeout_s for another rank raises."""
    dist.init_process_group(backend, init_method=f"file://{os.fspath(rendezvous)}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


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

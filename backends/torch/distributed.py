"""Data-parallel training of ODE blocks with torch.nn.parallel.DistributedDataParallel.

    free_port()                                      a free TCP port on localhost
    init_process_group(rank, world_size, port)       gloo, MASTER_ADDR 127.0.0.1
    ode_model(config, layers, out_features)          ODE blocks then a linear head
    data_parallel(model)                             (DDP-wrapped model, the list it records
                                                      each gradient all-reduce's size in)
    sgd_step(model, x, target, lr)                   one step of plain SGD on the mean squared error

Nothing here is specific to one machine: under torchrun (or any launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT) the same code trains across nodes. What it communicates
per step: one all-reduce of every parameter's gradient (averaged), in buckets; DDP also
broadcasts rank 0's parameters once, when it wraps the model.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from .block import ODEAttentionBlock


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world_size: int, port: int, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Join a process group of world_size processes on this machine (localhost only). A collective
    that waits longer than timeout_s for another rank raises instead of hanging."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


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

"""`odeattn demo train`: a tiny training run of the PyTorch block with three solvers, on CPU.

The task (delay): each token of a random sequence outputs the token just before it; the first
position has none and is not scored. A token cannot see its neighbour but through attention, and
only RoPE (ode_use_pe) tells it which key is its neighbour, so the block must learn to attend.

The model: token embedding -> one ODEAttentionBlock (float32, encoder mode, RoPE) -> linear head.
euler, rk4 and rk2_gated train the same model: the same d_model and heads, the same initial
weights (the head and embedding are drawn before the block, the block's own weights before the
gate), the same batches (a data generator of their own, seeded by --seed) and the same optimiser
(Adam). The stages of euler and rk4 share one set of weights, so their parameter counts are equal;
rk2_gated adds its gate, 2 d_model + 1 parameters, and the output says how many that is.

It shows that each solver trains; it is not a claim about which solver is better: one small task,
one seed, a few hundred steps.

With blocks="layer" (--blocks layer) the block is the ODE Transformer's instead: token and learned
position embeddings -> one ODEEncoder block whose F is a whole pre-norm encoder layer (attention and
FFN) -> head, residual (euler) against the learnable RK2 (rk2_gated), at equal parameter count:
the gate's 2 d_model + 1 parameters are exactly what one more FFN unit costs (fc1 a row and a bias,
fc2 a column), so the residual layer gets ffn_dim + 1. The embeddings and head are drawn first, so
both start from the same ones; the layers differ in shape, so their weights are drawn apart.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import ode_ref as R

SOLVERS = ("euler", "rk4", "rk2_gated")
LAYER_FAMILIES = ("euler", "rk2_gated")  # blocks="layer": the ODE Transformer's residual and learnable RK2 blocks
BLOCKS = ("attention", "layer")


@dataclasses.dataclass(frozen=True)
class Task:
    """The sizes of the demo: data, model and optimiser."""

    vocab: int = 32
    seq: int = 12
    batch: int = 32
    d_model: int = 32
    heads: int = 2
    ode_steps: int = 1
    lr: float = 3e-3
    ffn_dim: int = 64  # blocks="layer": the rk2_gated layer's FFN width (the residual one's is one more)

    def config(self, solver: str) -> R.ODEConfig:
        """The block's config for `solver`: encoder mode, RoPE, no dropout."""
        return R.ODEConfig(hidden_size=self.d_model, num_heads=self.heads, ode_solver=solver,
                           ode_steps=self.ode_steps, mode="encoder", ode_use_pe=True, positional_encoding="rope")


def build_model(task: Task, solver: str, seed: int):
    """embedding -> ODEAttentionBlock -> head, float32. The embedding and head are drawn first and
    the block's attention weights before its gate, so every solver starts from the same shared weights."""
    import torch
    from torch import nn

    from odeattn.backends.torch import ODEAttentionBlock

    torch.manual_seed(seed)
    embedding = nn.Embedding(task.vocab, task.d_model)
    head = nn.Linear(task.d_model, task.vocab)
    block = ODEAttentionBlock(task.config(solver))
    return nn.Sequential(embedding, block, head)


def encoder_config(task: Task, family: str) -> R.ODEEncoderConfig:
    """blocks="layer": one pre-norm ODE Transformer block of `family`; euler's FFN is one unit
    wider, which costs exactly rk2_gated's gate (2 d_model + 1 parameters)."""
    extra = 0 if family == "rk2_gated" else 1
    return R.ODEEncoderConfig(task.d_model, task.heads, task.ffn_dim + extra, encoder_layers=1,
                              encoder_normalize_before=True, family=family)


def build_layer_model(task: Task, family: str, seed: int):
    """token + position embeddings -> ODEEncoder -> head, float32; the embeddings and head drawn first."""
    import torch
    from torch import nn

    from odeattn.backends.torch import ODEEncoder

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(task.vocab, task.d_model), nn.Embedding(task.seq, task.d_model)

        def forward(self, tokens):
            return self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))

    torch.manual_seed(seed)
    embed, head = Embed(), nn.Linear(task.d_model, task.vocab)
    return nn.Sequential(embed, ODEEncoder(encoder_config(task, family)), head)


def batches(task: Task, seed: int):
    """Endless (tokens, targets) batches: random tokens, each target the token before it (-100,
    cross_entropy's ignore_index, at the first position). The same stream for every solver."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(task.vocab, (task.batch, task.seq), generator=generator)
        targets = torch.cat([torch.full((task.batch, 1), -100), tokens[:, :-1]], dim=1)
        yield tokens, targets


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def train(solver: str, *, steps: int, seed: int = 0, task: Task = Task(), blocks: str = "attention") -> dict:
    """Train the demo model with `solver` (blocks="layer": the layer family) for `steps` Adam
    steps; {"solver", "parameters", "losses" (one per step, before its update), "seconds"}."""
    import torch
    import torch.nn.functional as F

    model = (build_model if blocks == "attention" else build_layer_model)(task, solver, seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=task.lr)
    losses = []
    start = time.perf_counter()
    for _, (tokens, targets) in zip(range(steps), batches(task, seed)):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return {"solver": solver, "parameters": count_parameters(model), "losses": losses,
            "seconds": time.perf_counter() - start}


def run(*, steps: int, seed: int = 0, threads: int = 1, task: Task = Task(), log=None, blocks: str = "attention") -> dict:
    """Train every solver of SOLVERS (blocks="layer": of LAYER_FAMILIES) on the same data from the
    same start, with `threads` torch threads (the previous setting is restored); {"task", "steps",
    "seed", "threads", "blocks", "runs"}."""
    import torch

    if blocks not in BLOCKS:
        raise ValueError(f"blocks: expected one of {', '.join(map(repr, BLOCKS))}; got {blocks!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs = []
        for solver in SOLVERS if blocks == "attention" else LAYER_FAMILIES:
            if log:
                log(f"training {solver}...")
            runs.append(train(solver, steps=steps, seed=seed, task=task, blocks=blocks))
    finally:
        torch.set_num_threads(previous)
    return {"task": dataclasses.asdict(task), "steps": steps, "seed": seed, "threads": threads, "blocks": blocks,
            "runs": runs}


def tail_mean(losses: list[float], n: int = 10) -> float:
    """The mean of the last n losses (fewer if there are fewer): a less noisy last loss."""
    tail = losses[-n:]
    return sum(tail) / len(tail)


def format_summary(result: dict) -> str:
    """The task, then one line per solver: parameters (and the difference from the smallest count),
    first loss, mean of the last 10, seconds."""
    t, runs = result["task"], result["runs"]
    base = min(r["parameters"] for r in runs)
    lines = [f"task: each of {t['seq']} random tokens (vocabulary {t['vocab']}) outputs the token before it; "
             f"batch {t['batch']}, {result['steps']} Adam steps (lr {t['lr']:g}), seed {result['seed']}, "
             f"{result['threads']} thread{'s' if result['threads'] > 1 else ''}",
             f"model: embedding -> ODEAttentionBlock (d_model {t['d_model']}, {t['heads']} heads, RoPE, "
             f"{t['ode_steps']} step, float32) -> linear head; the same initial weights and batches for every solver"
             if result.get("blocks", "attention") == "attention" else
             f"model: token + position embeddings -> one ODE Transformer block (F: a pre-norm encoder layer, d_model "
             f"{t['d_model']}, {t['heads']} heads, FFN {t['ffn_dim']}, euler's {t['ffn_dim'] + 1}: equal parameter counts) "
             f"-> linear head; the same embeddings, head and batches for both",
             f"{'solver':<10}{'parameters':>11}  {'':<20}{'first loss':>11}{'last loss':>11}{'seconds':>9}"]
    for r in runs:
        extra = r["parameters"] - base
        note = f"+{extra} ({100 * extra / base:.1f}%): gate" if extra else ""
        lines.append(f"{r['solver']:<10}{r['parameters']:>11,}  {note:<20}{r['losses'][0]:>11.3f}"
                     f"{tail_mean(r['losses']):>11.3f}{r['seconds']:>9.1f}")
    lines.append("last loss: the mean of the last 10 steps. This shows that each solver trains; "
                 "it is not a claim about which solver is better.")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Training loss against step, one curve per solver, log y."""
    from odeattn.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in result["runs"]:
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=f"{r['solver']} ({r['parameters']:,} parameters)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title("odeattn demo train: each token outputs the one before it (not a ranking of solvers)"
                 if result.get("blocks", "attention") == "attention" else
                 "odeattn demo train --blocks layer: F a whole encoder layer (not a ranking of the families)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

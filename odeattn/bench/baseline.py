"""torch-plain: the block written plainly, the seed module's way, the baseline of `vs plain`.

The ports are measured against it: the same weights, in nn.LayerNorm, nn.Linear, matmul,
masked_fill, softmax and an explicit Runge-Kutta loop, with none of the ports' fusions.
"""

from __future__ import annotations

import numpy as np

import ode_ref as R


def check_plain(cfg: R.ODEConfig):
    """The config's tableau; ValueError naming the field unless torch-plain covers the config (the
    plain float block with a fixed tableau)."""
    if cfg.ode_solver not in R.TABLEAUS:
        raise ValueError(f"ode_solver: torch-plain covers the fixed tableaus, not a multistep solver; got {cfg.ode_solver!r}")
    tableau = R.TABLEAUS[cfg.ode_solver]
    for field, expected in (("norm_type", "layer_norm"), ("use_bitnet", False), ("ode_use_pe", False)):
        if getattr(cfg, field) != expected:
            raise ValueError(f"{field}: torch-plain covers the plain float block, {field} {expected!r}; "
                             f"got {getattr(cfg, field)!r}")
    if tableau.gated:
        raise ValueError(f"ode_solver: torch-plain covers the fixed tableaus, not a gated one; got {cfg.ode_solver!r}")
    return tableau


def plain_torch_block(config, params):
    """The block as the seed module writes it, in float32, loaded with `params` by their seed
    state_dict names: ode_func.norm (nn.LayerNorm), ode_func.qkv and ode_func.out_proj (nn.Linear,
    no bias); f = norm, qkv, split heads, matmul, scale, masked_fill (decoder), softmax, matmul,
    merge heads, out_proj; an explicit Runge-Kutta loop over the tableau. Plain float block only:
    ValueError naming the field for a config it does not cover."""
    import torch
    from torch import nn

    cfg = R.ODEConfig.from_any(config)
    tableau = check_plain(cfg)
    d, heads = cfg.hidden_size, cfg.num_heads

    class ODEFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.out_proj = nn.Linear(d, d, bias=False)
            self.head_dim = d // heads
            self.scale = self.head_dim**-0.5

        def forward(self, t, x):
            b, n, _ = x.shape
            qkv = self.qkv(self.norm(x)).reshape(b, n, 3, heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            if cfg.mode == "decoder":
                future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
                scores = scores.masked_fill(future, float("-inf"))
            attn = torch.softmax(scores, dim=-1)
            y = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d)
            return self.out_proj(y)

    class ODEAttentionBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ode_func = ODEFunc()

        def forward(self, x):
            dt = 1.0 / cfg.ode_steps
            z = x
            for step in range(cfg.ode_steps):
                t, ks = step * dt, []
                for c, row in zip(tableau.c, tableau.a):
                    zi = z
                    for a, k in zip(row, ks):
                        if a:
                            zi = zi + (dt * a) * k
                    ks.append(self.ode_func(t + c * dt, zi))
                for b, k in zip(tableau.b, ks):
                    if b:
                        z = z + (dt * b) * k
            return z

    block = ODEAttentionBlock().eval()
    block.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in params.items()}, strict=True)
    return block

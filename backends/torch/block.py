"""The ODE attention block in PyTorch; port of ode_ref/block.py as the seed's nn.Modules.

    ODEFunc(config).forward(t, x, padding_mask=None)       f once      (attention.SelfAttention)
    ODEAttentionBlock(config).forward(x, padding_mask=None) z(1)

The ODE loop is ode_ref.rk.integrate itself (it only adds and scales), so the torch block runs
the spec's stepper, arithmetic order included. Weight quantisation and the mask are computed once
per forward in prepare, outside the loop.
"""

from __future__ import annotations

import torch
from torch import nn

from ode_ref.config import ODEConfig
from ode_ref.rk import integrate
from ode_ref.tableaus import TABLEAUS

from .attention import SelfAttention


class ODEAttentionBlock(nn.Module):
    def __init__(self, config, ode_func: SelfAttention | None = None):
        super().__init__()
        cfg = ODEConfig.from_any(config)
        self.config = cfg
        self.ode_func = SelfAttention(cfg) if ode_func is None else ode_func
        if self.ode_func.config != cfg:
            raise ValueError(f"ode_func: its config {self.ode_func.config} differs from config {cfg}")
        self.solver, self.steps = cfg.ode_solver, cfg.ode_steps
        self.tableau = TABLEAUS[cfg.ode_solver]

    def forward(self, x, padding_mask=None, *, return_trajectory: bool = False):
        """x: (batch, seq, d_model) -> z(1), or (z(1), (steps + 1, batch, seq, d_model))."""
        prepared = self.ode_func.prepare(x, padding_mask)
        states = integrate(lambda t, z: self.ode_func.evaluate(prepared, t, z), x, self.tableau, self.steps)
        if return_trajectory:
            return states[-1], torch.stack(states)
        return states[-1]

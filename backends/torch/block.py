"""The ODE attention block in PyTorch; port of ode_ref/block.py as the seed's nn.Modules.

    ODEFunc(config).forward(t, x, *, padding_mask=None)       f once      (attention.SelfAttention)
    ODEAttentionBlock(config).forward(x, *, padding_mask=None) z(1)
    .prefill(x, padding_mask=None, *, max_len) -> (z(1), cache);  .decode_step(x_t, cache) -> (z_t, cache)

The seed's signatures are accepted: ODEAttentionBlock(config, pos_encoder=None) and
forward(x, logical_layer_idx=None, pos_encoder=None); see attention.py. logical_layer_idx, when
given, is hope's layer index for that call (else the config's layer_idx). The seed's encoder
parameters are ode_func.pos_encoder, also held as pos_encoder (params.py: seed_state_dict).

The ODE loop is the spec's Stages.integrate (ode_ref.rk.integrate, which only adds and scales),
so the torch block runs the spec's stepper, arithmetic order included. Weight quantisation and the mask are computed once
per forward in prepare, outside the loop.

ODEAttentionBlock(config, checkpoint=True) trains in memory that grows with the square root of the
steps: with grad enabled, rk.integrate runs the steps in segments of ceil(sqrt(steps)) steps,
each segment and each step in it under torch.utils.checkpoint (non-reentrant, nested), so the
backward pass keeps about 2 sqrt(steps) states (batch, seq, d_model) and recomputes one step's
activations at a time. The values and gradients are the same, bit for bit; without grad (eval,
no_grad) nothing is wrapped.

A block in float16 or bfloat16 (block.to(torch.bfloat16)) follows the spec's half-precision
policy (precision.py): parameters stored in that dtype, each call computing in float32 between
the policy's rounding points, z(1) and the cache's k, v returned in it.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from ode_ref.attention import Stages
from ode_ref.block import attention_for, check_dtype, check_flag
from ode_ref.cache import CachePort, check_decode_input, check_max_len, check_mode
from ode_ref.config import ODEConfig
from ode_ref.params import GATE_BIAS, GATE_WEIGHT
from ode_ref.precision import DTYPES
from ode_ref.multistep import solver

from .attention import SelfAttention, check_seed_arguments, check_torch_memory
from .params import check_state_dict, load_params, seed_state_dict
from .precision import cache_in, to_compute, under_policy


def checkpoint(fn, *args):
    """fn(*args) under non-reentrant activation checkpointing (rk.integrate's checkpoint): its
    activations are not saved but recomputed in the backward pass. The RNG state is restored for
    the recomputation, so dropout draws the same mask."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


CACHE = CachePort("torch", "ODEAttentionBlock.prefill", torch.Tensor)  # what decode_step takes


def _both_encoder_keys(block, state_dict, prefix, *_):
    """A load's pre-hook: the block's keys (under its prefix, so inside any model that holds it)
    through seed_state_dict, every encoder tensor under both of its keys, as the block's own
    load_state_dict takes them."""
    own = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    state_dict.update({prefix + k: v for k, v in seed_state_dict(block.config, own).items()})


class ODEAttentionBlock(nn.Module):
    def __init__(self, config, pos_encoder=None, *, ode_func: SelfAttention | None = None, checkpoint: bool = False):
        super().__init__()
        cfg = ODEConfig.from_any(config)
        self.config = cfg
        self.checkpoint = check_flag("checkpoint", checkpoint)
        self.ode_func = attention_for(cfg, ode_func, SelfAttention, name="ode_func")
        self.register_load_state_dict_pre_hook(_both_encoder_keys)
        if hasattr(self.ode_func, "pos_encoder"):  # the seed's: one encoder, held by the block and by ODEFunc
            self.pos_encoder = self.ode_func.pos_encoder
        self.solver, self.steps = cfg.ode_solver, cfg.ode_steps
        self.tableau = solver(cfg.ode_solver)  # a tableau, or a multistep solver (never gated)
        if self.tableau.gated:  # the paper's learnable RK2: g = sigmoid(Linear(2 d_model -> 1)([F1; F2]))
            self.gate = nn.Linear(2 * cfg.hidden_size, 1)
            nn.init.xavier_uniform_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """torch's, over seed_state_dict: a seed checkpoint loads as is, its encoder tensors under
        pos_encoder.X, ode_func.pos_encoder.X or both (pos_encoder.X wins). strict: the spec's
        names and shapes are checked first (ValueError naming the key)."""
        state_dict = seed_state_dict(self.config, state_dict)
        if strict:
            check_state_dict(self.config, state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def block_params(self):
        """The parameters the block holds beside ode_func's, by spec name (the gate's), or None."""
        if not self.tableau.gated:
            return None
        return {GATE_WEIGHT: self.gate.weight, GATE_BIAS: self.gate.bias}

    @classmethod
    def from_params(cls, config, params: dict, *, dtype=torch.float32, ode_func: SelfAttention | None = None,
                    checkpoint: bool = False):
        """A block in evaluation mode with the spec's parameters loaded (checked, strict names)."""
        check_dtype("dtype", dtype, DTYPES)
        block = cls(config, ode_func=ode_func, checkpoint=checkpoint).to(dtype).eval()
        load_params(block, params)
        return block

    def forward(self, x, logical_layer_idx=None, pos_encoder=None, *, padding_mask=None,
                return_trajectory: bool = False):
        """x: (batch, seq, d_model) -> z(1), or (z(1), (steps + 1, batch, seq, d_model))."""
        check_seed_arguments(logical_layer_idx)
        self.ode_func.check(x, padding_mask)
        f, x_c = under_policy(self.ode_func), to_compute(x, self.ode_func)  # a half block: the policy
        check_torch_memory("ODEAttentionBlock.forward", f, x_c, padding_mask)
        prepared = Stages.prepare(f, self.block_params(), x_c, padding_mask, logical_layer_idx)
        wrapper = checkpoint if self.checkpoint and torch.is_grad_enabled() else None
        states = f.integrate(prepared, x_c, checkpoint=wrapper, trajectory=return_trajectory)
        if return_trajectory:  # z(1) and the states in the block's dtype (S under the policy)
            return states[-1].to(x.dtype), torch.stack(states).to(x.dtype)
        return states[-1].to(x.dtype)

    def prefill(self, x, padding_mask=None, *, max_len: int):
        """(z(1) of the prompt x (batch, seq, d_model), a KVCache of max_len slots); decoder mode."""
        check_mode(self.config)
        self.ode_func.check(x, padding_mask)
        max_len = check_max_len(max_len, x.shape[1])
        f, x_c = under_policy(self.ode_func), to_compute(x, self.ode_func)
        check_torch_memory("ODEAttentionBlock.prefill", f, x_c, padding_mask, max_len)
        z, cache = f.prefill(self.block_params(), x_c, padding_mask, max_len)
        return z.to(x.dtype), cache_in(cache, x.dtype)  # the cache's k, v in the block's dtype

    def decode_step(self, x_t, cache):
        """(z(1) of the next token x_t (batch, 1, d_model), a new cache holding it); the cache
        given is not written. Compiles with torch.compile(fullgraph=True)."""
        self.ode_func.check(x_t, name="x_t")
        cache = check_decode_input(x_t, cache, self.config, CACHE)
        f, x_c = under_policy(self.ode_func), to_compute(x_t, self.ode_func)
        if f is self.ode_func:  # float32 or float64: the cache as it is
            return f.decode(self.block_params(), x_t, cache)
        z, cache = f.decode(self.block_params(), x_c, cache_in(cache, x_c.dtype))  # computed in float32
        return z.to(x_t.dtype), cache_in(cache, x_t.dtype)

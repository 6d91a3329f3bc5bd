"""Spec parameters <-> module state: the names are the same, so conversion is a copy."""

from __future__ import annotations

import numpy as np
import torch

from ode_ref.params import check_params


def params_to_state_dict(params: dict, dtype=torch.float32) -> dict:
    """ode_ref params (NumPy) -> a state_dict for ODEAttentionBlock.load_state_dict(strict=True)."""
    return {k: torch.as_tensor(np.asarray(v), dtype=dtype).clone() for k, v in params.items()}


def state_dict_to_params(state_dict: dict) -> dict:
    """A block's state_dict (a seed checkpoint too) -> ode_ref params as float64 NumPy arrays."""
    return {k: v.detach().cpu().to(torch.float64).numpy() for k, v in state_dict.items()}


def load_params(block, params: dict) -> None:
    """Check params against the block's config, then copy them in (strict: exact names)."""
    check_params(params, block.config)
    dtype = next(block.parameters()).dtype
    block.load_state_dict(params_to_state_dict(params, dtype), strict=True)

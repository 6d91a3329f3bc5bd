"""Spec parameters <-> module state: the names are the same, so conversion is a copy.

The seed's block and its ODEFunc both hold the positional encoder, so the block's state_dict has
each encoder tensor twice, pos_encoder.X and ode_func.pos_encoder.X (one shared tensor); the
spec's parameters hold pos_encoder.X. A loaded state_dict may hold either key or both; where both
differ, pos_encoder.X wins, as in the seed (seed_state_dict)."""

from __future__ import annotations

import numpy as np
import torch

from ode_ref.config import ODEConfig, dtype_name
from ode_ref.params import POS_PREFIX, check_params, encoder_shapes

INNER_PREFIX = "ode_func." + POS_PREFIX  # the encoder's keys under the block's ODEFunc


def params_to_state_dict(params: dict, dtype=torch.float32) -> dict:
    """ode_ref params (NumPy, float16 and ml_dtypes' bfloat16 too) -> a state_dict for
    ODEAttentionBlock.load_state_dict(strict=True)."""
    return {k: torch.as_tensor(readable(np.asarray(v)), dtype=dtype).clone() for k, v in params.items()}


def readable(a: np.ndarray) -> np.ndarray:
    """a as torch can read it: a NumPy bfloat16 array (ml_dtypes) as float32, which holds each of
    its values exactly; any other array as it is."""
    return a.astype(np.float32) if dtype_name(a.dtype) == "bfloat16" else a


def state_dict_to_params(state_dict: dict) -> dict:
    """A block's state_dict (a seed checkpoint too), or a model's holding blocks under a prefix
    (blocks.N.) -> ode_ref params as float64 NumPy arrays: each encoder tensor once, as
    <prefix>pos_encoder.X (which wins over <prefix>ode_func.pos_encoder.X)."""
    out = {}
    for k, v in state_dict.items():
        at = k.find(INNER_PREFIX)
        if at == 0 or (at > 0 and k[at - 1] == "."):
            outer = k[:at] + k[at + len("ode_func."):]
            if outer in state_dict:
                continue
            k = outer
        out[k] = v.detach().cpu().to(torch.float64).numpy()
    return out


def seed_state_dict(config, state_dict) -> dict:
    """state_dict with every encoder tensor under both of the block's keys, pos_encoder.X's value
    where both are given; ValueError for a pape_ri checkpoint without position_scales (the seed's
    non-persistent buffer: its values are lost, and no random draw stands in for them)."""
    cfg = ODEConfig.from_any(config)
    sd = dict(state_dict)
    scales = "position_scales"
    if scales in encoder_shapes(cfg) and POS_PREFIX + scales not in sd and INNER_PREFIX + scales not in sd:
        raise ValueError(
            "pos_encoder.position_scales: missing. pape_ri's per-head scales are a non-persistent buffer in "
            "the seed, so its checkpoints do not hold them and cannot reproduce its function; odeattn saves "
            "them as a parameter: give the scales the trained module used (a (1, heads, 1, 1) tensor), "
            "never a new random draw"
        )
    for name in encoder_shapes(cfg):
        outer, inner = POS_PREFIX + name, INNER_PREFIX + name
        if outer in sd:
            sd[inner] = sd[outer]
        elif inner in sd:
            sd[outer] = sd[inner]
    return sd


def check_state_dict(config, state_dict) -> None:
    """The spec's check_params on a state_dict (names, shapes, float dtypes), the encoder's keys once."""
    check_params(state_dict_to_params(state_dict), config)


def load_params(block, params: dict) -> None:
    """Check params against the block's config, then copy them in (strict: exact names)."""
    check_params(params, block.config)
    dtype = next(block.parameters()).dtype
    block.load_state_dict(params_to_state_dict(params, dtype), strict=True)

"""The language model's "layer" block: the ODE Transformer's encoder (encoder.py) of one layer, in
decoder mode, with a key-value cache.

A block is a one-layer encoder stack (post-norm, as fairseq's default; its parameters are the
stack's, `layers.0.*` and `gate_linear.*` for rk2_gated) whose self-attention is causal: the query
at slot i sees the real keys at slots j <= i, and itself (so a padded query's row is never empty;
no real token reads a padded one). Each stage evaluates the layer once, and each evaluation keeps
its own K and V (after the projection and its bias, heads split), so the block decodes one token
at a time exactly:

    layer_block(params, x, enc_cfg, visible, past=None) -> (z, present)

x (batch, seq, C) holds the new tokens; visible (batch, 1, seq, keys) bool the keys each sees,
keys = the past's slots + seq; past None (no cache) or a list of (k, v), (batch, heads, slots,
head_dim), one per evaluation; present the same with the new tokens appended.

The LM's solver picks the family (LAYER_FAMILIES); the layer has no positional encoder (its
positions are in the token order it sees), no BitLinear and no norm choice, and steps once.
"""

from __future__ import annotations

import numpy as np

from .encoder import ODEEncoderStages
from .encoder_config import ODEEncoderConfig

LAYER_FAMILIES = {"euler": "euler", "heun": "rk2", "rk4": "rk4", "rk2_gated": "rk2_gated"}  # ode_solver -> family


def layer_config(cfg) -> ODEEncoderConfig:
    """The one-layer stack of an LMConfig with block 'layer'; ValueError naming a field it does not take."""
    for name, default in (("use_bitnet", False), ("norm_type", "layer_norm"), ("ode_steps", 1)):
        if getattr(cfg, name) != default:
            raise ValueError(f"{name}: the 'layer' block (the encoder layer) takes {name}={default!r} only; "
                             f"got {getattr(cfg, name)!r}")
    if cfg.block_config.position_encoding != "none" or cfg.block_config.ssmax:
        raise ValueError(f"positional_encoding: the 'layer' block has no positional encoder; expected ode_use_pe=false; "
                         f"got {cfg.positional_encoding!r}")
    if cfg.ode_solver not in LAYER_FAMILIES:
        raise ValueError(f"ode_solver: the 'layer' block takes {', '.join(LAYER_FAMILIES)} (its families "
                         f"{', '.join(LAYER_FAMILIES.values())}); got {cfg.ode_solver!r}")
    return ODEEncoderConfig(cfg.hidden_size, cfg.num_heads, cfg.ffn_dim or 4 * cfg.hidden_size,
                            family=LAYER_FAMILIES[cfg.ode_solver])


def layer_evaluations(enc_cfg: ODEEncoderConfig) -> int:
    return enc_cfg.enc_calculate_num


def visible_keys(keys, first_query: int, seq: int):
    """bool (batch, 1, seq, slots): the query at slot first_query + q sees the real keys (keys,
    (batch, slots) bool) at slots <= its own, and itself."""
    j = np.arange(keys.shape[1])
    i = first_query + np.arange(seq)[:, None]
    return ((j <= i) & (keys[:, None, None, :] | (j == i)))


class CausalLayerStages(ODEEncoderStages):
    """The stack's stages with each evaluation's keys and values recorded or appended (cache_kv)."""

    def __init__(self, config, past=None):
        super().__init__(config)
        self.past, self.present = past, []

    def cache_kv(self, k, v):
        if self.past is not None:
            past_k, past_v = self.past[len(self.present)]
            k, v = np.concatenate([past_k, k], axis=2), np.concatenate([past_v, v], axis=2)
        self.present.append((k, v))
        return k, v


def layer_block(params: dict, x, enc_cfg: ODEEncoderConfig, visible, past=None):
    """(z, present) of one block (module docstring); params the stack's, in x's dtype."""
    stages = CausalLayerStages(enc_cfg, past)
    return stages.block(params, 0, x, visible), stages.present

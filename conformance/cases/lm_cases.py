"""The language model's cases: ode_ref.lm_logits as conformance cases, one row per group of LMConfig
fields, so that every field the LM's config proves (fields.py) takes another value than its
default in some row: the LM's own (block, mode, ffn_dim) and the block's fields it carries.

A case's x holds its token ids (kinds.LanguageModel), drawn uniformly from the vocabulary; its
seeds derive from its name (cases.name_seed) as every case's; cases.build_lm_case builds it. A row
with BitLinear has one block, whose input is the embedding itself, so that the fair check on the
block's roundings (fair.check_fair) holds for the whole model; every row's logits are redrawn
until the spec's own float32 error is at most MAX_CONDITION float32 roundings, as a block case's.
"""

from __future__ import annotations

import numpy as np

import ode_ref as R
from ode_ref.lm import EMBED, block_params

from .encoder_cases import padding_of  # the encoder rows' padding: the last sequence's last seq // 2 slots
from .fair import MAX_CONDITION, MAX_REDRAWS, check_fair
from .tolerance import UNIT_ROUNDOFF, relative_error

# (name, LMConfig fields beside the sizes, batch, seq, padding); frozen: append only
_SIZES = dict(vocab_size=13, hidden_size=8, num_heads=2)
LM_ROWS = [
    ("lm_rope_bitnet_rms_heun_s3_ssmax_padded_pad", dict(num_layers=1, use_bitnet=True, norm_type="rms_norm",
                                                        ode_solver="heun", ode_steps=3, ode_use_pe=True, rope_base=50.0,
                                                        rope_scaling=2.0, use_ssmax=True, ssmax_length="padded"), 2, 6, True),
    ("lm_alibi_encoder_derf_midpoint_s1_pad", dict(num_layers=2, mode="encoder", ode_use_pe=True, positional_encoding="alibi",
                                                   alibi_scale=3.0, norm_type="derf", ode_solver="midpoint", ode_steps=1),
     2, 6, True),
    ("lm_sinusoidal_rotary_dynamic_tanh_rk38", dict(num_layers=2, ode_use_pe=True, positional_encoding="sinusoidal_rotary",
                                                    sinusoidal_base=500.0, sinusoidal_scale=0.6, norm_type="dynamic_tanh",
                                                    ode_solver="rk38"), 2, 7, False),
    ("lm_hope_base_damping_layer_idx", dict(num_layers=1, ode_use_pe=True, positional_encoding="hope", hope_base=500.0,
                                            hope_damping=0.2, layer_idx=3), 2, 6, False),
    ("lm_pape_parabolas", dict(num_layers=1, ode_use_pe=True, positional_encoding="pape", pape_num_parabolas=2), 2, 6, False),
    ("lm_pape_ri_positions", dict(num_layers=1, ode_use_pe=True, positional_encoding="pape_ri", pape_num_positions=3),
     2, 6, False),
    ("lm_bam_eps_mu_init", dict(num_layers=1, ode_use_pe=True, positional_encoding="bam", bam_eps=0.5, bam_mu_init=0.5),
     2, 6, False),
    ("lm_bam_learn_mu_pad", dict(num_layers=1, ode_use_pe=True, positional_encoding="bam", bam_learn_mu=True), 2, 6, True),
    ("lm_layer_rk2_gated_ffn12_pad", dict(num_layers=2, block="layer", ffn_dim=12, ode_solver="rk2_gated", ode_steps=1),
     2, 6, True),
    ("lm_momentum_gamma_s3_pad", dict(num_layers=2, ode_solver="momentum", ode_steps=3, momentum_gamma=0.7), 2, 6, True),
]


def row_config(row) -> R.LMConfig:
    return R.LMConfig(**_SIZES, **row[1])


def unfair(config, params, ids, mask) -> str | None:
    """Why the ids are not a fair test of the model (fair.py's reasons), or None."""
    if config.use_bitnet:
        if config.num_layers != 1:
            raise ValueError("an LM row with BitLinear has one block (the fair check covers its input, the embedding)")
        reason = check_fair(config.block_config, block_params(params, 0), params[EMBED][ids], mask)
        if reason is not None:
            return reason
    e32 = relative_error(R.lm_logits(params, ids, config, mask, dtype=np.float32), R.lm_logits(params, ids, config, mask))
    if e32 > MAX_CONDITION * UNIT_ROUNDOFF["float32"]:
        return f"ill-conditioned: spec float32 error {e32:.1e}"
    return None


def lm_inputs(row, param_seed: int, input_seed: int):
    """(config, params, x, padding_mask, the input seed used) of a row: x the first fair draw of
    token ids from input_seed (+ 1, + 2, ...), as float64 (batch, seq, 1)."""
    name, _, batch, seq, padding = row
    cfg = row_config(row)
    params = R.init_lm_params(cfg, param_seed)
    mask = padding_of(batch, seq) if padding else None
    reasons = []
    for seed in range(input_seed, input_seed + MAX_REDRAWS):
        ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(batch, seq))
        reason = unfair(cfg, params, ids, mask)
        if reason is None:
            return cfg, params, ids[..., None].astype(np.float64), mask, seed
        reasons.append(reason)
    raise RuntimeError(f"{name}: no fair input in {MAX_REDRAWS} draws from seed {input_seed}: {reasons[:3]}")

"""The conformance cases: a parameter table of seeded cases, each computed by ode_ref.

A case is named for its kind and variant (`block_...`, `decode_...`, `grad_...`, `encoder_...`);
the names are unique (a duplicate raises), and a case's seeds derive from its name alone
(name_seed), so adding cases never changes an existing one. build_case has the case's kind
(kinds.py, which also says what each kind's quantities are) run the spec in float64 and record,
per quantity, the spec's own float32 error (e32), from which every backend's tolerance is
derived (tolerance.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass

import numpy as np

import ode_ref as R

from .decoding import decode_loop, run_decode, split_decoded  # noqa: F401 (re-exported: the adapters and tests take them from here)
from .encoder_cases import ENCODER_ROWS, SUCCESSOR_ROWS, TEMPORAL_ROWS, encoder_inputs, row_name as encoder_row_name
from .lm_cases import LM_ROWS, lm_inputs
from ode_ref.precision import HALF_DTYPES

from .fair import make_inputs
from .half import HALF_FIELDS
from .case import Case
from .kinds import BLOCK, DECODE, ENCODER, GRAD, KINDS, LM, Kind  # noqa: F401 (re-exported: the suite's names for them)
from .matrix import OPTION_FIELDS, config_of, pairwise, row_name, rows
from .tolerance import relative_error, tolerance

CASES_VERSION = 2  # bump when an existing case's definition changes; checked against the manifest


def name_seed(name: str, purpose: str) -> int:
    """A case's seed for `purpose` ('params' or 'input'): the first 4 bytes of sha256(name/purpose)."""
    return int.from_bytes(hashlib.sha256(f"{name}/{purpose}".encode()).digest()[:4], "little")


@dataclass(frozen=True)
class CaseSpec:
    """How to build one case: a config, the seeds, the input shape and scale, its kind."""

    name: str
    config: R.ODEConfig
    batch: int
    seq: int
    padding: bool
    param_seed: int
    input_seed: int
    scale: float = 1.0  # standard deviation of x
    decoded: int = 0  # a decode case: the last `decoded` tokens are decoded one by one after a prefill
    kind: Kind = BLOCK  # what it checks (kinds.KINDS)
    offset: float = 0.0  # x = scale * (offset + N(0, 1)): an input centred far from zero


# Chosen edge cases beside the pairwise matrix: (name, config fields, batch, seq, padding, scale)
EDGE_CASES = [
    ("block_large_magnitude_layer_norm_bitnet_decoder", dict(hidden_size=8, num_heads=2, use_bitnet=True, mode="decoder"), 2, 5, True, 1e4),
    ("block_large_magnitude_derf_rk4", dict(hidden_size=8, num_heads=2, norm_type="derf"), 2, 5, False, 1e4),
    ("block_large_magnitude_flash_norm_rk38", dict(hidden_size=12, num_heads=3, norm_type="flash_norm", ode_solver="rk38"), 1, 6, False, 1e3),
    ("block_t1_h1_decoder_bitnet", dict(hidden_size=6, num_heads=1, mode="decoder", use_bitnet=True), 3, 1, True, 1.0),
    ("block_rk4_s8_decoder_bitnet_pad_dyt", dict(hidden_size=10, num_heads=2, mode="decoder", use_bitnet=True, norm_type="dynamic_tanh", ode_steps=8), 3, 9, True, 1.0),
    ("block_rk4_s8_encoder_prms_wide", dict(hidden_size=40, num_heads=5, norm_type="prms_norm", ode_steps=8), 1, 6, False, 1.0),
    ("block_small_magnitude_rms_norm", dict(hidden_size=8, num_heads=2, norm_type="rms_norm"), 2, 4, False, 1e-3),
    ("block_rope_decoder_bitnet_pad", dict(hidden_size=12, num_heads=3, mode="decoder", use_bitnet=True, ode_use_pe=True), 3, 7, True, 1.0),
    ("block_alibi_h3_decoder_pad_large", dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True, positional_encoding="alibi"), 3, 7, True, 1e3),
    ("block_rope_scaled_odd_head_dim_rk4", dict(hidden_size=10, num_heads=2, ode_use_pe=True, rope_base=500.0, rope_scaling=0.37), 2, 6, False, 1.0),
]

# Cached decoding (decoder mode): (name, config fields, batch, prompt + decoded tokens, padding of
# the prompt, decoded tokens). A backend runs them through run_decode (adapters/protocol.py).
_DEC = dict(mode="decoder")
DECODE_CASES = [
    ("decode_rk4_layer_norm_rope_pad", dict(hidden_size=12, num_heads=3, **_DEC, ode_use_pe=True), 3, 7, True, 3),
    ("decode_euler_s3_rms_norm_alibi_bitnet", dict(hidden_size=8, num_heads=2, **_DEC, ode_solver="euler", ode_steps=3, norm_type="rms_norm",
                                                    use_bitnet=True, ode_use_pe=True, positional_encoding="alibi"), 2, 6, False, 3),
    ("decode_heun_dynamic_tanh_pad", dict(hidden_size=12, num_heads=2, **_DEC, ode_solver="heun", norm_type="dynamic_tanh"), 3, 6, True, 2),
    ("decode_rk38_derf_rope_bitnet_pad_odd_head_dim", dict(hidden_size=10, num_heads=2, **_DEC, ode_solver="rk38", norm_type="derf",
                                                            use_bitnet=True, ode_use_pe=True, rope_scaling=0.5), 3, 6, True, 2),
    ("decode_midpoint_prms_norm_alibi_h6_pad", dict(hidden_size=24, num_heads=6, **_DEC, ode_solver="midpoint", norm_type="prms_norm",
                                                     ode_use_pe=True, positional_encoding="alibi"), 3, 7, True, 3),
    ("decode_ralston_flash_norm_rope_one_token_prompt", dict(hidden_size=6, num_heads=1, **_DEC, ode_solver="ralston", norm_type="flash_norm",
                                                             ode_steps=4, ode_use_pe=True), 2, 5, False, 4),
    ("decode_rk2_gated_rms_norm_rope_pad", dict(hidden_size=8, num_heads=2, **_DEC, ode_solver="rk2_gated", norm_type="rms_norm",
                                                 ode_use_pe=True), 2, 6, True, 3),
]


# Grad cases: a pairwise cover of their own (14 rows) over the solver and the options its reverse
# depends on; the norm, the positions and the shape, whose VJPs are independent of the stepper's,
# are taken in turn (each norm 2 or 3 times, each encoding 4 or 5 times). Every distinct config
# costs a JAX port one compilation of its backward pass: the cover is kept small on purpose. Frozen.
GRAD_FACTORS = {
    "ode_solver": ["euler", "midpoint", "heun", "ralston", "rk4", "rk38", "rk2_gated"],
    "mode": ["encoder", "decoder"],
    "use_bitnet": [False, True],
    "padding": [False, True],
    "ode_steps": [1, 2],
}
GRAD_TURNS = {
    "norm_type": ["layer_norm", "rms_norm", "prms_norm", "flash_norm", "dynamic_tanh", "derf"],
    "positions": ["none", "rope", "alibi"],
    "shape": [(2, 5, 2, 8), (1, 4, 1, 6), (3, 6, 3, 12)],  # (batch, seq, heads, d_model)
}


def grad_specs() -> list:
    """(name, config, batch, seq, padding) of every grad case."""
    out = []
    for i, row in enumerate(pairwise(GRAD_FACTORS)):
        row = {**row, **{k: values[i % len(values)] for k, values in GRAD_TURNS.items()}}
        b, t, h, d = row["shape"]
        fields = {k: row[k] for k in ("norm_type", "ode_solver", "mode", "use_bitnet", "ode_steps")}
        name = (f"grad_{row['norm_type']}_{row['ode_solver']}_{row['mode']}_{'bitnet' if row['use_bitnet'] else 'float'}"
                f"_{'pad' if row['padding'] else 'nopad'}_s{row['ode_steps']}_{row['positions']}_b{b}t{t}h{h}d{d}")
        config = R.ODEConfig(hidden_size=d, num_heads=h, **fields, **OPTION_FIELDS["positions"](row["positions"]))
        out.append((name, config, b, t, row["padding"]))
    return out


# The seed's positional family (docs/positions.md): a pairwise cover of its own over the encoding,
# SSMax, the mode and the padding (12 rows); the norm, the solver and the shape taken in turn, hope
# at layer 3 and pape_ri with n = 2. Beside it: the seed's padded SSMax rule (a full block only:
# decoding refuses it), a learnable BAM mu, a decode case per encoding, and six grad cases (every
# encoding but pape_efficient, which is pape's function; SSMax with and without a bias). Every
# distinct config costs a JAX port one compilation: kept small on purpose. Frozen: append, never edit.
POSITION_FACTORS = {
    "positional_encoding": ["sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam"],
    "use_ssmax": [False, True],
    "mode": ["encoder", "decoder"],
    "padding": [False, True],
}
POSITION_TURNS = {
    "norm_type": ["layer_norm", "rms_norm", "dynamic_tanh"],
    "ode_solver": ["rk4", "heun", "euler", "midpoint"],
    "shape": [(2, 5, 2, 8), (1, 7, 3, 12), (3, 6, 2, 10)],  # (batch, seq, heads, d_model); (3, 6, 2, 10): head_dim 5
}
_POS = dict(ode_use_pe=True, pape_num_parabolas=2)
POSITION_EXTRA_CASES = [  # (name, config fields, batch, seq, padding)
    ("block_pos_ssmax_padded_rule_decoder_pad", dict(hidden_size=12, num_heads=3, mode="decoder", **_POS,
                                                     positional_encoding="alibi", use_ssmax=True, ssmax_length="padded"),
     2, 6, True),
    ("block_pos_bam_learn_mu_decoder", dict(hidden_size=8, num_heads=2, mode="decoder", **_POS, positional_encoding="bam",
                                            bam_learn_mu=True, bam_mu_init=0.5, ode_solver="heun"), 2, 5, False),
]
POSITION_DECODE_CASES = [  # (name, config fields, batch, prompt + decoded tokens, padding of the prompt, decoded)
    (f"decode_pos_{e}{'_ssmax' if i % 2 else ''}", dict(hidden_size=12, num_heads=3, mode="decoder", **_POS, positional_encoding=e,
                                                       use_ssmax=bool(i % 2), ode_solver=("rk4", "heun")[i % 2], layer_idx=3,
                                                       pape_num_positions=2 if e == "pape_ri" else 1),
     2, 6, bool(i // 2 % 2), 3)
    for i, e in enumerate(POSITION_FACTORS["positional_encoding"])
]
POSITION_GRAD_CASES = [  # (name, config fields, batch, seq, padding)
    ("grad_pos_sinusoidal_rotary_decoder_pad", dict(hidden_size=10, num_heads=2, mode="decoder", **_POS,
                                                    positional_encoding="sinusoidal_rotary", sinusoidal_scale=0.6,
                                                    ode_solver="heun", ode_steps=1), 2, 5, True),
    ("grad_pos_hope_encoder", dict(hidden_size=12, num_heads=3, **_POS, positional_encoding="hope", layer_idx=3,
                                   ode_solver="rk4", ode_steps=1), 1, 6, False),
    ("grad_pos_pape_ssmax_decoder_pad", dict(hidden_size=8, num_heads=2, mode="decoder", **_POS, positional_encoding="pape",
                                             use_ssmax=True, ode_solver="heun", ode_steps=1), 2, 5, True),
    ("grad_pos_pape_ri_encoder_pad", dict(hidden_size=12, num_heads=3, **_POS, positional_encoding="pape_ri",
                                          pape_num_positions=2, norm_type="rms_norm", ode_solver="rk4", ode_steps=1), 2, 6, True),
    ("grad_pos_bam_learn_mu_ssmax_decoder", dict(hidden_size=10, num_heads=2, mode="decoder", **_POS, positional_encoding="bam",
                                                 bam_learn_mu=True, use_ssmax=True, ode_solver="midpoint", ode_steps=1),
     1, 6, False),
    ("grad_pos_alibi_ssmax_padded_rule_encoder_pad", dict(hidden_size=12, num_heads=3, **_POS, positional_encoding="alibi",
                                                          use_ssmax=True, ssmax_length="padded", ode_solver="euler",
                                                          ode_steps=1), 2, 5, True),
]


def position_specs() -> list:
    """(name, config, batch, seq, padding) of the positional family's block cases."""
    out = []
    for i, row in enumerate(pairwise(POSITION_FACTORS)):
        row = {**row, **{k: values[i % len(values)] for k, values in POSITION_TURNS.items()}}
        b, t, h, d = row["shape"]
        e = row["positional_encoding"]
        name = (f"block_pos_{e}_{row['mode']}_{'ssmax' if row['use_ssmax'] else 'plain'}_{'pad' if row['padding'] else 'nopad'}"
                f"_{row['norm_type']}_{row['ode_solver']}_b{b}t{t}h{h}d{d}")
        config = R.ODEConfig(hidden_size=d, num_heads=h, **_POS, positional_encoding=e, use_ssmax=row["use_ssmax"],
                             mode=row["mode"], norm_type=row["norm_type"], ode_solver=row["ode_solver"],
                             layer_idx=3 if e == "hope" else 0, pape_num_positions=2 if e == "pape_ri" else 1)
        out.append((name, config, b, t, row["padding"]))
    return out + [(name, R.ODEConfig(**fields), b, t, padding) for name, fields, b, t, padding in POSITION_EXTRA_CASES]


# The kernel-boundary tier: where fast attention kernels switch paths, far outside the shapes
# above (batch <= 3, seq <= 9, head_dim <= 10, inputs near N(0, 1)): key tiles of 16 to 128 and one
# past (seq 17, 33, 65, 129), batch chunks (batch 5 and 8, each row padded its own way), head
# widths 16 to 128, an input offset 100 times its spread from zero (layer_norm's statistics
# cancel), and every position table read past 16 positions (sinusoidal_max_len 16 below the
# sequence). Boundaries are combined, one step each and the widest head on the shortest tile, so
# the files stay small and each case costs a JAX port few compilations. Frozen: append, never edit.
# (name, config fields, batch, seq, padding, offset, decoded)
TIER_BEFORE_ENCODER = [
    ("block_tier_t17_b8_hd16_hope_decoder_pad", dict(hidden_size=16, num_heads=1, mode="decoder", ode_steps=1, ode_use_pe=True,
                                                     positional_encoding="hope", layer_idx=3), 8, 17, True, 0.0, 0),
    ("block_tier_t33_b5_hd16_sinusoidal_table16_pad", dict(hidden_size=16, num_heads=1, norm_type="rms_norm", ode_solver="heun", ode_steps=1,
                                                           ode_use_pe=True, positional_encoding="sinusoidal_rotary", sinusoidal_max_len=16),
     5, 33, True, 0.0, 0),
    ("block_tier_t65_b2_h2hd16_alibi_decoder_bitnet_pad", dict(hidden_size=32, num_heads=2, mode="decoder", norm_type="dynamic_tanh",
                                                               use_bitnet=True, ode_solver="midpoint", ode_steps=1, ode_use_pe=True, positional_encoding="alibi"),
     2, 65, True, 0.0, 0),
    ("block_tier_t129_hd32_rope", dict(hidden_size=32, num_heads=1, ode_steps=1, ode_use_pe=True), 1, 129, False, 0.0, 0),
    ("block_tier_t17_b2_hd64_bam_decoder", dict(hidden_size=64, num_heads=1, mode="decoder", norm_type="derf", ode_solver="euler",
                                                ode_steps=1, ode_use_pe=True, positional_encoding="bam"), 2, 17, False, 0.0, 0),
    ("block_tier_t17_hd128_offset100_pape", dict(hidden_size=128, num_heads=1, ode_steps=1, ode_use_pe=True, positional_encoding="pape",
                                                 pape_num_parabolas=2), 1, 17, False, 100.0, 0),
    ("decode_tier_t33_b5_hd16_rope_prompt_pad", dict(hidden_size=16, num_heads=1, mode="decoder", ode_steps=1, ode_use_pe=True),
     5, 33, True, 0.0, 3),
]
TIER_AFTER_ENCODER = [
    # the axes the fuzzer widened: 17 decoded tokens (past 4, 8 and 16, keys past 32); rk38 x 9 steps,
    # 36 cached evaluations (past 16 and 32); 513 keys at d_model 8, sinusoidal_rotary's default
    # 512-position table read past its end; 9 rows x 16 heads, 144 (row, head) pairs (past 64 and
    # 128), each head with its own ALiBi slope
    ("decode_tier_t33_k17_h2hd4_rope_prompt_pad", dict(hidden_size=8, num_heads=2, mode="decoder", ode_steps=1, ode_use_pe=True),
     2, 33, True, 0.0, 17),
    ("decode_tier_rk38_s9_36_evaluations_h2hd4_alibi_pad", dict(hidden_size=8, num_heads=2, mode="decoder", ode_solver="rk38",
                                                                ode_steps=9, ode_use_pe=True, positional_encoding="alibi"),
     2, 7, True, 0.0, 3),
    ("block_tier_t513_h2hd4_sinusoidal_table512_pad", dict(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=1, ode_use_pe=True,
                                                           positional_encoding="sinusoidal_rotary"), 2, 513, True, 0.0, 0),
    ("block_tier_b9_h16hd2_alibi_decoder_pad", dict(hidden_size=32, num_heads=16, mode="decoder", ode_steps=1, ode_use_pe=True,
                                                    positional_encoding="alibi"), 9, 5, True, 0.0, 0),
]
TIER_CASES = TIER_BEFORE_ENCODER + TIER_AFTER_ENCODER  # the whole kernel-boundary tier


def case_specs() -> list[CaseSpec]:
    def spec(name, config, b, t, padding, scale=1.0):
        return CaseSpec(name, config, b, t, padding, name_seed(name, "params"), name_seed(name, "input"), scale)

    specs = [spec(row_name(row), config_of(row), row["shape"][0], row["shape"][1], row["padding"]) for row in rows()]
    specs += [spec(name, R.ODEConfig(**fields), b, t, padding, scale) for name, fields, b, t, padding, scale in EDGE_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), decoded=k, kind=DECODE)
              for name, fields, b, t, padding, k in DECODE_CASES]
    specs += [dataclasses.replace(spec(name, config, b, t, padding), kind=GRAD) for name, config, b, t, padding in grad_specs()]
    specs += [spec(name, config, b, t, padding) for name, config, b, t, padding in position_specs()]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), decoded=k, kind=DECODE)
              for name, fields, b, t, padding, k in POSITION_DECODE_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), kind=GRAD)
              for name, fields, b, t, padding in POSITION_GRAD_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), offset=offset, decoded=k, kind=DECODE if k else BLOCK)
              for name, fields, b, t, padding, offset, k in TIER_BEFORE_ENCODER]
    return _unique(specs)


# Cases that prove a config field every case above leaves at its default (fields.py): the mutant
# that ignores the field must fail one. Built after the encoder cases (build_all), so that no
# earlier entry of the manifest moves. Frozen: append, never edit. (name, config fields, batch, seq, padding)
FIELD_CASES = [
    ("block_field_alibi_scale_h4_decoder_pad", dict(hidden_size=16, num_heads=4, mode="decoder", ode_use_pe=True,
                                                    positional_encoding="alibi", alibi_scale=3.0), 2, 7, True),
    ("block_field_sinusoidal_base", dict(hidden_size=12, num_heads=2, ode_use_pe=True, positional_encoding="sinusoidal_rotary",
                                         sinusoidal_base=500.0, sinusoidal_scale=0.6), 2, 9, False),
    ("block_field_hope_base_damping_decoder", dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True,
                                                   positional_encoding="hope", hope_base=500.0, hope_damping=0.2), 2, 8, False),
    ("block_field_bam_eps_mu_init_decoder", dict(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True,
                                                 positional_encoding="bam", bam_eps=0.5, bam_mu_init=0.5), 2, 6, False),
]


# The multistep solvers (ode_ref/multistep.py): each in a block case past its start, ab3 through a
# cached decoding past its start, ab2 and momentum through the backward pass; momentum at a gamma of
# its own. Frozen: append, never edit. (name, config fields, batch, seq, padding, kind, decoded)
MULTISTEP_CASES = [
    ("block_ab2_s5_encoder_pad", dict(hidden_size=8, num_heads=2, ode_solver="ab2", ode_steps=5), 2, 5, True, BLOCK, 0),
    ("block_ab3_s6_decoder_rope_bitnet_pad", dict(hidden_size=12, num_heads=3, mode="decoder", ode_solver="ab3", ode_steps=6,
                                                  use_bitnet=True, ode_use_pe=True, positional_encoding="rope"), 2, 6, True, BLOCK, 0),
    ("block_momentum_gamma_s4_rms_norm", dict(hidden_size=10, num_heads=2, norm_type="rms_norm", ode_solver="momentum",
                                              ode_steps=4, momentum_gamma=0.3), 3, 4, False, BLOCK, 0),
    ("decode_ab3_s4_alibi_pad", dict(hidden_size=8, num_heads=2, mode="decoder", ode_solver="ab3", ode_steps=4,
                                     ode_use_pe=True, positional_encoding="alibi"), 2, 7, True, DECODE, 3),
    ("grad_ab2_s3_decoder_pad", dict(hidden_size=8, num_heads=2, mode="decoder", ode_solver="ab2", ode_steps=3), 2, 5, True, GRAD, 0),
    ("grad_momentum_s3_encoder", dict(hidden_size=8, num_heads=2, ode_solver="momentum", ode_steps=3), 1, 6, False, GRAD, 0),
]


def appended_specs() -> list[CaseSpec]:
    """The specs built after the encoder cases: those appended since the encoder cases were."""
    def spec(name, fields, b, t, padding, **more):
        return CaseSpec(name, R.ODEConfig(**fields), b, t, padding, name_seed(name, "params"), name_seed(name, "input"), **more)

    return ([spec(name, fields, b, t, padding, offset=offset, decoded=k, kind=DECODE if k else BLOCK)
             for name, fields, b, t, padding, offset, k in TIER_AFTER_ENCODER]
            + [spec(*row) for row in FIELD_CASES]
            + [spec(name, fields, b, t, padding, kind=kind, decoded=k) for name, fields, b, t, padding, kind, k in MULTISTEP_CASES])


def _unique(specs: list) -> list:
    """specs, if no two share a name; ValueError naming the name otherwise."""
    seen = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"case name {s.name!r} is defined twice")
        seen.add(s.name)
    return specs


def build_case(spec: CaseSpec) -> Case:
    """The case of spec, from the spec in float64 (its kind's case), with its half fields (half_fields)."""
    cfg = spec.config
    params = R.init_params(cfg, seed=spec.param_seed, perturb_norms=True)
    x, mask, used = make_inputs(cfg, params, spec.batch, spec.seq, seed=spec.input_seed, padding=spec.padding,
                                scale=spec.scale, offset=spec.offset, decoded=spec.decoded)
    inputs = spec.kind.draw_inputs(name_seed(spec.name, "cotangent"), x.shape)
    return with_half(spec.kind.case(spec.name, cfg, params, x, mask, decoded=spec.decoded, inputs=inputs, input_seed=used,
                                    param_seed=spec.param_seed))


def at_steps(case: Case, steps: int) -> Case:
    """A block case at another step count: the same inputs, parameters and f0, with the spec's
    trajectory and float32 errors at `steps` computed here from ode_ref (no golden file holds
    them): the reference of a backend that runs a case's file at a count other than its own."""
    cfg = dataclasses.replace(case.config, ode_steps=steps)
    _, traj = R.ode_block(case.params, case.x, cfg, case.padding_mask, return_trajectory=True)
    golden = {"f0": case.f0, **{f"step_{k}": traj[k] for k in range(1, len(traj))}}
    return with_half(dataclasses.replace(case, config=cfg, trajectory=traj,
                                         e32=BLOCK.float32_errors(cfg, case.params, case.x, case.padding_mask, golden)))


def same_case(built: Case, stored: Case) -> bool:
    """Whether stored holds built's case: config, inputs and parameters bit for bit, every
    quantity within tolerance(e32, "float64") of the built one."""
    if built.config != stored.config or (built.kind, built.decoded) != (stored.kind, stored.decoded) or built.params.keys() != stored.params.keys():
        return False
    if built.inputs.keys() != stored.inputs.keys():
        return False
    for a, b in [(built.x, stored.x), (built.padding_mask, stored.padding_mask),
                 *((built.inputs[k], stored.inputs[k]) for k in built.inputs),
                 *((built.params[k], stored.params[k]) for k in built.params)]:
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            return False
    want, got = built.quantities(), stored.quantities()
    return want.keys() == got.keys() and all(
        relative_error(got[q], want[q]) <= tolerance(built.e32_of(q), "float64") for q in want)


def half_fields(case: Case, dtypes=HALF_DTYPES) -> dict:
    """The case's e16, ebf16 and half_untestable (half.py), measured on the spec: each dtype of
    dtypes has either its errors, one per quantity with an e32, or the reason it is untestable."""
    golden = {q: a for q, a in case.quantities().items() if q in case.e32}
    out, untestable = {}, {}
    for dtype in dtypes:
        errors, reason = case.kind.half_errors(case, golden, dtype)
        out[HALF_FIELDS[dtype]] = errors
        if reason is not None:
            untestable[dtype] = reason
    return {**out, "half_untestable": untestable}


def with_half(case: Case, dtypes=HALF_DTYPES) -> Case:
    """case with its half-precision fields measured (half_fields), those of dtypes."""
    return dataclasses.replace(case, **half_fields(case, dtypes))


def case_count() -> int:
    """How many cases build_all builds, without building them (a progress bar's total)."""
    return len(_unique(case_specs() + appended_specs())) + len(ENCODER_ROWS) + len(LM_ROWS) + len(SUCCESSOR_ROWS) + len(TEMPORAL_ROWS)


@functools.lru_cache(maxsize=None)
def build_all() -> tuple[Case, ...]:
    """Every case, built from the spec (kept in memory for the session): the table's, the encoder
    cases, the appended ones (appended_specs), the language model's (lm_cases.py), then the encoder's
    successors (encoder_cases.SUCCESSOR_ROWS, then TEMPORAL_ROWS)."""
    table = case_specs()
    appended = _unique(table + appended_specs())[len(table):]
    return (tuple(build_case(s) for s in table) + tuple(with_half(build_encoder_case(r)) for r in ENCODER_ROWS)
            + tuple(build_case(s) for s in appended) + tuple(with_half(build_lm_case(r)) for r in LM_ROWS)
            + tuple(with_half(build_encoder_case(r)) for r in SUCCESSOR_ROWS + TEMPORAL_ROWS))


def build_encoder_case(row) -> Case:
    """An encoder case (encoder_cases.py) from its row: its one quantity z and z's e32."""
    name = encoder_row_name(row)
    param_seed, input_seed = name_seed(name, "params"), name_seed(name, "input")
    cfg, params, x, mask = encoder_inputs(row, param_seed, input_seed)
    return ENCODER.case(name, cfg, params, x, mask, input_seed=input_seed, param_seed=param_seed)


def build_lm_case(row) -> Case:
    """A language model case (lm_cases.py) from its row: its one quantity, the logits, and their e32."""
    name = row[0]
    param_seed = name_seed(name, "params")
    cfg, params, x, mask, input_seed = lm_inputs(row, param_seed, name_seed(name, "input"))
    return LM.case(name, cfg, params, x, mask, input_seed=input_seed, param_seed=param_seed)

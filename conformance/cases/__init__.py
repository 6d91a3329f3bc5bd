"""The conformance cases: a parameter table of seeded block cases, each computed by ode_ref.

A case is named `block_<variant>` or `decode_<variant>`; the names are unique (a duplicate
raises), and a case's seeds derive from its name alone (name_seed), so adding cases never changes
an existing one. build_case runs the spec in float64 and records, per quantity, the spec's own
float32 error (e32), from which every backend's tolerance is derived (tolerance.py).

Quantities, in the order they are computed:
  block cases:  step_0 = z(0), which is x; f0 = f(0, x); step_1 .. step_n = the state after each
                step; z1 = the state at t = 1
  decode cases: prefill = z(1) of the prompt (the first seq - decoded tokens, by ode_ref.prefill),
                decode_1 .. decode_k = z(1) of each token decoded after it (ode_ref.decode_step)
  grad cases:   x_bar, then grad.<parameter> for every parameter: the block's vector-Jacobian
                product for a seeded cotangent z1_bar (ode_ref.ode_block_vjp)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Optional

import numpy as np

import ode_ref as R

from .decoding import decode_loop, run_decode, split_decoded  # noqa: F401 (re-exported: the adapters use them from here)
from .encoder_cases import ENCODER_ROWS, e32_of, encoder_inputs, row_name as encoder_row_name, spec_z
from ode_ref.precision import HALF_DTYPES, check_half_dtype

from .fair import make_inputs
from .half import HALF_FIELDS, cast, half_errors
from .matrix import OPTION_FIELDS, config_of, pairwise, row_name, rows
from .tolerance import relative_error, tolerance

CASES_VERSION = 2  # bump when an existing case's definition changes; checked against the manifest


def name_seed(name: str, purpose: str) -> int:
    """A case's seed for `purpose` ('params' or 'input'): the first 4 bytes of sha256(name/purpose)."""
    return int.from_bytes(hashlib.sha256(f"{name}/{purpose}".encode()).digest()[:4], "little")


@dataclass(frozen=True)
class CaseSpec:
    """How to build one case: a config, the seeds, the input shape and scale."""

    name: str
    config: R.ODEConfig
    batch: int
    seq: int
    padding: bool
    param_seed: int
    input_seed: int
    scale: float = 1.0  # standard deviation of x
    decoded: int = 0  # a decode case: the last `decoded` tokens are decoded one by one after a prefill
    vjp: bool = False  # a grad case: the block's backward pass for a seeded cotangent
    offset: float = 0.0  # x = scale * (offset + N(0, 1)): an input centred far from zero

    @property
    def kind(self) -> str:
        return "decode" if self.decoded else "grad" if self.vjp else "block"


# A case's kinds: what it checks, and the field that holds its golden outputs.
KINDS = {"block": "trajectory", "decode": "decode", "grad": "grads", "encoder": "encoder_outputs"}


@dataclass(frozen=True)
class Case:
    """A built case: inputs, parameters and the spec's float64 outputs.

    kind says what it checks (KINDS): block, the block's f0 and trajectory; decode, cached decoding
    of its last `decoded` tokens; grad, the block's backward pass for the cotangent z1_bar; encoder,
    the ODE Transformer encoder stack's output. Every behaviour that depends on the kind is a method
    here, so the rest of the suite asks the case rather than reading its optional fields."""

    name: str
    config: R.ODEConfig
    params: dict  # name -> float64 array
    x: np.ndarray  # float64 (batch, seq, d_model)
    padding_mask: Optional[np.ndarray]  # bool (batch, seq)
    f0: Optional[np.ndarray]  # f(0, x), float64 (block cases)
    trajectory: Optional[np.ndarray]  # (steps + 1, batch, seq, d_model); [0] = x, [-1] = z1 (block cases)
    e32: dict  # quantity -> the spec's own float32 relative error (z1: that of the last step)
    kind: str = "block"  # one of KINDS
    input_seed: int = 0  # the seed of the fair draw actually used
    param_seed: int = 0
    decoded: int = 0  # decode cases: tokens decoded after the prompt
    decode: Optional[np.ndarray] = None  # decode cases: (batch, seq, d_model), the prompt's z then each token's
    z1_bar: Optional[np.ndarray] = None  # grad cases: the cotangent of z(1), (batch, seq, d_model)
    grads: Optional[dict] = None  # grad cases: x_bar and grad.<parameter>, float64
    encoder_outputs: Optional[dict] = None  # encoder cases (encoder_cases.py): {"z": the stack's output}; config an ODEEncoderConfig
    e16: Optional[dict] = None  # quantity -> the spec's error under the half policy in float16 (half.py); None: untestable or not stored
    ebf16: Optional[dict] = None  # the same in bfloat16
    half_untestable: Optional[dict] = None  # dtype -> why the case has no meaning in it (half.py); None or {}: none

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name!r}: kind: expected one of {', '.join(KINDS)}; got {self.kind!r}")
        if getattr(self, KINDS[self.kind]) is None or (self.kind == "grad" and self.z1_bar is None):
            raise ValueError(f"case {self.name!r}: a {self.kind} case needs its {KINDS[self.kind]}; got None")

    @property
    def z1(self) -> np.ndarray:
        return self.trajectory[-1]

    @property
    def prompt(self) -> int:
        return self.x.shape[1] - self.decoded

    def quantities(self) -> dict:
        """name -> float64 golden array, in the order computed; step_0 is z(0) (the stored
        trajectory's first state, which is x), z1 the last step's state."""
        if self.kind == "encoder":
            return dict(self.encoder_outputs)
        if self.kind == "decode":
            return split_decoded(self.decode, self.prompt)
        if self.kind == "grad":
            return dict(self.grads)
        out = {"step_0": self.trajectory[0], "f0": self.f0}
        out.update({f"step_{k}": self.trajectory[k] for k in range(1, len(self.trajectory))})
        out["z1"] = self.z1
        return out

    def e32_of(self, quantity: str) -> float:
        """The spec's own float32 error of a quantity (z1 is the last step's state). z(0) is x, the
        input itself, computed by nothing: no e32 is stored for it and its tolerance is the floor,
        a few roundings of x to the backend's dtype."""
        if quantity == "step_0":
            return 0.0
        return self.e32[f"step_{self.config.ode_steps}" if quantity == "z1" else quantity]

    def untestable(self, dtype: str) -> Optional[str]:
        """Why the case has no meaning in dtype (float16 or bfloat16), or None: the stored reason
        (half.py's rules), or that the golden set stores no error for dtype (a team's own set)."""
        check_half_dtype(dtype)
        reason = (self.half_untestable or {}).get(dtype)
        if reason is None and getattr(self, HALF_FIELDS[dtype]) is None:
            return f"no {HALF_FIELDS[dtype]} in this golden set"
        return reason

    def e_half(self, dtype: str) -> dict:
        """quantity -> the spec's own error under the half policy in dtype, for every quantity of
        quantities() (z1: the last step's; step_0, x itself: 0, the tolerance's floor).
        ValueError if the case is untestable in dtype (untestable says why)."""
        reason = self.untestable(dtype)
        if reason is not None:
            raise ValueError(f"case {self.name!r} has no {HALF_FIELDS[dtype]}: {reason}")
        stored = dict(getattr(self, HALF_FIELDS[dtype]))
        if self.kind == "block":
            stored.update(step_0=0.0, z1=stored[f"step_{self.config.ode_steps}"])
        return stored

    def inputs(self, dtype: str) -> dict:
        """The backend's call arguments besides config, params, x and the mask (worker.attempt's
        decoded, z1_bar and encoder), z1_bar cast to dtype."""
        return {"decoded": self.decoded, "z1_bar": cast(self.z1_bar, dtype) if self.kind == "grad" else None,
                "encoder": self.kind == "encoder"}

    def stored_outputs(self) -> dict:
        """The arrays of its golden file besides the inputs and parameters (golden.py)."""
        if self.kind == "decode":
            return {"decode": self.decode}
        if self.kind == "grad":
            return {"z1_bar": self.z1_bar, **self.grads}
        if self.kind == "encoder":
            return dict(self.encoder_outputs)
        return {"f0": self.f0, "trajectory": self.trajectory}

    def manifest_flags(self) -> dict:
        """Its kind as the manifest records it: decoded, vjp or encoder, absent for a block case."""
        return {"decode": {"decoded": self.decoded}, "grad": {"vjp": True}, "encoder": {"encoder": True}}.get(self.kind, {})

    def reply_states(self) -> int:
        """How many (batch, seq, d_model) states its outputs hold, at most, besides f0, x and z1:
        the trajectory's steps; an encoder case's z alone."""
        return 1 if self.kind == "encoder" else self.config.ode_steps

    def split_outputs(self, outputs: dict) -> dict:
        """A backend's raw outputs (f0, trajectory or z1; a decode run; x_bar and grad.<parameter>;
        z) as quantity -> array, in the order computed; ValueError for a decode run or a trajectory
        of the wrong shape."""
        if self.kind in ("grad", "encoder"):
            return dict(outputs)  # checked against the golden set by runner.compare
        if self.kind == "decode":
            z = np.asarray(outputs["decode"])
            if z.shape != self.x.shape:
                raise ValueError(f"run_decode: expected shape {self.x.shape} (the prompt's z, then each token's); got {z.shape}")
            return split_decoded(z, self.prompt)
        out = {}
        traj = None
        if "trajectory" in outputs:
            traj = np.asarray(outputs["trajectory"])
            if traj.shape[:1] != (self.config.ode_steps + 1,):
                raise ValueError(f"run_trajectory: expected {self.config.ode_steps + 1} states; got shape {traj.shape}")
            out["step_0"] = traj[0]  # every state is checked, the first too: z(0) is x, and a wrong one fails
        if "f0" in outputs:
            out["f0"] = outputs["f0"]
        if traj is not None:
            out.update({f"step_{k}": traj[k] for k in range(1, len(traj))})
            out["z1"] = traj[-1]
        elif "z1" in outputs:
            out["z1"] = outputs["z1"]
        return out


def quantity_names(config, decoded: int = 0, vjp: bool = False) -> list:
    """The quantities with a stored e32: a block case's, a decode case's or a grad case's."""
    if vjp:
        return ["x_bar"] + [f"grad.{name}" for name in R.param_shapes(config)]
    if decoded:
        return ["prefill"] + [f"decode_{j}" for j in range(1, decoded + 1)]
    return ["f0"] + [f"step_{k}" for k in range(1, config.ode_steps + 1)]


def vjp_quantities(config, params, x, padding_mask, z1_bar) -> dict:
    """The spec's backward pass as quantities: x_bar, then grad.<parameter> in parameter order
    (the parameters cast to x's dtype, as a backend receives them)."""
    params = {k: np.asarray(v, dtype=x.dtype) for k, v in params.items()}
    x_bar, params_bar = R.ode_block_vjp(params, x, config, z1_bar, padding_mask)
    return {"x_bar": x_bar, **{f"grad.{name}": params_bar[name] for name in R.param_shapes(config)}}


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
# the prompt, decoded tokens). A backend runs them through run_decode (adapters.py).
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
TIER_CASES = [
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


def case_specs() -> list[CaseSpec]:
    def spec(name, config, b, t, padding, scale=1.0):
        return CaseSpec(name, config, b, t, padding, name_seed(name, "params"), name_seed(name, "input"), scale)

    specs = [spec(row_name(row), config_of(row), row["shape"][0], row["shape"][1], row["padding"]) for row in rows()]
    specs += [spec(name, R.ODEConfig(**fields), b, t, padding, scale) for name, fields, b, t, padding, scale in EDGE_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), decoded=k)
              for name, fields, b, t, padding, k in DECODE_CASES]
    specs += [dataclasses.replace(spec(name, config, b, t, padding), vjp=True) for name, config, b, t, padding in grad_specs()]
    specs += [spec(name, config, b, t, padding) for name, config, b, t, padding in position_specs()]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), decoded=k)
              for name, fields, b, t, padding, k in POSITION_DECODE_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), vjp=True)
              for name, fields, b, t, padding in POSITION_GRAD_CASES]
    specs += [dataclasses.replace(spec(name, R.ODEConfig(**fields), b, t, padding), offset=offset, decoded=k)
              for name, fields, b, t, padding, offset, k in TIER_CASES]
    seen = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"case name {s.name!r} is defined twice")
        seen.add(s.name)
    return specs


def float32_errors(config, params, x, padding_mask, golden: dict, *, decoded: int = 0, z1_bar=None, trajectory32=None) -> dict:
    """The spec's own float32 error of each quantity, e32 = relative_error(spec32, golden), from
    float64 inputs and the float64 quantities golden (quantity -> array, those of
    Case.quantities() that carry an e32): what the generator stores, and what loading a team's
    set recomputes to bound the e32 it stores (golden.py). trajectory32: the spec's float32
    trajectory of a block case where the caller has it (fair.fair_forwards'), not run again."""
    x32 = x.astype(np.float32)
    if isinstance(config, R.ODEEncoderConfig):  # an encoder case (encoder_cases.py): its one quantity z
        return {"z": relative_error(R.ode_encoder(params, x32, config, padding_mask), golden["z"])}
    if decoded:
        prompt = x.shape[1] - decoded
        z32 = split_decoded(run_decode(config, params, x32, padding_mask, prompt), prompt)
    elif z1_bar is not None:
        z32 = vjp_quantities(config, params, x32, padding_mask, z1_bar.astype(np.float32))
    else:
        z32 = {"f0": R.ode_func(params, 0.0, x32, config, padding_mask)}
        traj32 = R.ode_block(params, x32, config, padding_mask, return_trajectory=True)[1] if trajectory32 is None else trajectory32
        z32.update({f"step_{k}": traj32[k] for k in range(1, len(traj32))})
    return {q: relative_error(z32[q], golden[q]) for q in quantity_names(config, decoded, z1_bar is not None)}


def build_case(spec: CaseSpec) -> Case:
    """The case of spec, from the spec in float64, with its e32 and its half fields (half_fields)."""
    return with_half(_build_case(spec))


def _build_case(spec: CaseSpec) -> Case:
    cfg = spec.config
    params = R.init_params(cfg, seed=spec.param_seed, perturb_norms=True)
    x, mask, used = make_inputs(cfg, params, spec.batch, spec.seq, seed=spec.input_seed, padding=spec.padding,
                                scale=spec.scale, offset=spec.offset, decoded=spec.decoded)
    if spec.kind == "decode":
        prompt = spec.seq - spec.decoded
        z = run_decode(cfg, params, x, mask, prompt)
        e32 = float32_errors(cfg, params, x, mask, split_decoded(z, prompt), decoded=spec.decoded)
        return Case(spec.name, cfg, params, x, mask, None, None, e32, "decode", input_seed=used, param_seed=spec.param_seed,
                    decoded=spec.decoded, decode=z)
    if spec.kind == "grad":
        z1_bar = np.random.default_rng(name_seed(spec.name, "cotangent")).normal(size=x.shape)
        grads = vjp_quantities(cfg, params, x, mask, z1_bar)
        e32 = float32_errors(cfg, params, x, mask, grads, z1_bar=z1_bar)
        return Case(spec.name, cfg, params, x, mask, None, None, e32, "grad", input_seed=used, param_seed=spec.param_seed,
                    z1_bar=z1_bar, grads=grads)
    f0 = R.ode_func(params, 0.0, x, cfg, mask)
    _, traj = R.ode_block(params, x, cfg, mask, return_trajectory=True)
    e32 = float32_errors(cfg, params, x, mask, {"f0": f0, **{f"step_{k}": traj[k] for k in range(1, len(traj))}})
    return Case(spec.name, cfg, params, x, mask, f0, traj, e32, input_seed=used, param_seed=spec.param_seed)


def at_steps(case: Case, steps: int) -> Case:
    """A block case at another step count: the same inputs, parameters and f0, with the spec's
    trajectory and float32 errors at `steps` computed here from ode_ref (no golden file holds
    them): the reference of a backend that runs a case's file at a count other than its own."""
    cfg = dataclasses.replace(case.config, ode_steps=steps)
    _, traj = R.ode_block(case.params, case.x, cfg, case.padding_mask, return_trajectory=True)
    golden = {"f0": case.f0, **{f"step_{k}": traj[k] for k in range(1, len(traj))}}
    return with_half(dataclasses.replace(case, config=cfg, trajectory=traj,
                                         e32=float32_errors(cfg, case.params, case.x, case.padding_mask, golden)))


def same_case(built: Case, stored: Case) -> bool:
    """Whether stored holds built's case: config, inputs and parameters bit for bit, every
    quantity within tolerance(e32, "float64") of the built one."""
    if built.config != stored.config or (built.kind, built.decoded) != (stored.kind, stored.decoded) or built.params.keys() != stored.params.keys():
        return False
    for a, b in [(built.x, stored.x), (built.padding_mask, stored.padding_mask), (built.z1_bar, stored.z1_bar),
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
        errors, reason = half_errors(case.config, case.params, case.x, case.padding_mask, golden, dtype=dtype,
                                     decoded=case.decoded, vjp=case.kind == "grad", encoder=case.kind == "encoder")
        out[HALF_FIELDS[dtype]] = errors
        if reason is not None:
            untestable[dtype] = reason
    return {**out, "half_untestable": untestable}


def with_half(case: Case, dtypes=HALF_DTYPES) -> Case:
    """case with its half-precision fields measured (half_fields), those of dtypes."""
    return dataclasses.replace(case, **half_fields(case, dtypes))


@functools.lru_cache(maxsize=None)
def build_all() -> tuple[Case, ...]:
    """Every case, built from the spec (kept in memory for the session); the encoder cases last."""
    return tuple(build_case(s) for s in case_specs()) + tuple(with_half(build_encoder_case(r)) for r in ENCODER_ROWS)


def build_encoder_case(row) -> Case:
    """An encoder case (encoder_cases.py) from its row: its one quantity z and z's e32."""
    name = encoder_row_name(row)
    param_seed, input_seed = name_seed(name, "params"), name_seed(name, "input")
    cfg, params, x, mask = encoder_inputs(row, param_seed, input_seed)
    z = spec_z(cfg, params, x, mask)
    return Case(name, cfg, params, x, mask, None, None, {"z": e32_of(cfg, params, x, mask, z)}, "encoder",
                input_seed=input_seed, param_seed=param_seed, encoder_outputs={"z": z})

"""The encoder cases: the ODE Transformer's stack (ode_ref.ode_encoder) as conformance cases.

A pairwise cover of family x profile x norm placement x padding x depth, written out (ENCODER_ROWS):
every valid pair of two factors' values appears in some row (euler has no released block, so
that pair is not valid), twelve rows in all, each a JAX compilation. A case's seeds derive from
its name (cases.name_seed), as for every case; cases.build_encoder_case builds it. Its one quantity, z, is the stack's output (after
the final layer_norm when pre-norm), which a backend returns from its optional run_encoder
(protocol.py); its e32 is the spec's own float32 error of z (kinds.ENCODER.float32_errors).

Also here, for the ports' tests: the spec's central difference of <z_bar, ode_encoder> along a
direction (central_difference), the reference of every port's gradients.
"""

from __future__ import annotations

import itertools

import numpy as np

import ode_ref as R
from ode_ref.encoder_config import RELEASED_FAMILIES

FAMILY_PROFILES = [(f, p) for f in R.FAMILIES for p in R.PROFILES if p == "paper" or f in RELEASED_FAMILIES]

# (family, profile, pre-norm, padding, layers, (batch, seq, heads, C, ffn_dim)); frozen: append only
ENCODER_ROWS = [
    ("euler", "paper", False, False, 1, (2, 5, 2, 8, 12)),
    ("euler", "paper", True, True, 2, (3, 6, 3, 12, 20)),
    ("rk2", "paper", False, True, 2, (2, 5, 2, 8, 12)),
    ("rk2", "released", True, False, 1, (1, 4, 1, 6, 10)),
    ("rk3", "paper", True, False, 2, (2, 5, 2, 8, 12)),
    ("rk3", "released", False, True, 1, (3, 6, 3, 12, 20)),
    ("rk4", "paper", True, True, 1, (2, 5, 2, 8, 12)),
    ("rk4", "released", False, False, 2, (1, 4, 1, 6, 10)),
    ("rk2_gated", "paper", True, False, 1, (3, 6, 3, 12, 20)),
    ("rk2_gated", "released", False, True, 2, (2, 5, 2, 8, 12)),
    ("rk2_weighted", "paper", False, True, 1, (1, 4, 1, 6, 10)),
    ("rk2_weighted", "released", True, False, 2, (2, 5, 2, 8, 12)),
]
FACTORS = ("family", "profile", "pre", "padding", "layers")

# The ODE Transformer's successors (ode_ref/encoder_config.py): the Macaron layer and PCformer's
# predictor and corrector, each field off its default in some row, crossed with the factors above.
# A row as above with the config's further fields last; built after the language model's cases.
# Frozen: append only.
_C = R.CORRECTOR
SUCCESSOR_ROWS = [
    ("rk2", "paper", False, True, 2, (2, 5, 2, 8, 12), {"macaron": True}),
    ("rk4", "released", True, False, 1, (1, 4, 1, 6, 10), {"macaron": True, "macaron_profile": "released"}),
    ("euler", "paper", True, True, 2, (3, 6, 3, 12, 20), {"macaron": True}),
    ("rk2_ema", "released", False, True, 2, (2, 5, 2, 8, 12), {"encoder_history_type": _C}),
    ("rk4_ema", "released", True, False, 3, (2, 5, 2, 8, 12), {"encoder_history_type": _C, "layer_wise": True}),
    ("rk3_ema", "released", True, True, 2, (1, 4, 1, 6, 10), {}),
    ("rk4_ema", "paper", False, False, 1, (3, 6, 3, 12, 20), {"alpha_type": "vector"}),
    ("rk2_ema", "released", True, True, 2, (2, 5, 2, 8, 12), {"alpha_type": "vector", "encoder_history_type": _C, "macaron": True}),
    ("rk2_gated", "released", False, False, 2, (1, 4, 1, 6, 10), {"encoder_history_type": _C}),
]
# qkvflow's time-dependent weights (ode_ref/temporal.py): Euler steps of one shared block, pre-norm,
# causal; layers is the step count. Built after the successors. Frozen: append only.
_HOLDS = ("euler", "paper", True)
TEMPORAL_ROWS = [
    (*_HOLDS, True, 3, (2, 5, 2, 8, 12), {"time_embed_dim": 4, "sinusoidal_dim": 2}),
    (*_HOLDS, False, 1, (1, 4, 1, 6, 10), {"time_embed_dim": 3, "sinusoidal_dim": 4}),
    (*_HOLDS, True, 4, (3, 6, 3, 12, 20), {"time_embed_dim": 5}),
]
_TAGS = {"time_embed_dim": "temb{}", "sinusoidal_dim": "sin{}",
         "macaron": "macaron", "macaron_profile": "macaron{}", "encoder_history_type": "corrector", "layer_wise": "layerwise",
         "alpha_type": "alpha{}"}


def covered_pairs(rows=ENCODER_ROWS) -> set:
    """((factor, value), (factor, value)) of every pair of two factors some row holds."""
    return {((a, row[i]), (b, row[j])) for row in rows for (i, a), (j, b) in itertools.combinations(enumerate(FACTORS), 2)}


def row_name(row) -> str:
    family, profile, pre, padding, layers, (b, t, h, c, ff), *more = row
    tags = "".join(f"_{_TAGS[k].format(v)}" for k, v in (more[0] if more else {}).items())
    return (f"encoder_{family}_{profile}_{'pre' if pre else 'post'}_{'pad' if padding else 'nopad'}_l{layers}"
            f"_b{b}t{t}h{h}c{c}f{ff}{tags}")


def padding_of(batch: int, seq: int):
    """The cases' padding: the last sequence's last seq // 2 tokens padded (the others unpadded)."""
    mask = np.ones((batch, seq), bool)
    mask[-1, seq - seq // 2:] = False
    return mask


def encoder_inputs(row, param_seed: int, input_seed: int):
    """(config, params, x, padding_mask) of a row, drawn from its seeds (cases.build_encoder_case)."""
    family, profile, pre, padding, layers, (b, t, h, c, ff), *more = row
    cfg = R.ODEEncoderConfig(c, h, ff, encoder_layers=layers, encoder_normalize_before=pre, family=family, profile=profile,
                             **(more[0] if more else {}))
    params = R.init_encoder_params(cfg, param_seed, perturb=True)
    x = np.random.default_rng(input_seed).normal(size=(b, t, c))
    return cfg, params, x, padding_of(b, t) if padding else None


def central_difference(config, params, x, padding_mask, z_bar, direction: dict, eps: float = 1e-6) -> float:
    """(J(p + eps d) - J(p - eps d)) / (2 eps), J = sum(z_bar * ode_encoder(p)), p = x and the
    parameters (direction: 'x' and parameter names -> arrays of their shapes), in float64."""
    def objective(sign):
        moved = {k: v + sign * eps * direction[k] for k, v in params.items()}
        return float((z_bar * R.ode_encoder(moved, x + sign * eps * direction["x"], config, padding_mask)).sum())

    return (objective(1.0) - objective(-1.0)) / (2 * eps)

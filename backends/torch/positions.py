"""Positional encodings in PyTorch: only what differs from ode_ref/positions.py, whose functions the
port's stages run over torch (apply_rope, alibi_bias, the PaPE terms, ...; xp.py). The angles, cos
and sin (and hope's tables, BAM's bias, SSMax's ln) are computed in float64 torch ops on the
positions' device (the spec's float64 constants), then rounded once to the state's dtype, as the
spec decides. The seed's encoder parameters live in PosEncoder, under the seed's names."""

from __future__ import annotations

import torch
from torch import nn

from ode_ref.params import encoder_shapes
from ode_ref.positions import BAM_FLOOR, HOPE_ANGLE_LIMIT, hope_gain, rope_frequencies, rotary_base_scaling, rotary_frequencies


@torch.compiler.assume_constant_result
def _constants(name: str, config) -> list:
    """The spec's float64 constants as Python floats (torch.compile folds them, unread by tracing)."""
    if name == "hope":
        return rotary_frequencies(config.head_dim // 2, config.hope_base).tolist()
    return rope_frequencies(config).tolist()


def rope_cos_sin(positions, config, dtype):
    """(cos, sin), each (batch | 1, seq, P) in dtype, of the float64 angles (p * scaling) * frequency
    (rope's or sinusoidal_rotary's base and scaling)."""
    freq = torch.tensor(_constants("rope", config), dtype=torch.float64, device=positions.device)
    angles = (positions.to(torch.float64) * rotary_base_scaling(config)[1])[..., None] * freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def hope_angles(positions, config, layer_idx: int):
    """float64 (..., P): clip(p * frequency_i * g, -12, 12)."""
    freq = torch.tensor(_constants("hope", config), dtype=torch.float64, device=positions.device)
    p = positions.to(torch.float64)[..., None]
    return (p * freq * hope_gain(layer_idx)).clamp(-HOPE_ANGLE_LIMIT, HOPE_ANGLE_LIMIT)


def hope_damping(positions, config, layer_idx: int):
    """float64 (..., 1): r = exp(-hope_damping * g * p)."""
    return torch.exp(-config.hope_damping * hope_gain(layer_idx) * positions.to(torch.float64)[..., None])


def hope_tables(positions, config, layer_idx: int, dtype):
    """(r cosh a, r sinh a), each (batch | 1, seq, P) in dtype, from float64 a and r."""
    a, r = hope_angles(positions, config, layer_idx), hope_damping(positions, config, layer_idx)
    return (r * a.cosh()).to(dtype), (r * a.sinh()).to(dtype)


def bam_alpha_beta(theta_alpha, theta_beta):
    """float64 (alpha, beta), each (H,): alpha = exp(-theta_beta * theta_alpha), beta = theta_beta."""
    ta, tb = theta_alpha.to(torch.float64), theta_beta.to(torch.float64)
    return torch.exp(-tb * ta), tb


def bam_mu(encoder: dict, config):
    """float64 (H,): theta_mu when learnable, else bam_mu_init for every head."""
    if config.bam_learn_mu:
        return encoder["theta_mu"].to(torch.float64)
    like = encoder["theta_alpha"]
    return torch.full((config.num_heads,), config.bam_mu_init, dtype=torch.float64, device=like.device)


def bam_bias(encoder: dict, positions_q, positions_k, config, dtype, mu=None):
    """(batch | 1, heads, seq_q, seq_k) in dtype: -(|p_j - alpha_h p_i - mu_h| + eps) ** beta_h in
    float64, floored at BAM_FLOOR. mu: bam_mu's, unless given."""
    f64 = torch.float64
    alpha, beta = bam_alpha_beta(encoder["theta_alpha"], encoder["theta_beta"])
    mu = bam_mu(encoder, config) if mu is None else torch.as_tensor(mu, dtype=f64, device=alpha.device)
    pq = positions_q.to(f64)[:, None, :, None]
    pk = positions_k.to(f64)[:, None, None, :]
    h = (slice(None), None, None)
    bias = -((pk - alpha[h] * pq - mu[h]).abs() + config.bam_eps) ** beta[h]
    return bias.clamp(min=BAM_FLOOR).to(dtype)


def ssmax_factor(s, lengths, dtype):
    """(batch | 1, heads, seq_q, 1) in dtype: s_h * ln(max(n, 1)), ln in float64."""
    log_n = lengths.clamp(min=1).to(torch.float64).log().to(dtype)
    return s.to(dtype)[None, :, None, None] * log_n[:, None, :, None]


class SSMax(nn.Module):
    """The seed's SSMax: s (heads,), initial ssmax_s_init."""

    def __init__(self, config):
        super().__init__()
        self.s = nn.Parameter(torch.full((config.num_heads,), config.ssmax_s_init))


class PosEncoder(nn.Module):
    """The seed's encoder parameters, under its names (ode_ref.params.encoder_shapes): pape's
    position and ab, pape_ri's a and position_scales (a saved parameter here), bam's thetas, ssmax.
    Initialised as the spec's init_params without perturbation, with this module's RNG."""

    def __init__(self, config):
        super().__init__()
        shapes = encoder_shapes(config)
        h = config.num_heads
        for name in ("position", "ab", "a"):
            if name + ".weight" in shapes:
                out_features, in_features = shapes[name + ".weight"]
                setattr(self, name, nn.Linear(in_features, out_features, bias=False))
        if "position_scales" in shapes:
            self.position_scales = nn.Parameter(torch.empty(1, h, 1, 1).uniform_(0.5, 1.5))
        for name, start in (("theta_alpha", config.bam_theta_init), ("theta_beta", config.bam_theta_init),
                            ("theta_mu", config.bam_mu_init)):
            if name in shapes:
                setattr(self, name, nn.Parameter(torch.full((h,), start)))
        if "ssmax.s" in shapes:
            self.ssmax = SSMax(config)

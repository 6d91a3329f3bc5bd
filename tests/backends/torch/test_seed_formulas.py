"""The positional family checked against the seed's own formulas (docs/positions.md), written
here from them and independently of the ports: the seed's widened q and k for PaPE, its -inf mask,
then the bias, then SSMax's s * ln(T) of the padded length. The torch port equals this block to
1e-12 in float64; the seed's float32 steps (sinusoidal tables, PaPE positions, BAM's mu) are
checked through the spec's documented ones."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from ode_ref import positions as P  # noqa: E402
from odeattn.backends.torch import ODEAttentionBlock  # noqa: E402

F64 = torch.float64


def inv_freq(pairs, base):
    i = torch.arange(pairs, dtype=F64)
    return base ** (-i / (pairs - 1)) if pairs > 1 else torch.ones(1, dtype=F64)


def pairwise(x, fn):
    """Apply fn(even, odd) -> (even', odd') to the interleaved pairs of x (..., d); an odd last channel kept."""
    pairs = x.shape[-1] // 2
    e, o = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    e2, o2 = fn(e, o)
    return torch.cat([torch.stack([e2, o2], dim=-1).flatten(-2), x[..., 2 * pairs:]], dim=-1)


def widen(q, k, q_cols, k_cols):
    """q, k (B, H, T, d) widened by columns (B, H, T, n), zero-padded to a multiple of 8."""
    n = q_cols.shape[-1]
    pad = (-(q.shape[-1] + n)) % 8
    zq, zk = q.new_zeros(*q.shape[:-1], pad), k.new_zeros(*k.shape[:-1], pad)
    return torch.cat([q, q_cols, zq], -1), torch.cat([k, k_cols, zk], -1)


def seed_f(p, z, c, layer_idx=0, table=None, mu=None):
    """The seed's f with its encoder: z (B, T, D) float64, p the parameters by the seed's names."""
    b, t_len, dim = z.shape
    heads, hd = c.num_heads, c.hidden_size // c.num_heads
    pairs, enc = hd // 2, c.positional_encoding
    h = torch.nn.functional.layer_norm(z, (dim,), p["ode_func.norm.weight"], p["ode_func.norm.bias"], 1e-5)
    q, k, v = (h @ p["ode_func.qkv.weight"].T).view(b, t_len, 3, heads, hd).permute(2, 0, 3, 1, 4)  # (B, H, T, d)
    t = torch.arange(t_len, dtype=F64)
    if enc == "sinusoidal_rotary":
        cos, sin = table if table is not None else (
            torch.cos(t[:, None] * c.sinusoidal_scale * inv_freq(pairs, c.sinusoidal_base)),
            torch.sin(t[:, None] * c.sinusoidal_scale * inv_freq(pairs, c.sinusoidal_base)))
        q, k = (pairwise(a, lambda e, o: (e * cos - o * sin, e * sin + o * cos)) for a in (q, k))
    if enc == "hope":
        g = 1 + 0.05 * layer_idx
        a = torch.clamp(t[:, None] * inv_freq(pairs, c.hope_base) * g, -12, 12)
        r = torch.exp(-c.hope_damping * g * t)[:, None]
        q, k = (pairwise(x, lambda e, o: (r * (e * torch.cosh(a) + o * torch.sinh(a)),
                                          r * (e * torch.sinh(a) + o * torch.cosh(a)))) for x in (q, k))
    i = t.to(torch.float32).to(F64) if enc == "pape" else t  # pape casts positions to float32
    i = i.view(1, 1, t_len, 1)
    if enc in ("pape", "pape_efficient"):
        m = c.pape_num_parabolas
        coef = (z @ p["pos_encoder.ab.weight"].T).view(b, t_len, 2, heads, m).permute(2, 0, 3, 1, 4)  # (2, B, H, T, M)
        a, bb = torch.log1p(torch.exp(coef[0])), coef[1]
        w = p["pos_encoder.position.weight"].view(1, heads, 1, m)
        q_cols = torch.cat([-a * w ** 2 * i ** 2 + bb * w * i, 2 * a * w ** 2 * i, -a * w ** 2, -bb * w], -1)
        one = torch.ones(b, heads, t_len, m, dtype=F64)
        k_cols = torch.cat([one, i * one, i ** 2 * one, i * one], -1)
        q, k = widen(q, k, q_cols, k_cols)
    if enc == "pape_ri":
        a = torch.log1p(torch.exp(z @ p["pos_encoder.a.weight"].T)).permute(0, 2, 1)[..., None]  # (B, H, T, 1)
        s2 = c.pape_num_positions * p["pos_encoder.position_scales"] ** 2
        q_cols = torch.cat([-a * s2 * i ** 2, 2 * a * s2 * i, -a * s2], -1)
        one = torch.ones(b, heads, t_len, 1, dtype=F64)
        k_cols = torch.cat([one, i * one, i ** 2 * one], -1)
        q, k = widen(q, k, q_cols, k_cols)
    s = (q @ k.transpose(-2, -1)) * hd ** -0.5  # the original head_dim's scale, widened or not
    if c.mode == "decoder":
        s = s.masked_fill(torch.ones(t_len, t_len, dtype=torch.bool).triu(1), -math.inf)
    if enc == "bam":
        ta, tb = p["pos_encoder.theta_alpha"], p["pos_encoder.theta_beta"]
        alpha, beta = torch.exp(-tb * ta).view(heads, 1, 1), tb.view(heads, 1, 1)
        mu = (p["pos_encoder.theta_mu"] if c.bam_learn_mu else torch.full((heads,), c.bam_mu_init, dtype=F64)
              ) if mu is None else mu
        s = s - (torch.abs(t.view(1, -1) - alpha * t.view(-1, 1) - mu.view(heads, 1, 1)) + c.bam_eps) ** beta
    if c.use_ssmax:
        s = s * (p["pos_encoder.ssmax.s"].view(heads, 1, 1) * math.log(t_len))  # T: the padded length
    y = (torch.softmax(s, -1) @ v).permute(0, 2, 1, 3).reshape(b, t_len, dim)
    return y @ p["ode_func.out_proj.weight"].T


def seed_block(p, x, c, **kw):
    """Classical RK4 over ode_steps steps of seed_f."""
    z, dt = x, 1.0 / c.ode_steps
    for _ in range(c.ode_steps):
        k1 = seed_f(p, z, c, **kw)
        k2 = seed_f(p, z + dt / 2 * k1, c, **kw)
        k3 = seed_f(p, z + dt / 2 * k2, c, **kw)
        k4 = seed_f(p, z + dt * k3, c, **kw)
        z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return z


def config(encoding, **kw):
    return R.ODEConfig(**{**dict(hidden_size=15, num_heads=3, ode_use_pe=True, positional_encoding=encoding,
                                 pape_num_parabolas=2, layer_idx=2, ode_solver="rk4", ode_steps=2,
                                 ssmax_length="padded"), **kw})


def port_and_seed(c, seed=0, **kw):
    p = R.init_params(c, seed=seed, perturb_norms=True)
    x = np.random.default_rng(seed).normal(size=(2, 6, c.hidden_size))
    block = ODEAttentionBlock.from_params(c, p, dtype=F64)
    with torch.no_grad():
        got = block(torch.from_numpy(x)).numpy()
    pt = {k: torch.from_numpy(v) for k, v in p.items()}
    want = seed_block(pt, torch.from_numpy(x), c, layer_idx=c.layer_idx, **kw).numpy()
    return got, want, p, x


@pytest.mark.parametrize("mode", ["encoder", "decoder"])
@pytest.mark.parametrize("ssmax", [False, True])
@pytest.mark.parametrize("encoding", ["sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam"])
def test_the_torch_port_is_the_seeds_formula(encoding, ssmax, mode):
    """head_dim 5 (an odd channel kept), M = 2 parabolas, hope at layer 2, the seed's padded SSMax."""
    c = config(encoding, use_ssmax=ssmax, mode=mode, pape_num_positions=3 if encoding == "pape_ri" else 1)
    got, want, _, _ = port_and_seed(c)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()


def test_bam_with_a_learnable_mu_is_the_seeds_formula():
    got, want, _, _ = port_and_seed(config("bam", bam_learn_mu=True, mode="decoder"))
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()


def seed_float32_table(c, t_len):
    """The seed's float32 sinusoidal table, rebuilt here: float32 positions, scale and frequencies."""
    pairs = c.head_dim // 2
    freq = inv_freq(pairs, c.sinusoidal_base).to(torch.float32)
    angles = (torch.arange(c.sinusoidal_max_len, dtype=torch.float32) * c.sinusoidal_scale)[:, None] * freq
    return torch.cos(angles)[:t_len].to(F64), torch.sin(angles)[:t_len].to(F64)


def test_the_seeds_float32_sinusoidal_tables_through_the_specs_documented_step():
    c = config("sinusoidal_rotary", hidden_size=48, sinusoidal_scale=37.0)  # head_dim 16; angles up to 185 rad
    cos, sin = seed_float32_table(c, c.sinusoidal_max_len)
    cos_spec, sin_spec = P.seed_sinusoidal_table(c)
    # the same float32 angles; float32 cos and sin differ by up to one ulp (2^-24 below 1) between torch and NumPy
    np.testing.assert_allclose(cos.numpy(), cos_spec, rtol=0, atol=2.0 ** -24)
    np.testing.assert_allclose(sin.numpy(), sin_spec, rtol=0, atol=2.0 ** -24)
    got, want32, _, _ = port_and_seed(c, table=seed_float32_table(c, 6))  # the seed's block on its float32 table
    _, want64, _, _ = port_and_seed(c)
    assert np.abs(got - want64).max() <= 1e-12 * np.abs(want64).max()
    moved = np.abs(want32 - want64).max() / np.abs(want64).max()
    assert 1e-9 < moved < 1e-6  # the seed's float32 table moves the output; docs/positions.md gives the size


def test_papes_float32_positions_change_nothing():
    t = torch.arange(1 << 12, dtype=F64)
    assert torch.equal(t.to(torch.float32).to(F64), t)  # integers below 2^24 are exact in float32
    got, want, _, _ = port_and_seed(config("pape", mode="decoder"))  # seed_f casts pape's positions
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()


def test_bams_mu_rounded_to_float32_through_the_specs_documented_step():
    mu = 0.3
    mu32 = float(np.float32(mu))
    c = config("bam", bam_mu_init=mu, mode="decoder")
    got, want32, p, x = port_and_seed(c, mu=torch.full((3,), mu32, dtype=F64))
    _, want64, _, _ = port_and_seed(c)
    assert np.abs(got - want64).max() <= 1e-12 * np.abs(want64).max()
    enc = {"theta_alpha": p["pos_encoder.theta_alpha"], "theta_beta": p["pos_encoder.theta_beta"]}
    pos = np.arange(6)[None]
    seeds = P.bam_bias(enc, pos, pos, c, np.float64, mu=np.full(3, np.float32(mu)))  # the documented float32 mu
    ours = P.bam_bias(enc, pos, pos, c, np.float64)
    assert 0 < np.abs(seeds - ours).max() < 1e-7  # |mu - float32(mu)| = 1.2e-8, times |beta| (|.| + eps) ** (beta - 1)
    moved = np.abs(want32 - want64).max() / np.abs(want64).max()
    assert 0 < moved < 1e-7

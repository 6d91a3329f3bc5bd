"""The positional family in the PyTorch port: the seed's state_dict names, strict loading of a
seed checkpoint with its doubled encoder keys, and the refusals. Values: the goldens and
test_seed_formulas.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from odeattn.backends.torch import ODEAttentionBlock, ODEFunc, state_dict_to_params  # noqa: E402


def cfg(encoding, **kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True,
                                 positional_encoding=encoding), **kw})


def run(block, x, **kw):
    with torch.no_grad():
        return block(torch.from_numpy(x), **kw).numpy()


X = np.random.default_rng(0).normal(size=(2, 5, 12))


@pytest.mark.parametrize("encoding, keys", [
    ("pape", ["position.weight", "ab.weight"]),
    ("pape_efficient", ["position.weight", "ab.weight"]),
    ("pape_ri", ["position_scales", "a.weight"]),
    ("bam", ["theta_alpha", "theta_beta"]),
    ("hope", []),
    ("sinusoidal_rotary", []),
])
def test_the_state_dict_holds_each_encoder_tensor_twice_as_the_seeds_does(encoding, keys):
    sd = ODEAttentionBlock(cfg(encoding, use_ssmax=True)).state_dict()
    keys = keys + ["ssmax.s"]
    assert [k for k in sd if k.startswith("ode_func.pos_encoder.")] == ["ode_func.pos_encoder." + k for k in keys]
    assert [k for k in sd if k.startswith("pos_encoder.")] == ["pos_encoder." + k for k in keys]
    block = ODEAttentionBlock(cfg(encoding, use_ssmax=True))
    assert block.pos_encoder is block.ode_func.pos_encoder  # one shared encoder


def test_bams_mu_is_a_parameter_only_when_learnable():
    assert "pos_encoder.theta_mu" in ODEAttentionBlock(cfg("bam", bam_learn_mu=True)).state_dict()
    assert "pos_encoder.theta_mu" not in ODEAttentionBlock(cfg("bam")).state_dict()
    c = cfg("bam", bam_mu_init=0.75)
    p = R.init_params(c, seed=1, perturb_norms=True)
    block = ODEAttentionBlock.from_params(c, p, dtype=torch.float64)
    np.testing.assert_allclose(run(block, X), R.ode_block(p, X, c), rtol=0, atol=1e-13)  # mu from the config


def seed_checkpoint(c, seed=2):
    """A state_dict as the seed saves it: every encoder tensor under both keys."""
    block = ODEAttentionBlock(c).double()
    torch.manual_seed(seed)
    for p in block.parameters():
        p.data.uniform_(-0.5, 0.5)
    return {k: v.clone() for k, v in block.state_dict().items()}


@pytest.mark.parametrize("encoding", ["pape", "pape_ri", "bam"])
def test_a_seed_checkpoint_loads_strict_and_pos_encoder_wins_when_the_keys_differ(encoding):
    c = cfg(encoding, use_ssmax=True)
    sd = seed_checkpoint(c)
    name = {"pape": "ab.weight", "pape_ri": "a.weight", "bam": "theta_beta"}[encoding]
    sd["ode_func.pos_encoder." + name] = sd["pos_encoder." + name] + 1.0  # the two keys now differ
    block = ODEAttentionBlock(c).double()
    block.load_state_dict(sd, strict=True)
    got = dict(block.pos_encoder.named_parameters())[name]
    assert torch.equal(got, sd["pos_encoder." + name])
    assert torch.equal(dict(block.ode_func.pos_encoder.named_parameters())[name], sd["pos_encoder." + name])
    params = state_dict_to_params(sd)  # the spec's parameters: pos_encoder.X, once
    assert "ode_func.pos_encoder." + name not in params
    np.testing.assert_array_equal(params["pos_encoder." + name], sd["pos_encoder." + name].numpy())
    np.testing.assert_allclose(run(block, X), R.ode_block(params, X, c), rtol=0, atol=1e-13)


def test_a_checkpoint_with_either_key_alone_loads():
    c = cfg("pape")
    sd = seed_checkpoint(c)
    for drop in ("pos_encoder.", "ode_func.pos_encoder."):
        half = {k: v for k, v in sd.items() if not k.startswith(drop)}
        block = ODEAttentionBlock(c).double()
        block.load_state_dict(half, strict=True)
        assert torch.equal(block.pos_encoder.ab.weight, sd["pos_encoder.ab.weight"])


def test_a_pape_ri_seed_checkpoint_without_its_scales_is_refused_saying_why():
    c = cfg("pape_ri")
    sd = {k: v for k, v in seed_checkpoint(c).items() if not k.endswith("position_scales")}
    with pytest.raises(ValueError, match="^pos_encoder.position_scales: missing. pape_ri's per-head scales are a "
                                         "non-persistent buffer in the seed"):
        ODEAttentionBlock(c).double().load_state_dict(sd)


def test_a_pape_checkpoint_with_a_wrong_shaped_ab_weight_is_refused_by_name():
    c = cfg("pape")
    sd = seed_checkpoint(c)
    sd["pos_encoder.ab.weight"] = torch.zeros(2 * 3 * 2, 12, dtype=torch.float64)  # M = 2, not 4
    sd["ode_func.pos_encoder.ab.weight"] = sd["pos_encoder.ab.weight"]
    with pytest.raises(ValueError, match=r"^params\['pos_encoder.ab.weight'\]: expected shape \(24, 12\); got \(12, 12\)"):
        ODEAttentionBlock(c).double().load_state_dict(sd)


def test_logical_layer_idx_is_hopes_layer_for_that_call():
    c = cfg("hope")
    p = R.init_params(c, seed=3)
    block = ODEAttentionBlock.from_params(c, p, dtype=torch.float64)
    want = R.ode_block(p, X, cfg("hope", layer_idx=4))
    np.testing.assert_allclose(run(block, X, logical_layer_idx=4), want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(run(block, X), R.ode_block(p, X, c), rtol=0, atol=1e-13)  # None: the config's 0
    f = ODEFunc(c).double()
    f.load_state_dict({k[len("ode_func."):]: torch.from_numpy(v) for k, v in p.items()})
    with torch.no_grad():
        got = f(0.0, torch.from_numpy(X), 4).numpy()
    np.testing.assert_allclose(got, R.ode_func(p, 0.0, X, cfg("hope", layer_idx=4)), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="logical_layer_idx: expected an integer >= 0 or None; got -1"):
        block(torch.from_numpy(X), -1)


def test_cached_decoding_refuses_the_seeds_padded_ssmax_rule_by_name():
    c = cfg("bam", use_ssmax=True, ssmax_length="padded")
    block = ODEAttentionBlock.from_params(c, R.init_params(c), dtype=torch.float64)
    with pytest.raises(ValueError, match="^ssmax_length: cached decoding needs ssmax_length='visible'"):
        block.prefill(torch.from_numpy(X), max_len=8)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hopes_gradient_is_the_specs_where_sdpa_takes_its_fused_kernel(dtype):
    """hope's logits (about 1e10) make attention rows exactly one-hot, where the scores' exact
    gradient is 0. From seq 8 on, SDPA's CPU kernel left a rounding there, which hope's r cosh(a)
    carried into x_bar: 38 (float64) and 9 (float32) times the golden rule's tolerance at this
    smallest case (one head of width 4, Euler, one step). Written out: 0.02 times."""
    from ode_ref.backward import ode_block_vjp
    from odeattn.conformance.cases.tolerance import relative_error, tolerance

    c = R.ODEConfig(hidden_size=4, num_heads=1, ode_solver="euler", ode_steps=1, positional_encoding="hope",
                    ode_use_pe=True)
    p, rng = R.init_params(c, seed=0), np.random.default_rng(0)
    x, z1_bar = rng.normal(size=(1, 8, 4)), rng.normal(size=(1, 8, 4))
    want = ode_block_vjp(p, x, c, z1_bar)[0]
    e32 = relative_error(ode_block_vjp({k: v.astype(np.float32) for k, v in p.items()}, x.astype(np.float32), c,
                                       z1_bar.astype(np.float32))[0], want)
    block = ODEAttentionBlock.from_params(c, p, dtype=getattr(torch, dtype))
    xt = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
    block(xt).backward(torch.tensor(z1_bar, dtype=getattr(torch, dtype)))
    assert relative_error(xt.grad.double().numpy(), want) <= tolerance(e32, dtype)

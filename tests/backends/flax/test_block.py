"""The Flax block: equal to the spec (float64 to 1e-12) in the forward and in cached decoding, with
the spec's init, the state_dict converters, and the other ports' errors for bad input."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases import run_decode
from odeattn.conformance.cases.tolerance import relative_error

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402

from odeattn.backends import flax as F  # noqa: E402

FLOAT64 = 1e-12  # a port in float64 runs the spec's arithmetic in another library
DECODER = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, use_bitnet=True, norm_type="derf",
                      ode_solver="heun")
MAX_LEN = 6


def inputs(cfg, batch=2, seq=MAX_LEN, seed=0):
    x = np.random.default_rng(seed).normal(size=(batch, seq, cfg.hidden_size))
    mask = np.ones((batch, seq), bool)
    mask[1, :2] = False  # left padding
    return x, mask


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("backends/flax/test_block")


@pytest.fixture(scope="session")
def decoding():
    """(prefill, step): module.apply of the decoder block under jax.jit, with mutable=['cache']."""
    block = F.ODEAttentionBlock(config=DECODER, max_len=MAX_LEN)
    prefill = jax.jit(lambda v, x, m: block.apply(v, x, padding_mask=m, mutable=["cache"]))
    step = jax.jit(lambda v, x_t: block.apply(v, x_t, mutable=["cache"]))
    return prefill, step


@pytest.mark.parametrize("fields", [
    dict(hidden_size=12, num_heads=3, ode_use_pe=True, positional_encoding="alibi", norm_type="dynamic_tanh"),
    dict(hidden_size=8, num_heads=2, mode="decoder", ode_solver="rk2_gated", ode_use_pe=True, norm_type="flash_norm",
         use_bitnet=True),
    dict(hidden_size=12, num_heads=3, ode_use_pe=True, positional_encoding="pape", use_ssmax=True),
    dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True, positional_encoding="bam", bam_learn_mu=True,
         use_ssmax=True, ssmax_length="padded"),
    dict(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True, positional_encoding="pape_ri"),
    dict(hidden_size=12, num_heads=3, ode_use_pe=True, positional_encoding="hope", layer_idx=2),
], ids=["encoder-alibi", "decoder-gated-rope-bitnet", "encoder-pape-ssmax", "decoder-bam-ssmax-padded-rule",
        "decoder-pape_ri", "encoder-hope"])
def test_the_forward_equals_the_spec(fields):
    cfg = R.ODEConfig(**fields)
    params = R.init_params(cfg, seed=3, perturb_norms=True)
    x, mask = inputs(cfg, seq=5)
    block = F.ODEAttentionBlock(config=cfg)
    with jax.enable_x64(True):
        z, trajectory = jax.jit(lambda v, x, m: block.apply(v, x, padding_mask=m, return_trajectory=True))(
            F.from_state_dict(cfg, params), x, mask)
    want, want_trajectory = R.ode_block(params, x, cfg, mask, return_trajectory=True)
    assert z.dtype == jnp.float64 and relative_error(z, want) <= FLOAT64
    assert relative_error(trajectory, want_trajectory) <= FLOAT64


def test_cached_decoding_equals_the_spec_in_one_compilation(decoding):
    prefill, step = decoding
    params = R.init_params(DECODER, seed=4, perturb_norms=True)
    x, mask = inputs(DECODER)
    want = run_decode(DECODER, params, x, mask, 3)
    with jax.enable_x64(True):
        variables = F.from_state_dict(DECODER, params)
        z, state = prefill(variables, x[:, :3], mask[:, :3])
        cache = state["cache"]
        assert cache["cached_key"].shape == (2 * 2, 2, MAX_LEN, 2, 4)  # 2 steps x 2 stages, batch, max_len, heads, head_dim
        assert int(cache["cache_index"]) == 3 and cache["padding_mask"].shape == (2, MAX_LEN)
        out = [z]
        for i in range(3, MAX_LEN):
            z_t, state = step({**variables, **state}, x[:, i:i + 1])
            out.append(z_t)
        assert step._cache_size() == 1  # one compilation decodes every position
        assert relative_error(np.concatenate(out, axis=1), want) <= FLOAT64
        with pytest.raises(jax.errors.JaxRuntimeError, match=r"cache: full \(6 of 6 slots written\)"):
            jax.block_until_ready(step({**variables, **state}, x[:, :1]))
        block = F.ODEAttentionBlock(config=DECODER, max_len=MAX_LEN)
        with pytest.raises(ValueError, match=r"^cache: full \(6 of 6 slots written\); prefill with a larger max_len"):
            block.apply({**variables, **state}, x[:, :1], mutable=["cache"])  # outside jit: the spec's own error
        with pytest.raises(ValueError, match=r"^x_t: expected shape \(2, 1, 8\)"):
            block.apply({**variables, **state}, x[:, :2], mutable=["cache"])


@pytest.mark.parametrize("encoding", ["pape_efficient+ssmax", "bam"])
def test_cached_decoding_of_the_positional_family_equals_the_spec(encoding):
    name, _, ssmax = encoding.partition("+")
    cfg = R.ODEConfig(**{**DECODER.to_dict(), "positional_encoding": name, "use_ssmax": bool(ssmax)})
    params = R.init_params(cfg, seed=4, perturb_norms=True)
    x, mask = inputs(cfg)
    block = F.ODEAttentionBlock(config=cfg, max_len=MAX_LEN)
    with jax.enable_x64(True):
        variables = F.from_state_dict(cfg, params)
        z, state = block.apply(variables, x[:, :3], padding_mask=mask[:, :3], mutable=["cache"])
        out = [z]
        for i in range(3, MAX_LEN):
            z_t, state = block.apply({**variables, **state}, x[:, i:i + 1], mutable=["cache"])
            out.append(z_t)
    assert relative_error(np.concatenate(out, axis=1), run_decode(cfg, params, x, mask, 3)) <= FLOAT64


@pytest.mark.parametrize("encoding", ["pape", "pape_ri", "bam"])
def test_the_encoder_s_parameters_take_the_seed_s_names_and_the_spec_s_init(encoding):
    """pos_encoder.<name> in the spec's order and shapes; PaPE's weights U(-1/sqrt(fan_in), +),
    pape_ri's scales U(0.5, 1.5), BAM's thetas and SSMax's s the config's constants."""
    cfg = R.ODEConfig(hidden_size=64, num_heads=4, ode_use_pe=True, positional_encoding=encoding, use_ssmax=True,
                      bam_learn_mu=True, bam_theta_init=0.25, bam_mu_init=-0.5, ssmax_s_init=0.75)
    variables = F.ODEAttentionBlock(config=cfg).init(jax.random.key(0), jnp.zeros((1, 2, 64)))
    params = F.to_state_dict(variables)
    assert list(params) == list(R.param_shapes(cfg))
    assert {k: tuple(v.shape) for k, v in params.items()} == R.param_shapes(cfg)
    encoder = {k[len("pos_encoder."):]: np.asarray(v) for k, v in params.items() if k.startswith("pos_encoder.")}
    for name, value in encoder.items():
        if name.endswith(".weight"):
            bound = value.shape[1] ** -0.5
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound, name
        elif name == "position_scales":
            assert 0.5 <= value.min() and value.max() <= 1.5 and value.max() - value.min() > 0.1
        else:
            want = {"theta_alpha": 0.25, "theta_beta": 0.25, "theta_mu": -0.5, "ssmax.s": 0.75}[name]
            assert (value == np.float32(want)).all(), name
    back = F.from_state_dict(cfg, {k: np.asarray(v) for k, v in params.items()})
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(variables)


def test_init_draws_the_spec_s_distributions():
    cfg = R.ODEConfig(hidden_size=64, num_heads=4, norm_type="derf", ode_solver="rk2_gated", ode_steps=1)
    variables = F.ODEAttentionBlock(config=cfg).init(jax.random.key(0), jnp.zeros((1, 2, 64)))
    params = F.to_state_dict(variables)
    assert list(params) == list(R.param_shapes(cfg))
    assert {k: tuple(v.shape) for k, v in params.items()} == R.param_shapes(cfg)
    bound = 64**-0.5
    for name in ("ode_func.qkv.weight", "ode_func.out_proj.weight"):
        w = np.asarray(params[name])
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound and abs(w.mean()) < 0.01 * bound
    gate = np.asarray(params["gate.weight"])
    xavier = np.sqrt(6.0 / (2 * 64 + 1))
    assert np.abs(gate).max() <= xavier and np.abs(gate).max() > 0.8 * xavier
    identity = {"alpha": 1.0, "s": 0.0, "gamma": 1.0, "beta": 0.0}
    for short, value in identity.items():
        assert (np.asarray(params[f"ode_func.norm.{short}"]) == value).all(), short
    assert (np.asarray(params["gate.bias"]) == 0).all()


def test_the_converters_are_inverses_and_check_the_config():
    params = R.init_params(DECODER, seed=2, perturb_norms=True, dtype=np.float32)
    variables = F.from_state_dict(DECODER, params)
    assert variables["params"]["ode_func"]["c_attn"]["kernel"].shape == (8, 24)  # Flax's Dense layout
    back = F.to_state_dict(variables)
    assert list(back) == list(params) and all((np.asarray(back[k]) == params[k]).all() for k in params)
    other = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder")
    with pytest.raises(ValueError, match=r"^params: for norm_type='layer_norm'.*missing \['ode_func.norm.weight'"):
        F.from_state_dict(other, params)
    x, _ = inputs(other, seq=3)
    with pytest.raises(ValueError, match=r"^params: for norm_type='layer_norm'"):  # at apply: the spec's error, not Flax's
        F.ODEAttentionBlock(config=other).apply(variables, x.astype(np.float32))
    with pytest.raises(TypeError, match=r"got float64 but JAX's x64 mode is off"):  # never float32 silently
        F.from_state_dict(DECODER, {k: v.astype(np.float64) for k, v in params.items()})


def test_bad_input_gets_the_other_ports_errors():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    variables = F.from_state_dict(cfg, R.init_params(cfg, dtype=np.float32))
    block = F.ODEAttentionBlock(config=cfg, max_len=8)
    x = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"^padding_mask: expected shape \(2, 4\) \(batch, seq\); got \(2, 3\)"):
        block.apply(variables, x, padding_mask=jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match=r"^mode: cached decoding needs mode='decoder'"):
        block.apply(variables, x, mutable=["cache"])
    with pytest.raises(ValueError, match=r"^x: expected shape \(batch, seq, 8\)"):
        block.apply(variables, x[..., :6])
    with pytest.raises(TypeError, match=r"^deterministic: expected True or False; got 'no'"):
        block.apply(variables, x, deterministic="no")
    assert np.array_equal(block.apply(variables, x, deterministic=np.bool_(True)), block.apply(variables, x))  # NumPy's bool too
    with pytest.raises(ValueError, match=r"^max_len: expected an integer >= the prompt's length 4; got None"):
        decoder = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder")
        F.ODEAttentionBlock(config=decoder).apply(F.from_state_dict(decoder, R.init_params(decoder, dtype=np.float32)), x,
                                                  mutable=["cache"])
    with pytest.raises(ValueError, match=r"^attention: its config .* differs from config"):
        F.ODEAttentionBlock(config=cfg, attention=F.SelfAttention(config=R.ODEConfig(hidden_size=8, num_heads=4))).apply(
            variables, x)
    with pytest.raises(TypeError, match=r"^attention: expected a subclass or an instance of odeattn.backends.flax.SelfAttention"):
        F.ODEAttentionBlock(config=cfg, attention=R.SelfAttention(cfg)).apply(variables, x)


def test_the_face_s_own_mistakes_get_one_error_naming_the_field():
    """What Flax or JAX would answer with its own traceback (or, for a cache left in the variables
    without mutable=['cache'], a plain forward on the one token), each refused by name, eagerly
    and under jax.jit (names, shapes and dtypes are static)."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", dropout=0.1)
    variables = F.from_state_dict(cfg, R.init_params(cfg, dtype=np.float32))
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    block = F.ODEAttentionBlock(config=cfg, max_len=5)
    _, state = block.apply(variables, x, mutable=["cache"])
    step = jax.jit(lambda v, x_t: block.apply(v, x_t, mutable=["cache"]))
    cache = state["cache"]
    bad = {
        "float-index": ({**cache, "cache_index": jnp.float32(4.0)},
                        TypeError, r"^cache_index: expected an integer scalar \(the next slot, int32\); got float32 of shape \(\)"),
        "missing-key": ({k: v for k, v in cache.items() if k != "cached_key"},
                        ValueError, r"^cache: expected the variables cached_key, .*; missing cached_key"),
        "short-key": ({**cache, "cached_key": cache["cached_key"][:, :, :3]},
                      ValueError, r"^cached_key: expected shape \(8, 1, 5, 2, 4\) \(evaluations, batch, max_len"),
    }
    for name, (broken, error, message) in bad.items():
        for run in (lambda v: block.apply(v, x[:, :1], mutable=["cache"]), lambda v: step(v, x[:, :1])):
            with pytest.raises(error, match=message):
                run({**variables, "cache": broken})
    with pytest.raises(TypeError, match=r"^cached_value: expected dtype float32 \(cached_key's\); got float16"):
        block.apply({**variables, "cache": {**cache, "cached_value": cache["cached_value"].astype(jnp.float16)}}, x[:, :1],
                    mutable=["cache"])
    with pytest.raises(TypeError, match=r"^return_trajectory: expected True or False; got 'yes'"):
        block.apply(variables, x, return_trajectory="yes")
    with pytest.raises(TypeError, match=r"^x: expected a jax.Array; got list"):
        block.apply(variables, x.tolist())
    with pytest.raises(TypeError, match=r"^variables: expected a dict"):
        F.to_state_dict(None)
    with pytest.raises(ValueError, match=r"^cache: the variables hold a cache but 'cache' is not mutable"):
        block.apply({**variables, **state}, x[:, :1])  # was a plain forward on one token, 20% off
    rngs = r"^rngs: deterministic=False drops at the config's rate 0.1, which needs a 'dropout' key"
    with pytest.raises(ValueError, match=rngs):
        block.apply(variables, x, deterministic=False)
    with pytest.raises(ValueError, match=rngs):
        F.SelfAttention(config=cfg).apply({"params": variables["params"]["ode_func"]}, x, deterministic=False)
    wide = R.ODEConfig(hidden_size=16, num_heads=2, mode="decoder")
    wide_variables = F.from_state_dict(wide, R.init_params(wide, dtype=np.float32))
    with pytest.raises(ValueError, match=r"^params\['ode_func.qkv.weight'\]: expected shape \(24, 8\); got \(48, 16\)"):
        F.SelfAttention(config=cfg).apply({"params": wide_variables["params"]["ode_func"]}, x)  # was Flax's ScopeParamShapeError
    encoder, wide_encoder = R.ODEEncoderConfig(8, 2, 12, dropout=0.1), R.ODEEncoderConfig(16, 2, 12)
    encoder_params = {k: v.astype(np.float32) for k, v in R.init_encoder_params(encoder, 0).items()}
    encoder_variables = F.encoder.from_state_dict(encoder, encoder_params)
    with pytest.raises(ValueError, match=rngs):
        F.ODEEncoder(config=encoder).apply(encoder_variables, x, deterministic=False)
    wide_params = {k: v.astype(np.float32) for k, v in R.init_encoder_params(wide_encoder, 0).items()}
    with pytest.raises(ValueError, match=r"^params\['layers.0.self_attn.in_proj_weight'\]: expected shape \(24, 8\)"):
        F.ODEEncoder(config=encoder).apply(F.encoder.from_state_dict(wide_encoder, wide_params), x)


def test_jit_decode_checks_the_cache_before_the_compiled_step():
    """Past max_len under a plain jax.jit the check runs in a callback, whose error JAX wraps;
    jit_decode checks the concrete cache first: the spec's one-line error, and one compilation."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder")
    variables = F.from_state_dict(cfg, R.init_params(cfg, dtype=np.float32))
    x = np.random.default_rng(0).normal(size=(1, 6, 8)).astype(np.float32)
    block = F.ODEAttentionBlock(config=cfg, max_len=5)
    want = block.apply(variables, x[:, :5])
    z, state = block.apply(variables, x[:, :3], mutable=["cache"])
    decode, out = F.jit_decode(block), [z]
    for i in range(3, 5):
        z_t, state = decode({**variables, **state}, x[:, i:i + 1])
        out.append(z_t)
    assert relative_error(np.concatenate(out, axis=1), want) < 1e-5  # float32 rounding only
    with pytest.raises(ValueError, match=r"^cache: full \(5 of 5 slots written\); prefill with a larger max_len$"):
        decode({**variables, **state}, x[:, 5:])
    with pytest.raises(ValueError, match=r"^cache: a decode step needs the variables with the prefill's 'cache'"):
        decode(variables, x[:, 5:])

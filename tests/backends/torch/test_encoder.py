"""The torch encoder (odeattn.backends.torch.encoder) against the spec: float64 to 1e-12, float32
within the suite's tolerance rule, autograd against central differences of the spec, the released
state_dict keys loading strict, and dropout drawn at every stage evaluation in training."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from ode_ref.encoder_backward import ode_encoder_vjp  # noqa: E402
from odeattn.backends.torch import ODEEncoder, ODEEncoderLayer, load_encoder_params  # noqa: E402
from odeattn.conformance.cases.encoder_cases import FAMILY_PROFILES, SUCCESSOR_ROWS, central_difference  # noqa: E402
from odeattn.conformance.cases.kinds import ENCODER  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

C, H, FF = 8, 2, 12


def config(family="rk2", profile="paper", pre=False, layers=2, **more):
    return R.ODEEncoderConfig(C, H, FF, encoder_layers=layers, family=family, profile=profile,
                              encoder_normalize_before=pre, **more)


def inputs(cfg, seed=0):
    params = R.init_encoder_params(cfg, seed, perturb=True)
    x = np.random.default_rng(seed).normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    return params, x, mask


def run(cfg, params, x, mask, dtype):
    encoder = ODEEncoder.from_params(cfg, params, dtype=dtype)
    with torch.no_grad():
        return encoder(torch.as_tensor(x, dtype=dtype), torch.as_tensor(mask)).numpy()


SUCCESSORS = [(r[0], r[1], r[2], r[6]) for r in SUCCESSOR_ROWS]
TEMPORAL = {"time_embed_dim": 4, "sinusoidal_dim": 2}  # qkvflow's stack (ode_ref/temporal.py)


@pytest.mark.parametrize("family, profile, pre, more", [(f, p, pre, {}) for f, p in FAMILY_PROFILES for pre in (False, True)]
                         + SUCCESSORS + [("euler", "paper", True, TEMPORAL)])
def test_equal_to_the_spec(family, profile, pre, more):
    cfg = config(family, profile, pre, **more)
    params, x, mask = inputs(cfg)
    want = R.ode_encoder(params, x, cfg, mask)
    assert relative_error(run(cfg, params, x, mask, torch.float64), want) < 1e-12
    got32 = run(cfg, params, x, mask, torch.float32)
    assert got32.dtype == np.float32
    assert relative_error(got32, want) <= tolerance(ENCODER.float32_errors(cfg, params, x, mask, {"z": want})["z"], "float32")


def test_the_layer_alone_is_the_specs_euler_block_minus_nothing():
    """ODEEncoderLayer is L: under the paper profile, euler's block y + (L(y) - y) is L(y)."""
    cfg = config("euler", layers=1)
    params, x, mask = inputs(cfg)
    layer = ODEEncoderLayer(cfg).double().eval()
    layer.load_state_dict({k[len("layers.0."):]: torch.as_tensor(v) for k, v in params.items()}, strict=True)
    with torch.no_grad():
        got = layer(torch.as_tensor(x), torch.as_tensor(mask)).numpy()
    assert relative_error(got, R.ode_encoder(params, x, cfg, mask)) < 1e-12


def test_the_state_dict_keys_are_the_released_ones_and_load_strict():
    cfg = config("rk2_gated", pre=True)
    encoder = ODEEncoder(cfg)
    assert list(encoder.state_dict()) == list(R.encoder_param_shapes(cfg))
    assert {k: tuple(v.shape) for k, v in encoder.state_dict().items()} == R.encoder_param_shapes(cfg)
    # a released checkpoint holds the embedding too: stack_params leaves it out, the rest loads strict
    released = {"embed_tokens.weight": torch.zeros(10, C), "version": torch.ones(1),
                **{k: torch.as_tensor(v, dtype=torch.float32) for k, v in R.init_encoder_params(cfg, 3, perturb=True).items()}}
    load_encoder_params(encoder, released)
    assert torch.equal(encoder.gate_linear.bias, released["gate_linear.bias"])
    with pytest.raises(ValueError, match=r"unexpected \['decoder.layers.0.fc1.bias'\]"):
        load_encoder_params(encoder, {**released, "decoder.layers.0.fc1.bias": torch.zeros(FF)})


def released_pcformer_state_dict(cfg, seed: int = 0) -> dict:
    """A state_dict under PCformer's released keys, drawn key by key: its fairseq 0.10 layers
    (self_attn.q_proj, k_proj, v_proj, out_proj, fc1, fc2, self_attn_layer_norm, final_layer_norm),
    alpha, history.* (the LM code's, weight_c included) and the embedding's."""
    rng = np.random.default_rng(seed)
    c, ff = cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim
    layer = {**{f"self_attn.{p}_proj.weight": (c, c) for p in "qkvo"}, **{f"self_attn.{p}_proj.bias": (c,) for p in "qkvo"},
             "fc1.weight": (ff, c), "fc1.bias": (ff,), "fc2.weight": (c, ff), "fc2.bias": (c,),
             **{f"{n}.{w}": (c,) for n in ("self_attn_layer_norm", "final_layer_norm") for w in ("weight", "bias")}}
    shapes = {"embed_tokens.weight": (10, c), "version": (1,),
              **{f"layers.{i}.{k.replace('o_proj', 'out_proj')}": s for i in range(cfg.encoder_layers) for k, s in layer.items()},
              **{k: s for k, s in R.encoder_param_shapes(cfg).items() if not k.startswith("layers.")}}
    return {k: torch.as_tensor(rng.normal(size=s) * 0.3) for k, s in shapes.items()}


@pytest.mark.parametrize("more", [dict(family="rk2_ema", encoder_history_type=R.CORRECTOR, encoder_normalize_before=True),
                                  dict(family="rk4_ema", alpha_type="vector", encoder_history_type=R.CORRECTOR)])
def test_a_released_pcformer_state_dict_loads_strict(more):
    """PCformer's keys (its layers', alpha, history.*) load strict; the module then computes the
    spec on them with q, k and v stacked as in_proj's rows, as fairseq's own upgrade splits it. Its
    NMT code's checkpoint, without history.weight_c, is refused naming it; so is a half-split layer."""
    cfg = R.ODEEncoderConfig(C, H, FF, encoder_layers=2, profile="released", **more)
    released = released_pcformer_state_dict(cfg)
    encoder = ODEEncoder(cfg).double().eval()
    load_encoder_params(encoder, released)
    spec = {k: v.numpy() for k, v in released.items() if not k.startswith(("embed_tokens", "version"))}
    for i in range(cfg.encoder_layers):
        for kind in ("weight", "bias"):
            spec[f"layers.{i}.self_attn.in_proj_{kind}"] = np.concatenate(
                [spec.pop(f"layers.{i}.self_attn.{p}_proj.{kind}") for p in "qkv"])
        for old, new in (("self_attn_layer_norm", "layer_norms.0"), ("final_layer_norm", "layer_norms.1")):
            for kind in ("weight", "bias"):
                spec[f"layers.{i}.{new}.{kind}"] = spec.pop(f"layers.{i}.{old}.{kind}")
    x = np.random.default_rng(1).normal(size=(2, 5, C))
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    with torch.no_grad():
        got = encoder(torch.as_tensor(x), torch.as_tensor(mask)).numpy()
    assert relative_error(got, R.ode_encoder(spec, x, cfg, mask)) < 1e-12
    with pytest.raises(ValueError, match=r"missing \['history.weight_c'\]"):
        load_encoder_params(encoder, {k: v for k, v in released.items() if k != "history.weight_c"})
    with pytest.raises(ValueError, match=r"missing \['layers.0.self_attn.in_proj_weight'\], unexpected \['layers.0.self_attn.k_proj"):
        load_encoder_params(encoder, {k: v for k, v in released.items() if k != "layers.0.self_attn.q_proj.weight"})


def test_a_released_macaron_state_dict_loads_strict():
    """macaron-net's keys (macaron_fc1, macaron_fc2, layer_norms.2) are the module's own."""
    cfg = config("rk2", "released", pre=True, macaron=True, macaron_profile="released")
    encoder = ODEEncoder(cfg)
    keys = list(encoder.state_dict())
    assert keys[:16] == [f"layers.0.{n}" for n in (
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "macaron_fc1.weight", "macaron_fc1.bias", "macaron_fc2.weight",
        "macaron_fc2.bias", "layer_norms.0.weight", "layer_norms.0.bias", "layer_norms.1.weight", "layer_norms.1.bias")]
    params, x, mask = inputs(cfg)
    encoder.double().eval().load_state_dict({k: torch.as_tensor(v) for k, v in params.items()}, strict=True)
    with torch.no_grad():
        got = encoder(torch.as_tensor(x), torch.as_tensor(mask)).numpy()
    assert relative_error(got, R.ode_encoder(params, x, cfg, mask)) < 1e-12


def test_init_is_the_released_one():
    torch.manual_seed(0)
    encoder = ODEEncoder(R.ODEEncoderConfig(64, 4, 256, family="rk2_weighted"))
    w = encoder.layers[0].fc1.weight.detach()
    assert float(w.abs().max()) <= (6 / (256 + 64)) ** 0.5
    assert all(float(p.detach().abs().max()) == 0 for n, p in encoder.named_parameters() if n.endswith("bias"))
    assert torch.equal(encoder.alpha, torch.ones(2))
    pc = ODEEncoder(R.ODEEncoderConfig(8, 2, 12, encoder_layers=2, family="rk2_ema", layer_wise=True, encoder_history_type=R.CORRECTOR))
    assert torch.equal(pc.alpha, torch.full((2, 1), 0.5))  # PCformer's alpha.data.fill_(0.5)
    for w in (pc.history.weight, pc.history.weight_c):  # row r: 1 / (r + 1) in its first r + 1 entries
        assert w[0].tolist() == [1.0, 0.0, 0.0] and w[1].tolist() == [0.5, 0.5, 0.0] and torch.equal(w[2], torch.full((3,), 1 / 3))


def test_the_time_dependent_stack_holds_the_released_paths_and_init():
    """qkvflow's stack: one block under the released module paths, no layers; f_weight and f_bias 0
    (each norm LayerNorm's identity at init), f_b 1e-4 N(0, 1), ln_f 1 and 0; a state_dict in those
    keys loads strict."""
    torch.manual_seed(0)
    cfg = config("euler", pre=True, **TEMPORAL)
    encoder = ODEEncoder(cfg)
    state = encoder.state_dict()
    assert set(state) == set(R.encoder_param_shapes(cfg)) and not hasattr(encoder, "layers")
    assert not state["block.mlp_ln.f_weight"].any() and not state["block.attn_ln.f_bias"].any()
    assert 0 < float(state["block.mlp.c_fc.f_b"].abs().max()) < 1e-3 and torch.equal(state["ln_f.weight"], torch.ones(C))
    params = R.init_encoder_params(cfg, 3, perturb=True)
    load_encoder_params(encoder, params)
    assert torch.equal(encoder.block.attn.c_attn.f_W.weight, torch.as_tensor(params["block.attn.c_attn.f_W.weight"], dtype=torch.float32))


def test_dropout_is_drawn_at_every_stage_evaluation():
    """rk4 with two layers calls each layer 4 times; each call draws its own masks: a layer's four
    dropouts (attention weights, after attention, after the ReLU, after fc2) make 32 draws."""
    cfg = config("rk4", dropout=0.3, attention_dropout=0.2, activation_dropout=0.1)
    encoder = ODEEncoder(cfg).double().train()
    draws = []
    original = encoder.stages.dropout

    def recording(x, p):
        out = original(x, p)
        draws.append((p, (out == 0).flatten()[:64].clone()))
        return out

    encoder.stages.dropout = recording
    params, x, mask = inputs(cfg)
    encoder(torch.as_tensor(x), torch.as_tensor(mask))
    assert [p for p, _ in draws] == [0.2, 0.3, 0.1, 0.3] * 8
    after_attention = [m for p, m in draws if p == 0.3][::2]
    assert all(not torch.equal(after_attention[0], m) for m in after_attention[1:])
    encoder.eval()
    with torch.no_grad():
        a, b = (encoder(torch.as_tensor(x), torch.as_tensor(mask)) for _ in range(2))
    assert torch.equal(a, b)


@pytest.mark.parametrize("family, profile, pre, more", [("rk2_gated", "paper", False, {}), ("rk3", "released", True, {}),
                                                        ("rk2_weighted", "released", False, {}), ("rk4", "paper", True, {}),
                                                        ("euler", "paper", True, TEMPORAL)])
def test_autograd_against_central_differences_of_the_spec(family, profile, pre, more):
    """The directional derivative of <z_bar, encoder(x; params)> along a random direction of x and
    every parameter: autograd's against the spec's central difference (step eps = 1e-6). Its
    error is the truncation, eps^2 |J'''| / 6 (measured: it scales as eps^2 from eps = 3e-4 down
    to 1e-6), plus rounding, ~ 1e-16 |J| / eps = 1e-10 |J|: at most 6.4e-10 relative on these
    four and qkvflow's stack; bounded at 1e-8."""
    cfg = config(family, profile, pre, **more)
    params, x, mask = inputs(cfg)
    rng = np.random.default_rng(7)
    z_bar = rng.normal(size=x.shape)
    direction = {k: rng.normal(size=np.shape(v)) for k, v in {"x": x, **params}.items()}
    encoder = ODEEncoder.from_params(cfg, params, dtype=torch.float64)
    xt = torch.as_tensor(x).requires_grad_(True)
    (encoder(xt, torch.as_tensor(mask)) * torch.as_tensor(z_bar)).sum().backward()
    grads = {"x": xt.grad, **dict((n, p.grad) for n, p in encoder.named_parameters())}
    autograd = sum(float((grads[k] * torch.as_tensor(direction[k])).sum()) for k in direction)
    fd = central_difference(cfg, params, x, mask, z_bar, direction)
    assert abs(autograd - fd) <= 1e-8 * abs(fd)


def test_bad_input_is_refused_as_in_the_spec():
    cfg = config("rk2")
    params, x, mask = inputs(cfg)
    encoder = ODEEncoder.from_params(cfg, params, dtype=torch.float64)
    empty = torch.as_tensor(mask).clone()
    empty[0] = False
    with pytest.raises(ValueError, match=r"padding_mask: expected at least one real token"):
        encoder(torch.as_tensor(x), empty)
    with pytest.raises(ValueError, match=r"x: expected shape \(batch, seq, 8\)"):
        encoder(torch.as_tensor(x[..., :4]))
    with pytest.raises(TypeError, match=r"x: expected the encoder's dtype torch.float64; got torch.float32"):
        encoder(torch.as_tensor(x, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"params\['alpha'\]: rk2_weighted has one weight per stage"):
        ODEEncoder.from_params(config("rk2_weighted"), {**inputs(config("rk2_weighted"))[0], "alpha": np.ones(3)})


@pytest.mark.parametrize("family, profile, pre, more", [(f, p, f in ("rk2", "rk4", "rk2_weighted"), {}) for f, p in FAMILY_PROFILES]
                         + SUCCESSORS + [("euler", "paper", True, TEMPORAL)])
def test_autograd_equals_the_specs_backward_pass(family, profile, pre, more):
    """Every gradient (x and each parameter) against ode_ref.encoder_backward's, float64: measured
    at most 5.5e-15 relative over every family and profile, pre- and post-norm; over the
    successors' rows 2.6e-15 but for rk3_ema's alpha, 1.3e-13: its weights' derivatives
    (1-a)^m - m a (1-a)^(m-1) nearly cancel near a = 1/2; qkvflow's stack 2.0e-15. Bounded at 1e-12."""
    cfg = config(family, profile, pre, **more)
    params, x, mask = inputs(cfg)
    z_bar = np.random.default_rng(7).normal(size=x.shape)
    encoder = ODEEncoder.from_params(cfg, params, dtype=torch.float64)
    xt = torch.as_tensor(x).requires_grad_(True)
    (encoder(xt, torch.as_tensor(mask)) * torch.as_tensor(z_bar)).sum().backward()
    x_bar, params_bar = ode_encoder_vjp(params, x, cfg, z_bar, mask)
    assert relative_error(xt.grad.numpy(), x_bar) < 1e-12
    for name, p in encoder.named_parameters():
        if p.grad is None:  # post-norm, PCformer's corrector never reads history.weight or its prediction norms
            assert cfg.corrector and not cfg.encoder_normalize_before and not params_bar[name].any(), name
            continue
        assert relative_error(p.grad.numpy(), params_bar[name]) < 1e-12, name

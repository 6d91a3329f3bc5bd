"""The PyTorch port against the spec where the conformance suite does not reach, and its module behaviour."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from odeattn.backends.torch import ODEAttentionBlock, ODEFunc, load_params, state_dict_to_params, use_gemm  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from ode_ref.cache import evaluations  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}
CASES = [c for c in load_cases() if c.kind.name == "block"]  # block cases (decode cases: tests/backends/test_cache.py)


def build(cfg, params, dtype=torch.float64, cls=ODEAttentionBlock):
    block = cls(cfg).to(dtype)
    load_params(block, params)
    return block.eval()


def run(block, x, mask=None, dtype=torch.float64, **kw):
    xt = torch.as_tensor(x).to(dtype)
    mt = None if mask is None else torch.as_tensor(mask)
    with torch.no_grad():
        return block(xt, padding_mask=mt, **kw)


def test_bfloat16_runs_within_its_stated_bound():
    """bfloat16 (unit roundoff 2^-8), under the half-precision policy, against the derived
    tolerance; the median error over the block cases is 0.0035 relative, up to 0.045 with
    BitLinear (bfloat16 cannot keep the rounding decisions).

    A derived bound of 1 or more could not fail (an all-zero output has relative error 1): such a
    case amplifies rounding so much that bfloat16 cannot compute it, and it is named here, not
    passed: at most 6 prms_norm block cases. Every other case must meet its bound, which is then
    < 1."""
    errors, untestable = [], []
    for case in CASES:
        bound = tolerance(case.e32_of("z1"), "bfloat16")
        if bound >= 1.0:
            untestable.append(case.name)
            continue
        block = build(case.config, case.params, torch.bfloat16)
        out = run(block, case.x, case.padding_mask, torch.bfloat16).double().numpy()
        assert np.isfinite(out).all()
        errors.append(relative_error(out, case.z1))
        assert errors[-1] <= bound, case.name
    assert len(untestable) <= 6 and all("prms_norm" in n for n in untestable), untestable
    assert np.median(errors) < 0.05


@pytest.mark.parametrize("encoding", ["none", "rope", "alibi"])
def test_checkpoint_of_the_seed_module_loads_strict(encoding):
    """A state_dict with the seed's keys (here written out by hand) loads with strict=True, also
    with positions on: the encoders hold no state, as the seed's hold none."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type="derf", use_bitnet=True, mode="decoder",
                      ode_use_pe=encoding != "none", positional_encoding=encoding)
    torch.manual_seed(0)  # unseeded weights can put a BitLinear rounding on a tie, failing the float64 comparison (seen once)
    seed_state = {
        "ode_func.qkv.weight": torch.randn(24, 8),
        "ode_func.out_proj.weight": torch.randn(8, 8),
        "ode_func.norm.alpha": torch.tensor(0.7),
        "ode_func.norm.s": torch.tensor(0.1),
        "ode_func.norm.gamma": torch.randn(8),
        "ode_func.norm.beta": torch.randn(8),
    }
    block = ODEAttentionBlock(cfg)
    block.load_state_dict(seed_state, strict=True)
    assert list(block.state_dict()) == list(seed_state) == list(R.param_shapes(cfg))
    params = state_dict_to_params(block.state_dict())
    R.check_params(params, cfg)
    x = np.random.default_rng(0).normal(size=(1, 3, 8))
    np.testing.assert_allclose(run(build(cfg, params), x).numpy(), R.ode_block(params, x, cfg), rtol=1e-12, atol=1e-12)


def test_a_block_inside_a_user_s_module_loads_the_spec_s_names_under_its_prefix():
    """The spec's names hold each encoder tensor once (pos_encoder.X); the block also holds it as
    ode_func.pos_encoder.X. A block inside another module (here nn.Sequential, key prefix "0.") loads
    them strict all the same, and its state_dict gives them back."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="bam", bam_learn_mu=True,
                      use_ssmax=True)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    model = torch.nn.Sequential(ODEAttentionBlock(cfg)).double()
    model.load_state_dict({f"0.{k}": torch.as_tensor(v) for k, v in params.items()}, strict=True)
    back = state_dict_to_params({k[2:]: v for k, v in model.state_dict().items()})
    assert sorted(back) == sorted(params) and all((back[k] == params[k]).all() for k in params)


def test_the_seeds_attribute_names_and_forward_shapes():
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, ode_solver="rk38", ode_steps=3, dropout=0.1)
    block = ODEAttentionBlock(cfg)
    f = block.ode_func
    assert isinstance(f, ODEFunc)
    assert (f.dim, f.num_heads, f.head_dim, f.scale, f.mode) == (12, 3, 4, 0.5, "encoder")
    assert f.qkv.weight.shape == (36, 12) and f.out_proj.weight.shape == (12, 12) and f.dropout.p == 0.1
    assert (block.solver, block.steps) == ("rk38", 3)
    x = torch.randn(2, 4, 12)
    assert f(0.0, x).shape == x.shape and block(x).shape == x.shape


def test_the_seeds_positional_signatures_are_accepted():
    """ODEFunc(config, pos_encoder=None), forward(t, x, logical_layer_idx=None, pos_encoder=None) and
    the block's equivalents. The config decides the encoding (an encoder object is not read); a
    mask passed where the seed has logical_layer_idx is refused, not taken for a layer index."""
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_use_pe=True, positional_encoding="rope")
    params = R.init_params(cfg, seed=1)
    block = ODEAttentionBlock(cfg, pos_encoder=None).double()
    load_params(block, params)
    f = ODEFunc(cfg, pos_encoder=object()).double()
    f.load_state_dict(block.ode_func.state_dict())
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(2, 4, 12)))
    z = block(x, 3, object())
    np.testing.assert_allclose(z.detach().numpy(), R.ode_block(params, x.numpy(), cfg), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f(0.0, x, logical_layer_idx=0, pos_encoder=None), block.ode_func(0.0, x))
    with pytest.raises(TypeError, match="^logical_layer_idx: expected an int or None .*keyword-only"):
        block(x, torch.ones(2, 4, dtype=torch.bool))


def test_function_forward_equals_spec_ode_func():
    case = CASES[3]
    block = build(case.config, case.params)
    got = block.ode_func(0.25, torch.as_tensor(case.x), padding_mask=None if case.padding_mask is None else torch.as_tensor(case.padding_mask))
    want = R.ode_func(case.params, 0.25, case.x, case.config, case.padding_mask)
    assert relative_error(got.detach().numpy(), want) <= 1e-13


def test_padded_positions_unchanged_and_decoder_causal():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", use_bitnet=True, norm_type="dynamic_tanh")
    params = R.init_params(cfg, 4, perturb_norms=True)
    block = build(cfg, params)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        z = block(x, padding_mask=mask)
        assert torch.equal(z[~mask], x[~mask]) and torch.isfinite(z).all()
        x2 = x.clone()
        x2[:, 3:] += 5.0
        assert torch.equal(block(x2)[:, :3], block(x)[:, :3])


def test_gradients_pass_gradcheck_in_float64():
    for norm in ("layer_norm", "dynamic_tanh", "derf", "prms_norm"):
        cfg = R.ODEConfig(hidden_size=4, num_heads=2, norm_type=norm, ode_solver="heun", ode_steps=2, mode="decoder")
        block = build(cfg, R.init_params(cfg, 1, perturb_norms=True))
        x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: block(x), (x,), eps=1e-6, atol=1e-7)
        w = block.ode_func.qkv.weight
        assert torch.autograd.gradcheck(
            lambda w: torch.func.functional_call(block, {"ode_func.qkv.weight": w}, (x.detach(),)), (w.detach().requires_grad_(),)
        )


def test_bitlinear_straight_through_gradients_flow():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, use_bitnet=True)
    block = ODEAttentionBlock(cfg).double().train()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    block(x).square().sum().backward()
    for p in (x, block.ode_func.qkv.weight, block.ode_func.out_proj.weight, block.ode_func.norm.weight):
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    with torch.no_grad():  # without autograd the forward values are exactly the quantised ones
        params = state_dict_to_params(block.state_dict())
        assert relative_error(block(x.detach()).numpy(), R.ode_block(params, x.detach().numpy(), cfg)) <= 1e-13


def test_dropout_only_in_training():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, dropout=0.5)
    block = ODEAttentionBlock(cfg).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    block.eval()
    assert torch.equal(block(x), block(x))
    block.train()
    torch.manual_seed(0)
    a = block(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, block(x))


def test_weights_quantised_once_per_forward(monkeypatch):
    import odeattn.backends.torch.attention as attention

    calls = []
    real = attention.quantize_weight
    monkeypatch.setattr(attention.SelfAttention, "quantize_weight", staticmethod(lambda w: calls.append(1) or real(w)))
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, use_bitnet=True, ode_steps=4, ode_solver="rk4")
    ODEAttentionBlock(cfg)(torch.randn(1, 3, 8))
    assert len(calls) == 2  # qkv and out_proj, not 2 x 16 evaluations


# torch.compile's inductor imports torch.utils.mkldnn, whose classes use torch's own deprecated
# torch.jit.script_method: torch's warning, not the port's
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script_method` is deprecated:DeprecationWarning:torch\.jit")
def test_torch_compile_fullgraph_equals_eager():
    # the one with the fewest evaluations of f: inductor compiles each, seconds apiece on a cold cache
    case = min((c for c in CASES if c.config.use_bitnet and c.padding_mask is not None and c.config.mode == "decoder"),
               key=lambda c: evaluations(c.config))
    block = build(case.config, case.params, torch.float32)
    compiled = torch.compile(block, fullgraph=True)
    eager = run(block, case.x, case.padding_mask, torch.float32)
    got = run(compiled, case.x, case.padding_mask, torch.float32)
    assert relative_error(got.numpy(), eager.numpy()) <= tolerance(case.e32_of("z1"), "float32")


CFG8 = R.ODEConfig(hidden_size=8, num_heads=2)


@pytest.mark.parametrize("call, error, message", [
    pytest.param(lambda block: block(torch.randn(3, 8)),
                 ValueError, r"x: expected shape \(batch, seq, 8\) with batch, seq >= 1; got \(3, 8\)", id="x-without-batch"),
    pytest.param(lambda block: block(torch.randn(1, 3, 8, dtype=torch.float64)),
                 TypeError, r"x: expected dtype torch.float32 \(the module's parameter dtype", id="x-not-in-the-parameters-dtype"),
    pytest.param(lambda block: block(torch.ones(1, 3, 8, dtype=torch.long)),
                 TypeError, "x: expected dtype float32 or float64 or bfloat16 or float16; got int64", id="integer-x"),
    pytest.param(lambda block: block(torch.randn(1, 3, 8), padding_mask=torch.ones(1, 4, dtype=torch.bool)),
                 ValueError, r"padding_mask: expected shape \(1, 3\) \(batch, seq\); got \(1, 4\)",
                 id="padding-mask-of-another-length"),
    pytest.param(lambda block: block(torch.randn(1, 3, 8), padding_mask=torch.ones(1, 3, dtype=torch.long)),
                 TypeError, "padding_mask: expected a bool torch.Tensor .*; got torch.int64", id="integer-padding-mask"),
    pytest.param(lambda block: ODEAttentionBlock({"hidden_size": 8, "num_heads": 2, "ode_solver": "dopri5"}),
                 ValueError, "ode_solver: expected one of .*; got 'dopri5'", id="unknown-solver"),
    pytest.param(lambda block: load_params(block, {k: v for k, v in R.init_params(CFG8).items() if k != "ode_func.norm.bias"}),
                 ValueError, r"params: .* missing \['ode_func.norm.bias'\]", id="missing-parameter"),
    pytest.param(lambda block: ODEAttentionBlock(CFG8, ode_func=ODEFunc(R.ODEConfig(hidden_size=8, num_heads=4))),
                 ValueError, "ode_func: its config", id="ode-func-of-another-config"),
])
def test_the_torch_block_refuses_what_the_spec_refuses(call, error, message):
    block = ODEAttentionBlock(CFG8)
    with pytest.raises(error, match=message):
        call(block)


def test_float16_runs_and_float8_is_refused_like_the_spec():
    """float16 is a storage dtype of the policy (z(1) comes back in it); float8, the parameters'
    or the input's, is refused by the spec's message, naming the field."""
    block = ODEAttentionBlock(R.ODEConfig(hidden_size=8, num_heads=2)).half()
    assert block(torch.zeros(1, 2, 8, dtype=torch.float16)).dtype == torch.float16
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64 or bfloat16 or float16; got float8_e4m3fn"):
        block(torch.zeros(1, 2, 8).to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="parameters: expected dtype float32 or .* or float16; got float8_e4m3fn"):
        block.to(torch.float8_e4m3fn)(torch.zeros(1, 2, 8))
    with pytest.raises(TypeError, match="dtype: expected dtype float32 or .* or float16; got int8"):
        ODEAttentionBlock.from_params(CFG8, R.init_params(CFG8), dtype=torch.int8)


def test_the_seed_norm_call_still_works():
    func = ODEFunc(R.ODEConfig(hidden_size=8, num_heads=2, norm_type="rms_norm"))
    x = torch.randn(1, 3, 8)
    assert torch.equal(func.norm(x), func.norm(dict(func.norm.named_parameters()), x))


def test_the_gate_is_the_blocks_with_the_papers_init():
    cfg = R.ODEConfig(hidden_size=64, num_heads=4, ode_solver="rk2_gated")
    block = ODEAttentionBlock(cfg)
    names = list(block.state_dict())
    assert names[-2:] == ["gate.weight", "gate.bias"] and set(names) == set(R.param_shapes(cfg))
    bound = (6.0 / (128 + 1)) ** 0.5  # Xavier-uniform, as the spec's init_params
    assert block.gate.weight.abs().max() <= bound and torch.all(block.gate.bias == 0)
    assert "gate.weight" not in ODEAttentionBlock(R.ODEConfig(hidden_size=64, num_heads=4)).state_dict()


def test_decode_step_compiles_fullgraph():
    """Traced whole by Dynamo (fullgraph=True: a graph break raises); the eager backend keeps the
    test fast, since the property is Dynamo's, not the code generator's."""
    cfg = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="heun", ode_steps=2, use_bitnet=False,
                      norm_type="derf", ode_use_pe=True, positional_encoding="alibi")
    block = ODEAttentionBlock.from_params(cfg, R.init_params(cfg), dtype=torch.float32)
    step = torch.compile(block.decode_step, fullgraph=True, backend="eager")
    x = torch.randn(3, 7, 12)
    with torch.no_grad():
        full = block(x)
        _, cache = block.prefill(x[:, :4], max_len=7)
        for i in range(4, 7):
            z_t, cache = step(x[:, i:i + 1], cache)
            torch.testing.assert_close(z_t, full[:, i:i + 1], rtol=0, atol=1e-5)


CHECKPOINT_CONFIGS = {  # the gated solver (its gate is a parameter of the block), BitLinear, dropout
    "rk2_gated": dict(ode_solver="rk2_gated", ode_steps=3, norm_type="dynamic_tanh"),
    "bitnet_rk4_decoder": dict(ode_solver="rk4", ode_steps=2, use_bitnet=True, mode="decoder", norm_type="prms_norm"),
    "dropout_rope": dict(ode_solver="heun", ode_steps=2, dropout=0.3, ode_use_pe=True, positional_encoding="rope"),
    "ab3_decoder": dict(ode_solver="ab3", ode_steps=4, mode="decoder"),  # a step under checkpoint carries its past
}


def train_once(cfg, params, x, mask, checkpoint):
    """(z(1), trajectory, x's gradient, every parameter's gradient by name) of one training step."""
    block = ODEAttentionBlock.from_params(cfg, params, dtype=torch.float32, checkpoint=checkpoint).train()
    x = x.clone().requires_grad_()
    torch.manual_seed(0)  # dropout draws the same masks in both runs; checkpoint replays them
    z, trajectory = block(x, padding_mask=mask, return_trajectory=True)
    (z.square().sum() + trajectory.sum()).backward()
    return z, trajectory, x.grad, {n: p.grad for n, p in block.named_parameters()}


@pytest.mark.parametrize("name", CHECKPOINT_CONFIGS)
def test_checkpoint_gives_the_same_values_and_gradients_bit_for_bit(name):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, **CHECKPOINT_CONFIGS[name])
    params = R.init_params(cfg, 3, perturb_norms=True)
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    plain, checkpointed = train_once(cfg, params, x, mask, False), train_once(cfg, params, x, mask, True)
    for a, b in zip(plain[:3], checkpointed[:3]):
        assert torch.equal(a, b)
    assert plain[3].keys() == checkpointed[3].keys() and len(plain[3]) >= 3  # qkv, out_proj, norm (, gate)
    for n, g in plain[3].items():
        assert g is not None and g.abs().sum() > 0 and torch.equal(g, checkpointed[3][n]), n


def test_checkpoint_is_off_without_grad(monkeypatch):
    import torch.utils.checkpoint

    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=3)
    # torch's matmul in both forwards: without a gradient, AMD's AVX-512 CPUs run oneDNN (gemm.py)
    block = use_gemm(ODEAttentionBlock(cfg, checkpoint=True), "torch")
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        z = block(x)
    assert calls == []  # no wrapping, no overhead, when nothing is differentiated
    assert torch.equal(block(x), z) and len(calls) == 5  # segments of ceil(sqrt(3)) = 2 steps: 2 segments, 3 steps


def test_checkpoint_memory_grows_with_the_square_root_of_the_steps():
    """Bytes of the tensors that forward+backward create and that are alive at once (odeattn.bench's
    LiveTensorBytes: saved_tensors_hooks cannot see inside a checkpoint, whose own hooks take over),
    in states (batch, seq, d_model) at this shape, rk4: checkpointed, from 1 to 32 steps, about 12
    states more (segments of 6 steps: 6 segment inputs and one segment's 6 step inputs)."""
    from odeattn.bench import torch_peak_bytes, torch_train_step

    batch, seq, d_model = 1, 32, 16
    state = batch * seq * d_model * 4  # bytes of one float32 state z(t)
    peaks = {}
    for checkpoint in (False, True):
        for steps in (1, 8, 32):
            cfg = R.ODEConfig(hidden_size=d_model, num_heads=2, ode_solver="rk4", ode_steps=steps)
            block = ODEAttentionBlock.from_params(cfg, R.init_params(cfg), checkpoint=checkpoint).train()
            run = torch_train_step(block, torch.randn(batch, seq, d_model, requires_grad=True))
            run()
            peaks[checkpoint, steps] = torch_peak_bytes(run)
    assert (peaks[False, 8] - peaks[False, 1]) / 7 / state >= 20  # 4 evaluations a step, several states each
    # 2 ceil(sqrt(32)) = 12 step and segment inputs at most, and a state's worth of small tensors
    assert (peaks[True, 32] - peaks[True, 1]) / state <= 2 * math.ceil(math.sqrt(32)) + 1
    assert peaks[True, 32] <= 1.5 * peaks[True, 1]  # the training-memory target, at this shape too


def test_checkpoint_option_is_checked_by_name():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(TypeError, match=r"checkpoint: expected True or False; got 'yes' \(str\)"):
        ODEAttentionBlock(cfg, checkpoint="yes")
    with pytest.raises(TypeError, match=r"checkpoint: expected True or False; got 1 \(int\)"):
        ODEAttentionBlock.from_params(cfg, R.init_params(cfg), checkpoint=1)
    assert ODEAttentionBlock(cfg, None, checkpoint=True).checkpoint  # the seed's positional pos_encoder still works


@pytest.mark.parametrize("mode", R.MODES)
def test_long_context_keeps_no_seq_by_seq_tensor(mode):
    """Without a padding mask, the encoder's attention (no mask) and the decoder's (Causal, SDPA's
    is_causal) run SDPA's fused kernel: no (seq, seq) tensor exists at any time of a forward (the
    live tensor bytes stay under one float32 seq x seq tensor: about a fifth of it at seq 1024)."""
    from odeattn.bench import live_tensor_bytes_mode

    seq = 1024
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, ode_solver="rk4", ode_steps=2, mode=mode)
    block = ODEAttentionBlock.from_params(cfg, R.init_params(cfg))
    counter = live_tensor_bytes_mode()
    with torch.no_grad(), counter:
        block(torch.randn(1, seq, 16))
    assert counter.peak < seq * seq * 4


def memory_config(case: str, **kw) -> R.ODEConfig:
    encoding = next((e for e in ("alibi", "hope") if e in case), "rope")
    return R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1, ode_solver="euler",
                       mode="encoder" if "encoder" in case else "decoder", ode_use_pe=encoding != "rope",
                       positional_encoding=encoding, dropout=0.1 if "dropout" in case else 0.0, **kw)


@pytest.mark.parametrize("case", ["decoder", "encoder", "encoder-padded"])
def test_sdpa_forward_is_not_refused_for_scores_it_never_holds(case, monkeypatch):
    """Torch at T = 65,536 runs (SDPA's fused kernel holds no scores), so the torch forward must
    not be refused for them. Under a limit of one byte, which any score array exceeds, a small
    SDPA forward runs, the spec and JAX refuse the same input for their scores, and at 65,536
    tokens torch's estimate is still 0 (a meta tensor: nothing is computed)."""
    from ode_ref.memory import LIMIT_VARIABLE, MemoryLimitError
    from odeattn.backends.torch.attention import check_torch_memory

    cfg = memory_config(case)
    params = R.init_params(cfg)
    x = np.random.default_rng(0).normal(size=(1, 64, 8))
    mask = np.ones((1, 64), bool) if "padded" in case else None
    monkeypatch.setenv(LIMIT_VARIABLE, "1")
    got = run(build(cfg, params), x, mask)
    with pytest.raises(MemoryLimitError, match="the attention scores"):
        R.ode_block(params, x, cfg, mask)
    block = build(cfg, params)
    long = torch.empty(1, 65_536, 8, dtype=torch.float64, device="meta")
    long_mask = None if mask is None else torch.ones(1, 65_536, dtype=torch.bool, device="meta")
    assert check_torch_memory("ODEAttentionBlock.forward", block.ode_func, long, long_mask) == 0
    monkeypatch.delenv(LIMIT_VARIABLE)
    assert relative_error(got.numpy(), R.ode_block(params, x, cfg, mask)) <= 1e-12


@pytest.mark.parametrize("case", ["alibi", "alibi-padded", "decoder-padded", "dropout-train", "hope",
                                  "hope-decoder-padded"])
def test_what_torch_writes_out_is_refused_and_estimated(case, monkeypatch):
    """Where this port does hold (seq, seq) arrays (ALiBi's and hope's written-out scores; the
    decoder's dense mask with padding, and SDPA's float copy of it; SDPA's math path for CPU
    dropout), a limit below them refuses the forward; and the estimate is within [0.75, 1.5] of the
    live tensor bytes of a forward (measured 0.92 to 1.13)."""
    from ode_ref.memory import LIMIT_VARIABLE, MemoryLimitError
    from odeattn.backends.torch.attention import memory_needs
    from odeattn.bench import live_tensor_bytes_mode

    cfg = memory_config(case)
    block = build(cfg, R.init_params(cfg), torch.float32).train("train" in case)
    x = torch.randn(1, 512, 8)
    mask = torch.ones(1, 512, dtype=torch.bool) if "padded" in case else None
    counter = live_tensor_bytes_mode()
    with torch.no_grad(), counter:
        block(x, padding_mask=mask)
    estimate = sum(n.nbytes for n in memory_needs(block.ode_func, x, mask))
    assert 0.75 <= estimate / counter.peak <= 1.5, (estimate, counter.peak)
    monkeypatch.setenv(LIMIT_VARIABLE, str(estimate // 2))
    with pytest.raises(MemoryLimitError, match=r"^ODEAttentionBlock.forward: x of shape \(1, 512, 8\): needs an "
                                               r"estimated .*\(ODEATTN_MEMORY_LIMIT="):
        block(x, padding_mask=mask)


def test_prefill_refuses_a_cache_that_cannot_fit(monkeypatch):
    """max_len = 10^9: K and V of one evaluation (Euler, one step), 2 x 10^9 x 8 float32, was
    tried in every port; refused before the cache is allocated. ODEFunc alone is checked as the
    block is."""
    from ode_ref.memory import LIMIT_VARIABLE, MemoryLimitError

    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    cfg = memory_config("decoder-alibi")
    block = build(cfg, R.init_params(cfg), torch.float32)
    with pytest.raises(MemoryLimitError, match=r"^ODEAttentionBlock.prefill: x of shape \(1, 3, 8\), max_len 1000000000: "
                                               r"needs an estimated 59.6 GiB \(the KV cache \(K and V of every evaluation\), "
                                               r"2 x \(1, 1000000000, 8\) float32: 59.6 GiB; smaller arrays\), more than"):
        block.prefill(torch.zeros(1, 3, 8), max_len=10**9)
    monkeypatch.setenv(LIMIT_VARIABLE, "1024")
    with pytest.raises(MemoryLimitError, match=r"^ODEFunc.forward: x of shape \(1, 64, 8\): .*the ALiBi scores"):
        block.ode_func(0.0, torch.zeros(1, 64, 8))


def test_a_bfloat16_block_trains_through_the_float32_compute():
    """Under the policy autograd runs through the float32 stages and the roundings (a cast's
    gradient is the cast back): every parameter gets a finite gradient in the module's dtype.
    No accuracy is claimed for half-precision gradients (the golden set has none)."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="rk2_gated", mode="decoder")
    block = ODEAttentionBlock(cfg).to(torch.bfloat16)
    x = torch.randn(2, 3, 8).to(torch.bfloat16).requires_grad_(True)
    z = block(x)
    assert z.dtype == torch.bfloat16
    z.float().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad.float()).all(), name

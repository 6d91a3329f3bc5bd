"""The projections' GEMM in inference (backends/torch/gemm.py): the rule, when oneDNN runs, its
packed weights kept in step with the parameters by any write, and the module still copied, saved,
traced and differentiated as before. That its float32 outputs pass every golden forward row is
the main job's torch-onednn backend."""

import copy
import io
import warnings

import numpy as np
import pytest
import torch

import ode_ref as R
from odeattn.backends import cpu
from odeattn.backends.torch import ODEAttentionBlock
from odeattn.backends.torch import attention, gemm

needs_onednn = pytest.mark.skipif(not gemm.onednn_usable(), reason="torch without oneDNN")
CFG = R.ODEConfig(hidden_size=64, num_heads=4, ode_solver="rk4", ode_steps=2)
EVALUATIONS = 4 * 2
# Both GEMMs sum 64 products an entry in float32: z a few roundings of its size apart at most
# (the bound only needs to tell a rounding from a stale or wrong weight, which moves z by O(1e-2))
ROUNDINGS = 64 * 2**-24


def _block(gemm_name="onednn", dtype=np.float32, cls=ODEAttentionBlock, **kw):
    params = {k: v.astype(dtype) for k, v in R.init_params(CFG, seed=0).items()}
    return gemm.use_gemm(cls.from_params(CFG, params, dtype=getattr(torch, np.dtype(dtype).name), **kw), gemm_name)


def _x(dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(0).normal(size=(2, 9, 64))).to(dtype)


def _close(got, want) -> bool:
    return float((got - want).abs().max()) <= ROUNDINGS * float(want.abs().max())


@pytest.fixture
def onednn_calls(monkeypatch):
    """The number of projections oneDNN ran since the test began."""
    calls = []
    monkeypatch.setattr(attention, "onednn_linear", lambda x, p: calls.append(1) or gemm.onednn_linear(x, p))
    return calls


AMD_AVX512 = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\n"
AMD_AVX2 = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2\n\nvendor_id\t: X\n"
INTEL = "vendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon\nflags\t\t: avx2 avx512f avx512_vnni amx_tile\n"


@pytest.mark.parametrize("text, processor, vendor, isa, expected", [
    (AMD_AVX512, "", "AuthenticAMD", "AVX-512", "onednn"), (AMD_AVX2, "", "AuthenticAMD", "AVX2", "torch"),
    (INTEL, "", "GenuineIntel", "AVX-512", "torch"), ("", "arm", "", "", "torch"),
    ("", "AMD64 Family 25 Model 17 Stepping 1, AuthenticAMD", "AuthenticAMD", "", "torch")])
def test_the_rule_picks_onednn_on_amd_cpus_with_avx512(monkeypatch, text, processor, vendor, isa, expected):
    info = cpu.parse_cpuinfo(text, processor)
    assert (info["vendor"], info["isa"]) == (vendor, isa)
    monkeypatch.setattr(gemm, "cpu_info", lambda: info)
    monkeypatch.setattr(gemm, "onednn_usable", lambda: True)
    assert gemm.default_gemm() == expected
    monkeypatch.setattr(gemm, "onednn_usable", lambda: False)
    assert gemm.default_gemm() == "torch"  # oneDNN absent or disabled: torch's matmul, whatever the CPU


def test_cpuinfo_is_read_from_the_first_processor_alone():
    assert cpu.parse_cpuinfo(INTEL)["features"] == ["avx512_vnni", "amx_tile"]
    assert cpu.parse_cpuinfo(AMD_AVX2)["vendor"] == "AuthenticAMD"  # the second block's X is not read


@needs_onednn
def test_onednn_runs_in_float32_inference_alone(onednn_calls):
    x = _x()
    with torch.no_grad():
        _block()(x)
        assert len(onednn_calls) == 2 * EVALUATIONS  # qkv and out_proj at every evaluation
        _block("torch")(x)
        _block(dtype=np.float64)(_x(torch.float64))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's bfloat16 products, as torch's matmul
            _block()(x)
    _block()(x)  # gradients recorded: training keeps torch's matmul
    assert len(onednn_calls) == 2 * EVALUATIONS


@needs_onednn
def test_frozen_projections_leave_every_other_gradient_as_torch_computes_it():
    """With gradients recorded oneDNN never runs, frozen parameters or not (its kernel has no
    backward pass): the norm's gradients, upstream of the projections, come through."""
    grads = []
    for name in ("onednn", "torch"):
        block = _block(name)
        for p in (block.ode_func.qkv.weight, block.ode_func.out_proj.weight):
            p.requires_grad_(False)
        block(_x()).sum().backward()
        grads.append([p.grad for p in block.ode_func.norm.parameters()])
    assert all(g is not None for g in grads[0]) and all(torch.equal(a, b) for a, b in zip(*grads))


@needs_onednn
@pytest.mark.parametrize("write", [
    pytest.param(lambda w: w.mul_(0.5), id="in-place"),
    pytest.param(lambda w: w.data.mul_(0.5), id="through-data"),  # no version counter moves
    pytest.param(lambda w: w.copy_(torch.flip(w.detach(), (0,))), id="load-state-dict-like")])
def test_the_packed_weights_follow_every_write(write):
    x = _x()
    with torch.no_grad():
        block, plain = _block(), _block("torch")
        assert _close(block(x), plain(x))
        for b in (block, plain):
            write(b.ode_func.qkv.weight)
        assert _close(block(x), plain(x))  # a stale packed weight would leave z as it was
        for b in (block, plain):  # a parameter replaced
            b.ode_func.out_proj.weight = torch.nn.Parameter(b.ode_func.out_proj.weight * 2)
        assert _close(block(x), plain(x))


@needs_onednn
def test_a_module_built_under_inference_mode_runs_and_copies_and_saves_after_a_forward():
    with torch.inference_mode():
        block = _block()
        block(_x())
    with torch.no_grad():
        block(_x())
        twin = copy.deepcopy(block)
        assert torch.equal(twin(_x()), block(_x()))
    torch.save(block.state_dict(), io.BytesIO())
    torch.save(block, io.BytesIO())  # the whole module: the packed weights are not saved


@needs_onednn
def test_a_variant_that_scales_a_weight_runs_as_on_torch_matmul():
    """A stage gets the parameters as tensors; one computed from them runs torch's matmul."""

    class Halved(attention.SelfAttention):
        def output_proj(self, w_out, y):
            return super().output_proj(w_out * 0.5, y)

    x = _x()
    with torch.no_grad():
        got, want = (_block(name, ode_func=Halved(CFG))(x) for name in ("onednn", "torch"))
    assert _close(got, want)


@pytest.mark.parametrize("name", ["mkl", "", None, "ONEDNN"])
def test_an_unknown_gemm_is_refused_naming_the_field(name):
    block = _block("auto")
    with pytest.raises(ValueError, match=r"^gemm: expected one of auto, torch, onednn; got"):
        gemm.use_gemm(block, name)
    with pytest.raises(ValueError, match=r"^gemm: expected one of auto, torch, onednn; got"):
        block.ode_func.gemm = name


def test_a_module_without_the_port_s_attention_is_refused():
    with pytest.raises(ValueError, match=r"^module: expected one holding the port's SelfAttention; got Linear$"):
        gemm.use_gemm(torch.nn.Linear(2, 2), "onednn")


@needs_onednn
def test_onednn_disabled_is_not_run_and_refused_where_asked_for(onednn_calls):
    block = _block()
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        assert gemm.default_gemm() == "torch"
        with pytest.raises(ValueError, match=r"^gemm: expected 'auto' or 'torch' here, where oneDNN is absent"):
            block(_x())
    assert not onednn_calls


@needs_onednn
def test_torch_compile_traces_a_module_set_to_onednn():
    """torch.compile (fullgraph) traces the port's stages with no file read or oneDNN query: the
    choice is made in eager mode alone, and the graph runs torch's matmul (the traced stages skip
    eager's shortcuts, so a last bit may move)."""
    x = _x()
    with torch.no_grad(), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got, want = torch.compile(_block(), fullgraph=True, backend="eager")(x), _block("torch")(x)
    assert _close(got, want)
    assert not [w for w in said if "lru_cache" in str(w.message)]  # dynamo's warning on a cached function it traces


@needs_onednn
def test_the_memory_estimate_counts_the_packing_of_a_first_forward():
    """memory_needs holds the packed projections and their copies (2 x 4 D^2 floats) before the
    first forward on oneDNN packs them, and not after, nor for torch's matmul."""
    block, x = _block(), _x()
    needs = lambda: [n for n in attention.memory_needs(block.ode_func, x) if "oneDNN" in n.what]  # noqa: E731
    with torch.no_grad():
        assert [n.nbytes for n in needs()] == [2 * 4 * 64 * 64 * 4]
        block(x)
        assert needs() == []
        gemm.use_gemm(block, "torch")
        assert needs() == []


@needs_onednn
def test_live_tensor_bytes_count_the_packed_weights_until_they_are_freed():
    """bench's live tensor bytes, which the memory tests and `bench --memory` read, take a oneDNN
    tensor (no storage) at its elements' bytes, and let it go when it is freed."""
    from odeattn.bench import live_tensor_bytes_mode

    block, x = _block(), _x()
    with torch.no_grad(), live_tensor_bytes_mode() as counter:
        block(x)
        f = block.ode_func
        packed = [f._packed.lookup(w) for w in (f.qkv.weight, f.out_proj.weight)]
        assert all(p.is_mkldnn for p in packed) and counter.live >= sum(p.numel() * 4 for p in packed)
        live = counter.live
        del packed
        gemm.use_gemm(block, "torch")  # clears the packed weights (and their copies)
        assert counter.live < live

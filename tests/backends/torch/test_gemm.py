"""The projections' GEMM in inference (backends/torch/gemm.py): the rule, the overrides, when oneDNN
runs, and its packed weights kept in step with the parameters. That its float32 outputs pass every
golden row is the main job's torch-onednn backend."""

import numpy as np
import pytest
import torch

import ode_ref as R
from odeattn.backends.torch import ODEAttentionBlock
from odeattn.backends.torch import gemm

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN")
CFG = R.ODEConfig(hidden_size=64, num_heads=4, ode_solver="rk4", ode_steps=2)


def _block(gemm_name="onednn", dtype=np.float32):
    params = {k: v.astype(dtype) for k, v in R.init_params(CFG, seed=0).items()}
    return gemm.use_gemm(ODEAttentionBlock.from_params(CFG, params, dtype=getattr(torch, np.dtype(dtype).name)), gemm_name)


def _x(dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(0).normal(size=(2, 9, 64))).to(dtype)


def _runs_packed(block, x) -> bool:
    return isinstance(block.ode_func.weights(None, x)[0], gemm.Packed)


@pytest.mark.parametrize("vendor, expected", [("AuthenticAMD", "onednn"), ("HygonGenuine", "onednn"),
                                              ("GenuineIntel", "torch"), ("", "torch")])
def test_the_rule_picks_onednn_on_x86_cpus_not_intel(monkeypatch, vendor, expected):
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    assert gemm.default_gemm() == expected
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert gemm.default_gemm() == "torch"  # no oneDNN in this torch: its matmul, whatever the vendor


@needs_onednn
def test_onednn_runs_in_float32_inference_alone():
    block, x = _block(), _x()
    with torch.no_grad():
        assert _runs_packed(block, x)
        assert not _runs_packed(gemm.use_gemm(_block(), "torch"), x)
    assert not _runs_packed(block, x)  # the parameters ask for gradients: training keeps torch's matmul
    with torch.no_grad():
        assert not _runs_packed(_block(dtype=np.float64), _x(torch.float64))


@needs_onednn
def test_onednn_equals_torch_matmul_to_float32_rounding_and_follows_the_weights():
    x = _x()
    with torch.no_grad():
        block, plain = _block(), _block("torch")
        z, z_plain = block(x), plain(x)
        # both sum 64 products per entry in float32: a few roundings of z's size apart at most
        assert float((z - z_plain).abs().max()) <= 64 * 2**-24 * float(z.abs().max())
        for b in (block, plain):  # written in place, as load_state_dict and optimisers do
            b.ode_func.qkv.weight.mul_(0.5)
        z, z_plain = block(x), plain(x)  # a stale packed weight would leave z as it was
        assert float((z - z_plain).abs().max()) <= 64 * 2**-24 * float(z.abs().max())


@pytest.mark.parametrize("name", ["mkl", "", None, "ONEDNN"])
def test_an_unknown_gemm_is_refused_naming_the_field(name):
    with pytest.raises(ValueError, match=r"gemm: expected one of auto, torch, onednn; got"):
        gemm.use_gemm(_block("auto"), name)


@needs_onednn
def test_torch_compile_traces_a_module_set_to_onednn():
    """torch.compile (fullgraph) traces the port's stages with no file read or oneDNN query: the
    choice is made in eager mode alone, and the graph runs torch's matmul (the traced stages skip
    eager's shortcuts, so a last bit may move: the bound of the test above)."""
    block, x = _block(), _x()
    with torch.no_grad():
        got, want = torch.compile(block, fullgraph=True, backend="eager")(x), gemm.use_gemm(_block(), "torch")(x)
    assert float((got - want).abs().max()) <= 64 * 2**-24 * float(want.abs().max())

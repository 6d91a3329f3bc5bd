"""The second export route (export/from_torch.py): the PyTorch module through torch.onnx.export
computes what the direct export computes."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import ode_ref as R  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402
from odeattn.export.block import export_model  # noqa: E402
from odeattn.export.runtime import run, session  # noqa: E402


def cfg(**kw):
    return R.ODEConfig(**{**dict(hidden_size=12, num_heads=3, mode="decoder", norm_type="dynamic_tanh", ode_steps=3), **kw})


def test_torch_route_gives_the_same_outputs():
    pytest.importorskip("torch")
    from odeattn.backends.torch import ODEAttentionBlock
    from odeattn.commands.export import quiet_torch_export
    from odeattn.export.from_torch import export_torch

    # two steps of a two-stage solver, the state carried from one to the next: torch.export traces
    # every evaluation of every step, so each costs seconds (rk4's eight took twice as long)
    c = cfg(use_bitnet=False, norm_type="rms_norm", ode_steps=2, ode_solver="heun")
    params = R.init_params(c, 5, perturb_norms=True)
    block = ODEAttentionBlock.from_params(c, params)
    import tempfile

    with tempfile.TemporaryDirectory() as d, quiet_torch_export():  # as `odeattn export --route torch` calls it
        export_torch(block, f"{d}/t.onnx", seq=8)
        via_torch = onnx.load(f"{d}/t.onnx")
    direct = export_model(c, params)
    rng = np.random.default_rng(4)
    for batch in (1, 5):  # exported once at (2, 8); run at other batch sizes and lengths
        for seq in (1, 37, 300):
            x = rng.normal(size=(batch, seq, 12)).astype(np.float32)
            mask = np.ones((batch, seq), bool)
            mask[-1, -1] = seq == 1  # a padded token, except where it would be the only one
            a = run(via_torch, session(via_torch), x, mask)["z"]
            b = run(direct, session(direct), x, mask)["z"]
            e32 = relative_error(R.ode_block(params, x, c, mask), R.ode_block(params, x.astype(np.float64), c, mask))
            assert relative_error(a, b) <= tolerance(e32, "float32"), (batch, seq)

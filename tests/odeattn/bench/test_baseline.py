"""torch-plain, the plain PyTorch block the ports are measured against (odeattn.bench.baseline)."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.bench import plain_torch_block
from odeattn.conformance.cases.tolerance import relative_error, tolerance


@pytest.mark.parametrize("mode, solver, steps", [("encoder", "rk4", 2), ("decoder", "rk4", 3), ("decoder", "euler", 2),
                                                 ("encoder", "rk38", 1)])
def test_torch_plain_agrees_with_the_spec(mode, solver, steps):
    """The plain block runs the spec's weights (loaded by the seed's state_dict names, strictly)
    and computes the spec's block: its error against the spec in float64 is within the float32
    tolerance derived from the spec's own float32 error on this case (conformance.cases.tolerance)."""
    torch = pytest.importorskip("torch")
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, mode=mode, ode_solver=solver, ode_steps=steps)
    params = R.init_params(cfg, seed=3, perturb_norms=True)  # norm weight and bias not the identity
    x = np.random.default_rng(3).normal(size=(2, 8, 16))
    want = R.ode_block(params, x, cfg)
    e32 = relative_error(R.ode_block({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32), cfg), want)
    with torch.no_grad():
        got = plain_torch_block(cfg, params)(torch.from_numpy(x.astype(np.float32))).numpy()
    assert relative_error(got, want) <= tolerance(e32, "float32")


@pytest.mark.parametrize("field, change", [("norm_type", {"norm_type": "rms_norm"}), ("use_bitnet", {"use_bitnet": True}),
                                           ("ode_use_pe", {"ode_use_pe": True}), ("ode_solver", {"ode_solver": "rk2_gated"})])
def test_torch_plain_names_a_config_it_does_not_cover(field, change):
    pytest.importorskip("torch")
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, **change)
    with pytest.raises(ValueError, match=f"^{field}: torch-plain covers"):
        plain_torch_block(cfg, R.init_params(cfg))

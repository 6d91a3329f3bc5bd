"""The torch port of the spec's language model (ODELanguageModel): the spec's logits, and its
state_dict is the spec's parameters by name, both ways."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from odeattn.backends.torch import ODELanguageModel, lm_params_from_state_dict  # noqa: E402


@pytest.mark.parametrize("kw", [dict(ode_solver="rk4", ode_use_pe=True, positional_encoding="rope"),
                                dict(ode_solver="rk2_gated", use_bitnet=True, ode_use_pe=True, positional_encoding="alibi"),
                                dict(ode_use_pe=True, positional_encoding="bam", bam_learn_mu=True, use_ssmax=True),
                                dict(block="layer", ode_solver="rk2_gated", ffn_dim=24)],
                         ids=["rk4-rope", "rk2_gated-bitlinear-alibi", "bam-ssmax", "layer-rk2_gated"])
def test_torch_lm_equals_the_spec_and_loads_its_params(kw):
    """float64: lm_logits to 1e-12 on a right-padded batch (every position); the state_dict comes back
    as the spec's params exactly."""
    cfg = R.LMConfig(vocab_size=32, num_layers=2, hidden_size=16, num_heads=2, ode_steps=1, **kw)
    params = R.init_lm_params(cfg, seed=0)
    model = ODELanguageModel.from_params(cfg, params, dtype=torch.float64)
    ids = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)
    with torch.no_grad():
        got = model(torch.as_tensor(ids), torch.as_tensor(mask)).numpy()
    want = R.lm_logits(params, ids, cfg, mask)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-12
    back = lm_params_from_state_dict(model.state_dict())
    assert sorted(back) == sorted(params) and all((back[k] == params[k]).all() for k in params)


def test_ids_and_a_mask_that_are_no_tensors_are_refused_by_name():
    """NumPy ids (or a list, or a NumPy mask) are a TypeError naming the argument, as every entry
    point of the port refuses a non-tensor, not an AttributeError from inside forward; ids outside
    the vocabulary are the spec's ValueError."""
    cfg = R.LMConfig(vocab_size=16, num_layers=1, hidden_size=8, num_heads=2, ode_steps=1)
    model = ODELanguageModel.from_params(cfg, R.init_lm_params(cfg, seed=0))
    ids = np.array([[1, 2, 3]])
    for args, name, got in (((ids,), "ids", "ndarray"), (([[1, 2, 3]],), "ids", "list"),
                            ((torch.as_tensor(ids), np.ones((1, 3), bool)), "attention_mask", "ndarray")):
        with pytest.raises(TypeError) as err:
            model(*args)
        assert str(err.value) == f"{name}: expected a torch.Tensor (torch.as_tensor converts a NumPy array); got {got}"
    with pytest.raises(ValueError, match=r"^ids: expected ids in \[0, 16\) \(vocab_size\); got -1 \.\. 3"):
        model(torch.tensor([[-1, 2, 3]]))

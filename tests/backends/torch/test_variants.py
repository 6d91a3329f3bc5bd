import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from odeattn.backends import torch as T  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from odeattn.conformance.tolerance import relative_error  # noqa: E402

VARIANTS = [
    (R.ScaledQueryAttention, T.ScaledQueryAttention, dict(query_scale=1.5, time_gain=0.75)),
    (R.LocalWindowAttention, T.LocalWindowAttention, dict(window=2)),
]


@pytest.mark.parametrize("spec_cls, port_cls, kwargs", VARIANTS, ids=["scaled_query", "local_window"])
@pytest.mark.parametrize("case", load_cases()[:8], ids=lambda c: c.name)
def test_ported_variant_equals_spec_variant(case, spec_cls, port_cls, kwargs):
    func = port_cls(case.config, **kwargs)
    block = T.ODEAttentionBlock.from_params(case.config, case.params, dtype=torch.float64, ode_func=func)
    mask = None if case.padding_mask is None else torch.as_tensor(case.padding_mask)
    with torch.no_grad():
        got = block(torch.as_tensor(case.x), padding_mask=mask).numpy()
    want = R.ode_block(case.params, case.x, case.config, case.padding_mask, attention=spec_cls(case.config, **kwargs))
    assert relative_error(got, want) <= 1e-12

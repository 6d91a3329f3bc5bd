"""The spec's seven example variants (eight classes: two override preprocess_qkv) in torch and
JAX, each rebuilt from the spec's class by port_variant: equal to the spec on golden cases, and
decoding with a cache; and a user's variant ports the same way."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases import decode_loop, run_decode
from odeattn.conformance.golden import load_cases
from odeattn.conformance.tolerance import relative_error

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
from odeattn.backends import jax as J  # noqa: E402
from odeattn.backends import torch as T  # noqa: E402

CASES = [c for c in load_cases() if c.trajectory is not None][:6]  # encoder and decoder, padded and not, RoPE, BitLinear
VARIANTS = pytest.mark.parametrize("variant", R.VARIANTS, ids=lambda v: v.__name__)
# float64 ports run the spec's arithmetic in another library: they agree to ~1e-15
FLOAT64 = 1e-12


def torch_block(cfg, params, variant):
    return T.ODEAttentionBlock.from_params(cfg, params, dtype=torch.float64, ode_func=getattr(T, variant.__name__)(cfg))


@VARIANTS
def test_torch_and_jax_variants_equal_the_spec(variant):
    for case in CASES:
        want = R.ode_block(case.params, case.x, case.config, case.padding_mask, attention=variant(case.config))
        mask = None if case.padding_mask is None else torch.as_tensor(case.padding_mask)
        with torch.no_grad():
            got = torch_block(case.config, case.params, variant)(torch.as_tensor(case.x), padding_mask=mask).numpy()
        assert relative_error(got, want) <= FLOAT64, (case.name, "torch")
        with jax.enable_x64(True):
            got = J.ode_block_jit(case.params, case.x, case.config, case.padding_mask, attention=getattr(J, variant.__name__)(case.config))
        assert relative_error(np.asarray(got), want) <= FLOAT64, (case.name, "jax")


@VARIANTS
def test_torch_and_jax_variants_decode_as_the_spec(variant):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, ode_steps=2)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    x = np.random.default_rng(1).normal(size=(2, 7, 8))
    mask = np.ones((2, 7), bool)
    mask[1, :2] = False  # left padding in the prompt
    want = run_decode(cfg, params, x, mask, 3, attention=variant(cfg))
    block = torch_block(cfg, params, variant)
    with torch.no_grad():
        got = decode_loop(lambda x, m, n: block.prefill(torch.as_tensor(x), torch.as_tensor(m), max_len=n),
                          lambda x_t, c: block.decode_step(torch.as_tensor(x_t), c), x, mask, 3)
    assert relative_error(got, want) <= FLOAT64
    att = getattr(J, variant.__name__)(cfg)
    with jax.enable_x64(True):
        got = decode_loop(lambda x, m, n: J.prefill(params, x, cfg, m, max_len=n, attention=att),
                          lambda x_t, c: J.decode_step(params, x_t, c, cfg, attention=att), x, mask, 3)
    assert relative_error(got, want) <= FLOAT64


class Shifted(R.SelfAttention):
    """A user's variant, written once against the spec: v shifted by a learnt-looking constant,
    with a setting and a helper method of its own."""

    def __init__(self, config, shift=0.25):
        super().__init__(config)
        self.shift = shift

    def _shifted(self, v):
        return v + self.xp.tanh(v) * self.shift

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        q, k, v = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        return q, k, self._shifted(v)


def test_a_users_variant_ports_to_torch_and_jax():
    case = CASES[0]
    want = R.ode_block(case.params, case.x, case.config, case.padding_mask, attention=Shifted(case.config))
    TS, JS = R.port_variant(Shifted, T.SelfAttention), R.port_variant(Shifted, J.SelfAttention)
    assert issubclass(TS, torch.nn.Module) and TS.__name__ == "Shifted" and JS(case.config) == JS(case.config)
    block = T.ODEAttentionBlock.from_params(case.config, case.params, dtype=torch.float64, ode_func=TS(case.config))
    mask = None if case.padding_mask is None else torch.as_tensor(case.padding_mask)
    with torch.no_grad():
        assert relative_error(block(torch.as_tensor(case.x), padding_mask=mask).numpy(), want) <= FLOAT64
    with jax.enable_x64(True):
        got = J.ode_block(case.params, case.x, case.config, case.padding_mask, attention=JS(case.config))
    assert relative_error(np.asarray(got), want) <= FLOAT64


def test_port_variant_refuses_what_is_not_a_spec_variant():
    with pytest.raises(TypeError, match="attention: expected a subclass of ode_ref's SelfAttention; got <class 'int'>"):
        R.port_variant(int, T.SelfAttention)
    with pytest.raises(TypeError, match="attention: expected a subclass of ode_ref's SelfAttention; got .*TiedKeysAttention"):
        R.port_variant(T.TiedKeysAttention, J.SelfAttention)  # a port's variant: port the spec's class instead


@pytest.mark.parametrize("port", ["spec", "torch", "jax"])
def test_variant_settings_are_checked_in_every_port(port):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    module = {"spec": R, "torch": T, "jax": J}[port]
    with pytest.raises(ValueError, match="window: expected an integer >= 1; got 0"):
        module.RecentKeysAttention(cfg, window=0)
    with pytest.raises(ValueError, match="output_scale: expected a number; got 'x'"):
        module.ScaledOutputAttention(cfg, output_scale="x")

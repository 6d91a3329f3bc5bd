"""The spec's seven example variants (eight classes: two override preprocess_qkv) in torch and
JAX, each rebuilt from the spec's class by port_variant: equal to the spec on golden cases, and
decoding with a cache; and a user's variant ports the same way."""

import re

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases import decode_loop, run_decode
from odeattn.conformance.golden import load_cases
from odeattn.conformance.cases.tolerance import relative_error

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
from odeattn.backends import jax as J  # noqa: E402
from odeattn.backends import torch as T  # noqa: E402

CASES = [c for c in load_cases() if c.kind.name == "block"][:6]  # encoder and decoder, padded and not, RoPE, BitLinear
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
    with pytest.raises(ValueError, match="output_scale: expected a finite number; got 'x'"):
        module.ScaledOutputAttention(cfg, output_scale="x")


FACTORS = [("ScaledQueryAttention", "query_scale"), ("ScaledQueryAttention", "time_gain"),
           ("ScaledOutputAttention", "output_scale")]
NON_FINITE = {"inf": (float("inf"), "inf"), "-inf": (-float("inf"), "-inf"), "nan": (float("nan"), "nan"),
              "numpy-inf": (np.float32("inf"), "np.float32(inf)"), "bool": (True, "True"),
              "beyond-float": (10**400, "10000000000000000000... (401 characters)"), "array": (np.array(2.0), "array(2.)")}


@pytest.mark.parametrize("value", list(NON_FINITE))
@pytest.mark.parametrize("variant,factor", FACTORS, ids=lambda v: v)
@pytest.mark.parametrize("port", ["spec", "torch", "jax"])
def test_every_port_refuses_a_non_finite_factor(port, variant, factor, value):
    """query_scale=inf, time_gain=-inf and output_scale=inf gave an all-NaN output in every port;
    10**400 was an OverflowError. A finite factor of any sign (0 included) has a meaning, and NumPy
    floats are taken."""
    module = {"spec": R, "torch": T, "jax": J}[port]
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    given, shown = NON_FINITE[value]
    with pytest.raises(ValueError, match=f"^{re.escape(f'{factor}: expected a finite number; got {shown}')}$"):
        getattr(module, variant)(cfg, **{factor: given})
    for ok in (0, -2, np.float32(1.5), np.int64(3)):
        assert type(getattr(getattr(module, variant)(cfg, **{factor: ok}), factor)) is float


@pytest.mark.parametrize("variant", ["LocalWindowAttention", "RecentKeysAttention"])
@pytest.mark.parametrize("port", ["spec", "torch", "jax"])
def test_every_port_takes_a_numpy_integer_window_and_refuses_a_bool(port, variant):
    """As the config takes NumPy integers (read from arrays or checkpoints): the window is stored
    as a Python int, so the JAX port's jit key is the same for 2 and np.int64(2)."""
    module = {"spec": R, "torch": T, "jax": J}[port]
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    for window in (np.int64(2), np.int32(2), np.uint8(2)):
        att = getattr(module, variant)(cfg, window=window)
        assert type(att.window) is int and att.window == 2
    if port == "jax":
        assert getattr(module, variant)(cfg, window=np.int64(2)) == getattr(module, variant)(cfg, window=2)
    for bad in (np.True_, True, 2.0, np.int64(0)):
        with pytest.raises(ValueError, match=f"^window: expected an integer >= 1; got {re.escape(repr(bad))}$"):
            getattr(module, variant)(cfg, window=bad)


WRONG_VARIANTS = {
    # (port, what is passed) -> the one line that says what to pass
    "spec-given-a-class": ("spec", lambda cfg: R.LocalWindowAttention,
                           "attention: expected an instance of the spec's SelfAttention or a variant of it, e.g. "
                           "LocalWindowAttention(config, ...); got the spec's class ode_ref.variants.LocalWindowAttention"),
    "spec-given-a-torch-variant": ("spec", lambda cfg: T.LocalWindowAttention(cfg),
                                   "attention: expected an instance of the spec's SelfAttention or a variant of it, e.g. "
                                   "ode_ref.LocalWindowAttention(config, ...); got an instance of "
                                   "odeattn.backends.torch.LocalWindowAttention"),
    "spec-given-a-users-ported-variant": ("spec", lambda cfg: R.port_variant(Shifted, J.SelfAttention)(cfg),
                                          "attention: expected an instance of the spec's SelfAttention or a variant of "
                                          "it, e.g. Shifted(config, ...) of the spec's class, not the port's; got an "
                                          f"instance of {Shifted.__module__}.Shifted"),
    "torch-given-a-class": ("torch", lambda cfg: T.LocalWindowAttention,
                            "ode_func: expected an instance of a torch SelfAttention (odeattn.backends.torch.SelfAttention "
                            "or a variant ported to it), e.g. LocalWindowAttention(config, ...); got the class "
                            "odeattn.backends.torch.LocalWindowAttention"),
    "torch-given-the-spec-class": ("torch", lambda cfg: R.LocalWindowAttention,
                                   "ode_func: expected an instance of a torch SelfAttention (odeattn.backends.torch."
                                   "SelfAttention or a variant ported to it), e.g. odeattn.backends.torch."
                                   "LocalWindowAttention(config, ...); got the spec's class "
                                   "ode_ref.variants.LocalWindowAttention"),
    "torch-given-a-spec-variant": ("torch", lambda cfg: R.LocalWindowAttention(cfg, window=2),
                                   "ode_func: expected an instance of a torch SelfAttention (odeattn.backends.torch."
                                   "SelfAttention or a variant ported to it), e.g. odeattn.backends.torch."
                                   "LocalWindowAttention(config, ...); got an instance of the spec's "
                                   "ode_ref.variants.LocalWindowAttention"),
    "torch-given-a-users-spec-variant": ("torch", lambda cfg: Shifted(cfg),
                                         "ode_func: expected an instance of a torch SelfAttention (odeattn.backends."
                                         "torch.SelfAttention or a variant ported to it), e.g. port_variant(Shifted, "
                                         "odeattn.backends.torch.SelfAttention)(config, ...); got an instance of the "
                                         f"spec's {Shifted.__module__}.Shifted"),
    "torch-given-a-jax-variant": ("torch", lambda cfg: J.LocalWindowAttention(cfg),
                                  "ode_func: expected an instance of a torch SelfAttention (odeattn.backends.torch."
                                  "SelfAttention or a variant ported to it), e.g. odeattn.backends.torch."
                                  "LocalWindowAttention(config, ...); got an instance of "
                                  "odeattn.backends.jax.LocalWindowAttention"),
    "jax-given-a-spec-variant": ("jax", lambda cfg: R.LocalWindowAttention(cfg, window=2),
                                 "attention: expected an instance of a JAX SelfAttention (odeattn.backends.jax."
                                 "SelfAttention or a variant ported to it), e.g. odeattn.backends.jax."
                                 "LocalWindowAttention(config, ...); got an instance of the spec's "
                                 "ode_ref.variants.LocalWindowAttention"),
    "jax-jit-given-a-spec-variant": ("jax-jit", lambda cfg: R.LocalWindowAttention(cfg, window=2),
                                     "attention: expected an instance of a JAX SelfAttention (odeattn.backends.jax."
                                     "SelfAttention or a variant ported to it), e.g. odeattn.backends.jax."
                                     "LocalWindowAttention(config, ...); got an instance of the spec's "
                                     "ode_ref.variants.LocalWindowAttention"),
    "jax-given-a-class": ("jax", lambda cfg: J.LocalWindowAttention,
                          "attention: expected an instance of a JAX SelfAttention (odeattn.backends.jax.SelfAttention "
                          "or a variant ported to it), e.g. LocalWindowAttention(config, ...); got the class "
                          "odeattn.backends.jax.LocalWindowAttention"),
    "jax-given-something-else": ("jax", lambda cfg: "local",
                                 "attention: expected an instance of a JAX SelfAttention (odeattn.backends.jax."
                                 "SelfAttention or a variant ported to it), e.g. odeattn.backends.jax.SelfAttention"
                                 "(config) or a variant, odeattn.backends.jax.LocalWindowAttention(config, window=2); "
                                 "got an instance of builtins.str"),
    "export-given-a-class": ("export", lambda cfg: R.LocalWindowAttention,
                             "attention: expected an instance of the spec's SelfAttention or a variant of it, e.g. "
                             "LocalWindowAttention(config, ...); got the spec's class ode_ref.variants.LocalWindowAttention"),
}


def _run(port, cfg, attention):
    params = R.init_params(cfg)
    x = np.zeros((1, 3, 8), np.float32)
    if port == "spec":
        return R.ode_block(params, x, cfg, attention=attention)
    if port == "torch":
        return T.ODEAttentionBlock(cfg, ode_func=attention)
    if port in ("jax", "jax-jit"):
        return (J.ode_block_jit if port == "jax-jit" else J.ode_block)(params, x, cfg, attention=attention)
    from odeattn.export.block import export_model
    return export_model(cfg, params, opset=17, attention=attention)


@pytest.mark.parametrize("case", list(WRONG_VARIANTS))
def test_a_variant_used_wrongly_gets_one_line_saying_what_to_pass(case):
    """A class for an instance was an AttributeError ('config'); the spec's variant in the torch
    block an AttributeError ('check'), in JAX a TracerArrayConversionError."""
    port, make, message = WRONG_VARIANTS[case]
    if port == "export":
        pytest.importorskip("onnx")
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}($|\n)"):  # under jit, JAX appends a note of its own
        _run(port, cfg, make(cfg))

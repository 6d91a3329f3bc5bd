"""Cached decoding in every port: equal to the spec, refusing the same inputs with the same
messages. What each port promises of its own decode step (torch.compile, JAX compiled once) is
tested beside it, in tests/backends/torch and tests/backends/jax."""

import functools
import re

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.cases.fair import make_inputs
from odeattn.conformance.cases.tolerance import relative_error

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
from odeattn.backends import jax as J  # noqa: E402
from odeattn.backends import torch as TP  # noqa: E402

T, K = 5, 3


class Spec:
    def __init__(self, cfg, params, dtype):
        self.cfg, self.params, self.dtype = cfg, params, dtype

    def prefill(self, x, mask, max_len):
        return R.prefill(self.params, x, self.cfg, mask, max_len=max_len)

    def decode(self, x_t, cache):
        return R.decode_step(self.params, x_t, cache, self.cfg)

    def array(self, a):
        return a


class Torch(Spec):
    def __init__(self, cfg, params, dtype):
        super().__init__(cfg, params, dtype)
        self.block = TP.ODEAttentionBlock.from_params(cfg, params, dtype=getattr(torch, dtype))

    def prefill(self, x, mask, max_len):
        with torch.no_grad():
            return self.block.prefill(torch.from_numpy(x), None if mask is None else torch.from_numpy(mask), max_len=max_len)

    def decode(self, x_t, cache):
        with torch.no_grad():
            return self.block.decode_step(torch.from_numpy(x_t), cache)

    def array(self, a):
        return a.numpy()


class Jax(Spec):
    def prefill(self, x, mask, max_len):
        return J.prefill(self.params, x, self.cfg, mask, max_len=max_len)

    def decode(self, x_t, cache):
        return J.decode_step(self.params, x_t, cache, self.cfg)

    def array(self, a):
        return np.asarray(a)


PORTS = {"spec": Spec, "torch": Torch, "jax": Jax}
CFG = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="heun", ode_steps=2, use_bitnet=True,
                  norm_type="derf", ode_use_pe=True, positional_encoding="rope")


def run(port, cfg, dtype="float64", seed=0):
    params = R.init_params(cfg, seed=seed, perturb_norms=True)
    x, mask, _ = make_inputs(cfg, params, 3, T + K, seed=seed, padding=True, decoded=K)
    api = PORTS[port](cfg, params, dtype)
    z, cache = api.prefill(x[:, :T].astype(dtype), mask[:, :T], T + K)
    out = [api.array(z)]
    for i in range(T, T + K):
        z_t, cache = api.decode(x[:, i:i + 1].astype(dtype), cache)
        out.append(api.array(z_t))
    return np.concatenate(out, axis=1), R.ode_block(params, x, cfg, mask), cache


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
@pytest.mark.parametrize("port", ["torch", "jax"])
def test_port_decodes_as_the_whole_sequence(port, encoding):
    """float64 to 1e-12 (the spec's own bound, tests/ode_ref/test_cache.py); the spec's matrix of
    solvers, norms and options is covered there, where every port's stages come from Stages."""
    cfg = R.ODEConfig(**{**CFG.to_dict(), "positional_encoding": encoding})
    with jax.enable_x64(True):
        got, want, cache = run(port, cfg)
    assert relative_error(got, want) <= 1e-12
    assert cache.index == T + K and cache.k[0].shape == (3, T + K, 3, 4)


# The seed's positional family: every encoder's cache is exact (PaPE's keys carry positions only,
# its queries read their own state; SSMax's n is the keys each query sees), SSMax with two of them.
FAMILY = ["sinusoidal_rotary", "hope", "pape", "pape_efficient", "pape_ri", "bam", "pape+ssmax", "bam+ssmax", "none+ssmax"]
FAMILY_PORTS = ["torch", "jax"]


def family_config(encoding):
    name, _, ssmax = encoding.partition("+")
    return R.ODEConfig(**{**CFG.to_dict(), "positional_encoding": name, "use_ssmax": bool(ssmax), "layer_idx": 2})


@pytest.mark.parametrize("encoding", FAMILY)
@pytest.mark.parametrize("port", FAMILY_PORTS)
def test_port_decodes_the_positional_family_as_the_whole_sequence(port, encoding):
    with jax.enable_x64(True):
        got, want, cache = run(port, family_config(encoding))
    assert relative_error(got, want) <= 1e-12 and cache.index == T + K


@pytest.mark.parametrize("port", ["spec", *FAMILY_PORTS])
def test_every_port_refuses_to_cache_the_seed_s_ssmax_rule(port):
    """ssmax_length='padded' (the seed's ln of the padded length): no cache reproduces it."""
    cfg = R.ODEConfig(**{**family_config("bam+ssmax").to_dict(), "ssmax_length": "padded"})
    x = np.random.default_rng(0).normal(size=(3, T, 12))
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="^ssmax_length: cached decoding needs ssmax_length='visible'"):
            PORTS[port](cfg, R.init_params(cfg), "float64").prefill(x, None, 8)

# (id, expected error, call(api, x, cache, other_cache)): every port must refuse each, with the field named.
REFUSALS = [
    ("max-len-below-the-prompt", "max_len: expected an integer >= the prompt's length 5",
     lambda api, x, cache, other: api.prefill(x, None, 4)),
    ("max-len-not-an-integer", "max_len: expected an integer >= the prompt's length 5",
     lambda api, x, cache, other: api.prefill(x, None, 7.0)),
    ("decoding-into-a-full-cache", "cache: full",
     lambda api, x, cache, other: api.decode(x[:, :1], api.prefill(x, None, 5)[1])),
    ("cache-of-another-config", "cache: built for config", lambda api, x, cache, other: api.decode(x[:, :1], other)),
    ("cache-not-a-kvcache", "cache: expected the KVCache", lambda api, x, cache, other: api.decode(x[:, :1], tuple(cache))),
    ("x-t-of-two-tokens", "x_t: expected shape (3, 1, 12)", lambda api, x, cache, other: api.decode(x[:, :2], cache)),
    ("x-t-of-another-batch", "x_t: expected shape (3, 1, 12)", lambda api, x, cache, other: api.decode(x[:2, :1], cache)),
    ("x-t-of-another-dtype", "x_t: expected dtype",
     lambda api, x, cache, other: api.decode(x[:, :1].astype(np.float32), cache)),
    ("x-t-of-another-width", "x_t: expected shape (batch, seq, 12)",
     lambda api, x, cache, other: api.decode(x[:, :1][..., :8], cache)),
]


@functools.cache
def refusal_setup(port):
    """(the port's API, x (3, T, 12), a cache of 8 slots holding x, one of another config), float64."""
    params = R.init_params(CFG)
    x = np.random.default_rng(0).normal(size=(3, T, 12))
    other = R.ODEConfig(**{**CFG.to_dict(), "ode_use_pe": False})
    with jax.enable_x64(True):
        api = PORTS[port](CFG, params, "float64")
        cache = api.prefill(x, None, 8)[1]
        other_cache = PORTS[port](other, params, "float64").prefill(x, None, 8)[1]
    return api, x, cache, other_cache


@pytest.mark.parametrize("message, call", [pytest.param(m, c, id=i) for i, m, c in REFUSALS])
@pytest.mark.parametrize("port", list(PORTS))
def test_every_port_refuses_the_same_inputs(port, message, call):
    with jax.enable_x64(True):
        with pytest.raises((ValueError, TypeError), match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
            call(*refusal_setup(port))


@pytest.mark.parametrize("port", list(PORTS))
def test_every_port_refuses_to_decode_with_an_encoder(port):
    x = np.random.default_rng(0).normal(size=(3, T, 12))
    encoder = R.ODEConfig(hidden_size=12, num_heads=3)
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="^mode: cached decoding needs mode='decoder'"):
            PORTS[port](encoder, R.init_params(encoder), "float64").prefill(x, None, 8)


INDEX = "cache.index: expected an integer in [0, 8) (the next slot; a Python or NumPy integer, not a bool); got "
BAD_INDICES = {"negative": (-1, "-1 (int)"), "past-the-end": (9, "9 (int)"), "float": (5.0, "5.0 (float)"),
               "integral-float": (np.float64(6.0), "np.float64(6.0) (float64)"), "bool": (True, "True (bool)"),
               "numpy-bool": (np.True_, "np.True_ (bool)"), "array": (np.array(5), "array(5) (ndarray)"),
               "string": ("5", "'5' (str)")}


@pytest.mark.parametrize("bad", list(BAD_INDICES))
@pytest.mark.parametrize("port", list(PORTS))
def test_every_port_refuses_a_bad_cache_index_with_one_message(port, bad):
    """An index is an int or a NumPy integer in [0, max_len): a negative one was taken by the spec
    and JAX (a slot counted from the end: a finite, wrong z), a float was an IndexError in the
    spec and came back from JAX as a float index. The cache stays usable."""
    index, shown = BAD_INDICES[bad]
    api, x, cache, _ = refusal_setup(port)
    kind = ValueError if bad in ("negative", "past-the-end") else TypeError
    with jax.enable_x64(True):
        with pytest.raises(kind, match=f"^{re.escape(INDEX + shown)}$"):
            api.decode(x[:, :1], cache._replace(index=index))
        _, after = api.decode(x[:, :1], cache)
    assert after.index == T + 1


@pytest.mark.parametrize("port", list(PORTS))
def test_every_port_takes_a_numpy_integer_index_and_returns_an_int(port):
    api, x, cache, _ = refusal_setup(port)
    with jax.enable_x64(True):
        z, want = api.decode(x[:, :1], cache)
        z64, got = api.decode(x[:, :1], cache._replace(index=np.int64(T)))
    assert type(got.index) is int and got.index == want.index == T + 1
    np.testing.assert_array_equal(api.array(z64), api.array(z))


CACHE_FROM = {"spec": "ode_ref.prefill (a KVCache of numpy.ndarray)",
              "torch": "ODEAttentionBlock.prefill (a KVCache of torch.Tensor)",
              "jax": "odeattn.backends.jax.prefill (a KVCache of jax.Array)"}
ARRAYS = {"spec": "numpy.ndarray", "torch": "torch.Tensor", "jax": "jax.Array"}


@pytest.mark.parametrize("maker,port", [(m, p) for m in PORTS for p in PORTS if m != p], ids=lambda v: v)
def test_a_cache_from_another_port_is_refused_by_name(maker, port):
    """The spec's cache given to torch was an AttributeError ('new_ones'), torch's to the spec
    another ('copy'), torch's to JAX a raw tracing error, and the spec's to JAX was taken."""
    name = {"spec": "spec", "torch": "torch", "jax": "JAX"}[port]
    foreign = refusal_setup(maker)[2]
    api, x, _, _ = refusal_setup(port)
    message = f"cache: expected a {name} cache from {CACHE_FROM[port]}; got a KVCache of {ARRAYS[maker]}"
    with jax.enable_x64(True):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            api.decode(x[:, :1], foreign)

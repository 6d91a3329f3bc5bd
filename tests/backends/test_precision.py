"""The half-precision policy in the torch and JAX ports against the spec's policy run
(ode_ref.precision: half_block, half_func, and prefill/decode_step under half_attention), in
float16 and bfloat16, on a spread of configs: every solver family (the gated one too), decoder and
encoder, padding, BitLinear, each norm, the positional family and two variants.

The ports sum the float32 products in another order than NumPy, so a value can round to the
neighbouring storage value and carry that through the later steps. One neighbour is at most one
ulp, and ulp(v) <= 2 u |v| (u the unit roundoff: 2^-11 in float16, 2^-8 in bfloat16), so one flip
at the largest entry is 2 u max|z|. BOUND is measured: the worst difference / (u max|z|) over these
configs and every path (z(1), the trajectory, f, the prefill and decode steps) is 1.56 u (float16,
f of a derf config: one flip), 0.80 u for z(1) (float16, bam), 0.10 u in bfloat16; 4 allows two
flips. A port that keeps the state in S between steps (StateInStorage) is 9.3 u off in bfloat16
and 8.0 u in float16 on an Euler x 16 config, so the bound catches it.
"""

import numpy as np
import pytest

import ode_ref as R
from ode_ref import variants as V
from ode_ref.precision import HALF_DTYPES, half_attention, half_block, half_func, round_to

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
from odeattn.backends import jax as J  # noqa: E402
from odeattn.backends import torch as TP  # noqa: E402
from odeattn.backends.torch import precision as torch_precision  # noqa: E402

U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}  # unit roundoff
BOUND = 4.0  # in u max|z|: measured worst 1.56 (module docstring), two neighbouring values allowed
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# name: (config fields, padded, the spec's variant and its settings, or None)
CONFIGS = {
    "rk4-decoder": (dict(ode_solver="rk4", ode_steps=4, mode="decoder"), False, None),
    "gated-padded": (dict(ode_solver="rk2_gated", ode_steps=3), True, None),
    "bitlinear-rms": (dict(use_bitnet=True, norm_type="rms_norm", ode_solver="heun", mode="decoder"), True, None),
    "rope-padded": (dict(ode_use_pe=True, positional_encoding="rope", mode="decoder"), True, None),
    "alibi": (dict(ode_use_pe=True, positional_encoding="alibi"), True, None),
    "hope": (dict(ode_use_pe=True, positional_encoding="hope", mode="decoder"), False, None),
    "bam": (dict(ode_use_pe=True, positional_encoding="bam", mode="decoder"), True, None),
    "pape": (dict(ode_use_pe=True, positional_encoding="pape", mode="decoder"), False, None),
    "learned-absolute": (dict(ode_use_pe=True, positional_encoding="learned_absolute"), False, None),
    "ssmax-sinusoidal-rotary": (dict(ode_use_pe=True, positional_encoding="sinusoidal_rotary", use_ssmax=True,
                                     mode="decoder"), True, None),
    **{norm: (dict(norm_type=norm, ode_solver="midpoint"), False, None)
       for norm in ("prms_norm", "flash_norm", "dynamic_tanh", "derf")},
    "local-window": (dict(mode="decoder", ode_solver="midpoint"), False, ("LocalWindowAttention", dict(window=2))),
    "scaled-query": (dict(ode_solver="rk38"), False, ("ScaledQueryAttention", {})),
}
JAX_CONFIGS = ("gated-padded", "bitlinear-rms", "local-window")  # each compiles 4 programs per dtype: a few
PROMPT, SEQ = 4, 6  # decoding: a prompt of 4 tokens, then 2 decode steps


def inputs(name):
    fields, padded, variant = CONFIGS[name]
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, **fields)
    x = np.random.default_rng(5).normal(size=(2, SEQ, 16))
    mask = None
    if padded:
        mask = np.ones((2, SEQ), bool)
        mask[1, :2] = False
    return cfg, R.init_params(cfg, seed=3, perturb_norms=True), x, mask, variant


def variant_of(module, variant, cfg):
    return None if variant is None else getattr(module, variant[0])(cfg, **variant[1])


def spec_runs(cfg, params, x, mask, variant, dtype):
    """The spec's policy run: {"z": z(1), "trajectory": ..., "f": f(0.25, x), "decode": [z of the
    prompt, then of each decoded token]} (decoder configs), float32 arrays holding dtype values."""
    att = variant_of(V, variant, cfg)
    z, trajectory = half_block(params, x, cfg, mask, dtype=dtype, attention=att, return_trajectory=True)
    out = {"z": z, "trajectory": trajectory, "f": half_func(params, 0.25, x, cfg, mask, dtype=dtype, attention=att)}
    if cfg.mode == "decoder":
        half, xr = half_attention(cfg, dtype, att), round_to(x, dtype)
        z, cache = R.prefill(params, xr[:, :PROMPT], cfg, None if mask is None else mask[:, :PROMPT], max_len=SEQ,
                             attention=half)
        out["decode"] = [round_to(z, dtype)]
        for i in range(PROMPT, SEQ):
            z, cache = R.decode_step(params, xr[:, i:i + 1], cache, cfg, attention=half)
            out["decode"].append(round_to(z, dtype))
    return out


def torch_runs(cfg, params, x, mask, variant, dtype):
    """The same runs of the torch block built in dtype, each output checked to be in dtype."""
    block = TP.ODEAttentionBlock.from_params(cfg, params, dtype=TORCH[dtype], ode_func=variant_of(TP, variant, cfg))
    xt = torch.from_numpy(x.astype(np.float32)).to(TORCH[dtype])
    mt = None if mask is None else torch.from_numpy(mask)
    with torch.no_grad():
        z, trajectory = block(xt, padding_mask=mt, return_trajectory=True)
        out = {"z": z, "trajectory": trajectory, "f": block.ode_func(0.25, xt, padding_mask=mt)}
        if cfg.mode == "decoder":
            z, cache = block.prefill(xt[:, :PROMPT], None if mt is None else mt[:, :PROMPT], max_len=SEQ)
            assert all(a.dtype == TORCH[dtype] for a in (*cache.k, *cache.v))  # the cache holds S
            out["decode"] = [z]
            for i in range(PROMPT, SEQ):
                z, cache = block.decode_step(xt[:, i:i + 1], cache)
                out["decode"].append(z)
    for value in out.values():
        assert all(a.dtype == TORCH[dtype] for a in (value if isinstance(value, list) else [value]))
    return {k: [a.float().numpy() for a in v] if isinstance(v, list) else v.float().numpy() for k, v in out.items()}


def jax_runs(cfg, params, x, mask, variant, dtype):
    """The same runs of the JAX port on x in dtype (the parameters float64, rounded by the policy)."""
    att, xj = variant_of(J, variant, cfg), x.astype(np.float32).astype(NUMPY[dtype])
    z, trajectory = J.ode_block_jit(params, xj, cfg, mask, attention=att, return_trajectory=True)
    out = {"z": z, "trajectory": trajectory, "f": J.ode_func(params, 0.25, xj, cfg, mask, attention=att)}
    if cfg.mode == "decoder":
        z, cache = J.prefill(params, xj[:, :PROMPT], cfg, None if mask is None else mask[:, :PROMPT], max_len=SEQ,
                             attention=att)
        assert all(a.dtype == NUMPY[dtype] for a in (*cache.k, *cache.v))
        out["decode"] = [z]
        for i in range(PROMPT, SEQ):
            z, cache = J.decode_step(params, xj[:, i:i + 1], cache, cfg, attention=att)
            out["decode"].append(z)
    for value in out.values():
        assert all(a.dtype == NUMPY[dtype] for a in (value if isinstance(value, list) else [value]))
    return {k: [np.asarray(a, np.float32) for a in v] if isinstance(v, list) else np.asarray(v, np.float32)
            for k, v in out.items()}


def flax_runs(cfg, params, x, mask, variant, dtype):
    """The same runs of the Flax block with its parameters stored in dtype (what the policy needs
    of it: its stages read the module's own parameters), no variant."""
    from odeattn.backends import flax as F

    assert variant is None
    variables = F.from_state_dict(cfg, {k: v.astype(np.float32).astype(NUMPY[dtype]) for k, v in params.items()})
    xf = jax.numpy.asarray(x.astype(np.float32).astype(NUMPY[dtype]))
    block = F.ODEAttentionBlock(config=cfg, max_len=SEQ)
    z, trajectory = block.apply(variables, xf, padding_mask=mask, return_trajectory=True)
    out = {"z": z, "trajectory": trajectory, "f": block.apply(variables, 0.25, xf, mask, method="f")}
    z, state = block.apply(variables, xf[:, :PROMPT], padding_mask=None if mask is None else mask[:, :PROMPT],
                           mutable=["cache"])
    assert state["cache"]["cached_key"].dtype == NUMPY[dtype]
    out["decode"] = [z]
    for i in range(PROMPT, SEQ):
        z, state = block.apply({**variables, **state}, xf[:, i:i + 1], mutable=["cache"])
        out["decode"].append(z)
    for value in out.values():
        assert all(a.dtype == NUMPY[dtype] for a in (value if isinstance(value, list) else [value]))
    return {k: [np.asarray(a, np.float32) for a in v] if isinstance(v, list) else np.asarray(v, np.float32)
            for k, v in out.items()}


def worst(got, want, dtype) -> float:
    """max over the runs of max|got - want| / (u max|want|): how many unit roundoffs apart."""
    out = 0.0
    for key, w in want.items():
        g, w = (np.concatenate(got[key], 1), np.concatenate(w, 1)) if isinstance(w, list) else (got[key], w)
        assert np.isfinite(g).all() and np.isfinite(w).all(), key
        out = max(out, float(np.abs(g - w).max() / (U[dtype] * np.abs(w).max())))
    return out


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_torch_port_follows_the_spec_policy(name, dtype):
    args = inputs(name)
    assert worst(torch_runs(*args, dtype), spec_runs(*args, dtype), dtype) <= BOUND


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("name", JAX_CONFIGS)
def test_the_jax_port_follows_the_spec_policy(name, dtype):
    args = inputs(name)
    assert worst(jax_runs(*args, dtype), spec_runs(*args, dtype), dtype) <= BOUND


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_the_flax_block_follows_the_spec_policy(dtype):
    pytest.importorskip("flax")
    args = inputs("bitlinear-rms")
    assert worst(flax_runs(*args, dtype), spec_runs(*args, dtype), dtype) <= BOUND


def test_the_flax_block_refuses_a_half_input_over_float32_parameters():
    pytest.importorskip("flax")
    from odeattn.backends import flax as F

    cfg, params, x, _, _ = inputs("rk4-decoder")
    variables = F.from_state_dict(cfg, {k: v.astype(np.float32) for k, v in params.items()})
    with pytest.raises(TypeError, match="x: a bfloat16 input runs under the half-precision policy, which needs the "
                                        "parameters stored in bfloat16 .*; got parameters in float32"):
        F.ODEAttentionBlock(config=cfg).apply(variables, x.astype(np.float32).astype(ml_dtypes.bfloat16))


class StateInStorage(torch_precision.TorchMixedPrecision):
    """A policy violation: the state z rounded to S after every step (rk.integrate's checkpoint
    hook wraps each step and segment), where the policy keeps it in float32."""

    def integrate(self, prepared, x, kv=None, *, checkpoint=None, trajectory=True):
        def rounded(fn, *args):
            out = fn(*args)
            return [self.to_storage(s) for s in out] if isinstance(out, list) else self.to_storage(out)

        return super().integrate(prepared, x, kv, checkpoint=rounded, trajectory=trajectory)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_port_keeping_the_state_in_storage_exceeds_the_bound(dtype, monkeypatch):
    """The test above can fail: Euler x 16 steps, each increment h f a sixteenth of f, most of it
    lost when z is rounded to S (measured 9.3 u in bfloat16, 8.0 u in float16; the port: 0.67 u)."""
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, ode_solver="euler", ode_steps=16)
    params, x = R.init_params(cfg, seed=3), np.random.default_rng(5).normal(size=(2, 16, 16))
    want = {"z": half_block(params, x, cfg, dtype=dtype)}

    def z1():
        block = TP.ODEAttentionBlock.from_params(cfg, params, dtype=TORCH[dtype])
        with torch.no_grad():
            return {"z": block(torch.from_numpy(x.astype(np.float32)).to(TORCH[dtype])).float().numpy()}

    assert worst(z1(), want, dtype) <= BOUND
    monkeypatch.setattr(torch_precision, "TorchMixedPrecision", StateInStorage)
    assert worst(z1(), want, dtype) > BOUND


@pytest.mark.parametrize("adapter", ["TorchAdapter", "JaxAdapter"])
def test_the_adapters_half_rows_take_and_return_arrays_of_the_row(adapter):
    """The conformance adapters' half rows: parameters and x as NumPy float16 or
    ml_dtypes.bfloat16 arrays in, z(1), f and the decode run out in the same dtype, within BOUND."""
    from odeattn.conformance import adapters
    from odeattn.conformance.cases.half import numpy_dtype

    backend = getattr(adapters, adapter)()
    cfg, params, x, mask, _ = inputs("rope-padded")
    assert "bfloat16" in backend.dtypes
    for dtype in HALF_DTYPES:  # float16 too: the JAX adapter runs it, though not by default
        half = numpy_dtype(dtype)
        params_h, x_h = {k: v.astype(np.float32).astype(half) for k, v in params.items()}, x.astype(np.float32).astype(half)
        got = {"z": backend.run_block(cfg, params_h, x_h, mask, dtype), "f": backend.run_func(cfg, params_h, 0.25, x_h, mask, dtype),
               "decode": backend.run_decode(cfg, params_h, x_h, mask, PROMPT, dtype)}
        assert all(v.dtype == np.dtype(half) for v in got.values())
        want = spec_runs(cfg, params, x, mask, None, dtype)
        want = {"z": want["z"], "f": want["f"], "decode": np.concatenate(want["decode"], 1)}
        assert worst({k: v.astype(np.float32) for k, v in got.items()}, want, dtype) <= BOUND


HOPE = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, positional_encoding="hope")
HOPE_REFUSED = (r"positional_encoding: hope in float16 multiplies q and k by r cosh\(a\) = 7.22e\+04 at position 12, "
                r"beyond float16's 65504, .* at most 12 tokens here \(layer_idx 0\); got 13; use bfloat16 or float32")


def test_hope_in_float16_is_refused_where_its_factor_overflows_in_every_path():
    """hope's factor r cosh(a) passes 65504 at position 12 (layer_idx 0): float16 runs 12 tokens,
    finite, and refuses 13 by one message in the spec, torch, JAX and Flax (the forward and the
    prefill's cache); bfloat16, of float32's range, runs 16."""
    from odeattn.backends import flax as F

    params = R.init_params(HOPE, 0)
    x = np.random.default_rng(0).normal(size=(1, 16, 8))
    assert np.isfinite(half_block(params, x[:, :12], HOPE, dtype="float16")).all()
    assert np.isfinite(half_block(params, x, HOPE, dtype="bfloat16")).all()
    x13 = x[:, :13].astype(np.float32).astype(np.float16)
    variables = F.from_state_dict(HOPE, {k: v.astype(np.float16) for k, v in params.items()})
    runs = {"spec": lambda: half_block(params, x[:, :13], HOPE, dtype="float16"),
            "torch": lambda: TP.ODEAttentionBlock.from_params(HOPE, params, dtype=torch.float16)(torch.from_numpy(x13)),
            "jax": lambda: J.ode_block_jit(params, x13, HOPE),
            "jax prefill": lambda: J.prefill(params, x13[:, :4], HOPE, max_len=13),
            "flax": lambda: F.ODEAttentionBlock(config=HOPE).apply(variables, x13)}
    for name, run in runs.items():
        with pytest.raises(ValueError, match=HOPE_REFUSED):
            run()


def test_a_finite_input_beyond_float16_s_range_is_refused_by_the_policy():
    """Rounded to float16 a value beyond 65504 is Inf and z NaN: half_block and half_func refuse x
    or a parameter beyond it by name; bfloat16 takes it."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    params = R.init_params(cfg, 0)
    x = np.random.default_rng(0).normal(size=(1, 4, 8))
    x[0, 1, 2] = 7e4
    message = "float16 holds magnitudes up to 65504; got a finite value of magnitude 7e\\+04"
    with pytest.raises(ValueError, match="x: " + message):
        half_block(params, x, cfg, dtype="float16")
    with pytest.raises(ValueError, match="x: " + message):
        half_func(params, 0.0, x, cfg, dtype="float16")
    assert np.isfinite(half_block(params, x, cfg, dtype="bfloat16")).all()
    x[0, 1, 2], params["ode_func.qkv.weight"][0, 0] = 1.0, -7e4
    with pytest.raises(ValueError, match=r"params\['ode_func.qkv.weight'\]: " + message):
        half_block(params, x, cfg, dtype="float16")

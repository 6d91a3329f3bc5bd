"""Causality holds for every input: in decoder mode a token's output depends on the tokens at or
before it only, bit for bit, whatever the later tokens hold (NaN, +Inf, -Inf), in every path; a
token that sees a non-finite value is non-finite itself (nothing is hidden). A variant that narrows
the mask keeps it too: a token outside the window of a non-finite one never reads it.

One run per path and config: each batch row holds one non-finite value in one token (rows cover
every later token and each of NaN, +Inf, -Inf), compared with the same batch all finite."""

import numpy as np
import pytest

import ode_ref as R
from odeattn.conformance.adapters import missing_requirements
from odeattn.conformance.cases.kinds import BLOCK, DECODE

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and Inf through NumPy, by design

BLOCK_PATHS = [n for n in ("spec", "torch", "torch-traced", "jax", "jax-tiled", "onnxruntime", "onnxruntime-opset23")
               if not missing_requirements(n.split("-t")[0])]
DECODE_PATHS = [n for n in ("spec", "torch", "jax", "onnxruntime") if not missing_requirements(n)]
CONFIGS = {  # small; one solver each, rk4 once; the torch norm kernels (layer_norm, rms_norm) both
    "heun": R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="heun", ode_steps=2, use_bitnet=True,
                        ode_use_pe=True, positional_encoding="rope"),
    "rk4": R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="rk4", ode_steps=1, norm_type="rms_norm",
                       ode_use_pe=True, positional_encoding="alibi"),
    # the seed's positional family: PaPE's term of the query's own state, BAM's bias, SSMax's factor
    "pape-ssmax": R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="euler", ode_steps=2,
                              ode_use_pe=True, positional_encoding="pape", use_ssmax=True),
    "bam": R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="midpoint", ode_steps=1, ode_use_pe=True,
                       positional_encoding="bam", bam_learn_mu=True),
}
T = 5
VALUES = (np.nan, np.inf, -np.inf)


class TiledJax:
    """The JAX block with its attention a tile of one head at a time (SelfAttention.with_tiles)."""

    name, dtypes = "jax-tiled", ("float32",)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        from odeattn.backends import jax as J

        attention = J.SelfAttention(config).with_tiles(1)
        return np.asarray(J.ode_block_jit(params, x, config, padding_mask, attention=attention, return_trajectory=True)[1])


class TracedTorch:
    """The torch block traced by Dynamo (torch.compile, the eager backend: fast to build): its
    stages run without the eager-only shortcuts (hide_nonfinite and attn read no number)."""

    name, dtypes = "torch-traced", ("float32",)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        import torch

        from odeattn.backends import torch as P

        block = torch.compile(P.ODEAttentionBlock.from_params(config, params), fullgraph=True, backend="eager")
        with torch.no_grad():
            mask = None if padding_mask is None else torch.from_numpy(padding_mask)
            return block(torch.from_numpy(x), padding_mask=mask, return_trajectory=True)[1].numpy()


def adapter(path, builtin_adapter):
    """The path's adapter: a built-in's from the session's (tests/conftest.py), or one of the two above."""
    return {"jax-tiled": TiledJax, "torch-traced": TracedTorch}.get(path, lambda: builtin_adapter(path))()


def dtype_of(backend):
    return "float64" if "float64" in backend.dtypes else "float32"


def poisoned(x, first: int = 1):
    """(x with row r's token s(r) non-finite, s per row), over rows that cover each token >= first
    and each value: the whole token, or (odd rows) half of it."""
    dirty, where = x.copy(), []
    for r in range(x.shape[0]):
        s = first + r // len(VALUES) % (x.shape[1] - first)
        dirty[r, s, :x.shape[2] // (1 + r % 2)] = VALUES[r % len(VALUES)]
        where.append(s)
    return dirty, where


def inputs(cfg, dtype, seq=T, first=1, seed=0):
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    rows = len(VALUES) * (seq - first)
    x = np.random.default_rng(seed).normal(size=(rows, seq, cfg.hidden_size)).astype(dtype)
    return params, x, *poisoned(x, first)


PADDING = np.array([[True, True, False, False], [False, True, True, True]])  # right- and left-padded


def padded(x, mask):
    """(x with NaN, +Inf and -Inf in padded tokens, x with those tokens 0)."""
    dirty = x.copy()
    dirty[0, 2], dirty[0, 3, :4], dirty[1, 0] = np.nan, np.inf, -np.inf
    return dirty, np.where(mask[:, :, None], x, 0).astype(x.dtype)


def check_causal(got, want, where, reads=lambda s, i: i >= s):
    """got, want: (..., batch, seq, d_model). Each row's tokens i that do not read its token s
    (reads(s, i) False) are want's bits; s itself is non-finite in the last state."""
    for r, s in enumerate(where):
        keep = [i for i in range(got.shape[-2]) if not reads(s, i)]
        np.testing.assert_array_equal(got[..., r, keep, :], want[..., r, keep, :], err_msg=f"row {r}, token {s}")
        assert np.isfinite(want[..., r, :, :]).all() and not np.isfinite(got.reshape(-1, *got.shape[-3:])[-1, r, s]).all()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("path", BLOCK_PATHS)
def test_later_non_finite_tokens_never_reach_earlier_ones(path, config, builtin_adapter):
    cfg, backend = CONFIGS[config], adapter(path, builtin_adapter)
    dtype = dtype_of(backend)
    params, x, dirty, where = inputs(cfg, dtype)
    got = BLOCK.call(backend, cfg, params, dirty, None, dtype, {}, {})
    want = BLOCK.call(backend, cfg, params, x, None, dtype, {}, {})
    for quantity in got:
        check_causal(got[quantity], want[quantity], where)


@pytest.mark.parametrize("path", DECODE_PATHS)
def test_cached_decoding_keeps_causality(path, builtin_adapter):
    """prefill on 4 tokens, one holding NaN or Inf, then 2 decode steps: the tokens before it are as
    in the finite run, and the decoded tokens, which see it, are non-finite (layer_norm spreads it
    to every head's k and v); the cache's unwritten slots are zeros, hidden by the mask. Two more
    rows have a padded prompt whose padded tokens hold NaN or Inf: every real token, prompt and
    decoded, is the run's with those tokens 0."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="euler", ode_steps=2, use_bitnet=True,
                      ode_use_pe=True, positional_encoding="rope")  # two evaluations: JAX unrolls them
    backend = adapter(path, builtin_adapter)
    dtype = dtype_of(backend)
    params, prompt, dirty, where = inputs(cfg, dtype, seq=4)
    rng = np.random.default_rng(1)
    decoded = rng.normal(size=(len(where), 2, cfg.hidden_size)).astype(dtype)  # finite
    pad = np.ones((len(where) + 2, 6), bool)
    pad[-2:, :4] = PADDING
    pad_dirty, pad_clean = padded(rng.normal(size=(2, 6, cfg.hidden_size)).astype(dtype), pad[-2:])
    dirty = np.concatenate([np.concatenate([dirty, decoded], axis=1), pad_dirty])
    x = np.concatenate([np.concatenate([prompt, decoded], axis=1), pad_clean])
    got = DECODE.call(backend, cfg, params, dirty, pad, dtype, {'prompt': dirty.shape[1] - 2}, {})["decode"]
    want = DECODE.call(backend, cfg, params, x, pad, dtype, {'prompt': x.shape[1] - 2}, {})["decode"]
    for r, s in enumerate(where):
        np.testing.assert_array_equal(got[r, :s], want[r, :s], err_msg=f"row {r}, token {s}")
        assert not np.isfinite(got[r, s:]).all(axis=-1).any(), (r, s)
    real = pad[-2:]
    assert np.isfinite(got[-2:][real]).all()
    np.testing.assert_array_equal(got[-2:][real], want[-2:][real])


def decoders(cfg, params):
    """port -> (prefill(x, max_len) -> cache, decode(x_t, cache) -> z_t, to_port(array, like)), float32."""
    out = {"spec": (lambda x, n: R.prefill(params, x, cfg, max_len=n)[1],
                    lambda x_t, c: R.decode_step(params, x_t, c, cfg)[0], lambda a, like: a)}
    if not missing_requirements("torch"):
        import torch

        from odeattn.backends import torch as P

        block = P.ODEAttentionBlock.from_params(cfg, params, dtype=torch.float32)

        def prefill(x, n):
            with torch.no_grad():
                return block.prefill(torch.from_numpy(x), max_len=n)[1]

        def decode(x_t, cache):
            with torch.no_grad():
                return block.decode_step(torch.from_numpy(x_t), cache)[0].numpy()

        out["torch"] = (prefill, decode, lambda a, like: torch.from_numpy(a))
    if not missing_requirements("jax"):
        import jax.numpy as jnp

        from odeattn.backends import jax as J

        out["jax"] = (lambda x, n: J.prefill(params, x, cfg, max_len=n)[1],
                      lambda x_t, c: np.asarray(J.decode_step(params, x_t, c, cfg)[0]), lambda a, like: jnp.asarray(a))
    return out


def test_decoding_never_reads_unwritten_slots():
    """A cache whose unwritten slots hold NaN decodes as one holding zeros (spec, torch, JAX)."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_solver="euler", ode_steps=1)
    params = {k: v.astype(np.float32) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    x = np.random.default_rng(1).normal(size=(2, 4, cfg.hidden_size)).astype(np.float32)
    for name, (prefill, decode, to_port) in decoders(cfg, params).items():
        cache = prefill(x[:, :3], 6)

        def unwritten_nan(a):
            b = np.array(np.asarray(a))
            b[:, cache.index:] = np.nan
            return to_port(b, a)

        dirty = cache._replace(k=tuple(map(unwritten_nan, cache.k)), v=tuple(map(unwritten_nan, cache.v)))
        np.testing.assert_array_equal(decode(x[:, 3:], dirty), decode(x[:, 3:], cache), err_msg=name)


def local_window_runs(cfg, window):
    """path -> run(params, x) -> z(1), LocalWindowAttention(cfg, window) in every path."""
    variant = R.LocalWindowAttention(cfg, window)
    runs = {"spec": lambda p, x: R.ode_block(p, x, cfg, attention=variant)}
    if not missing_requirements("torch"):
        def torch_run(p, x):
            import torch

            from odeattn.backends import torch as P

            variant = P.LocalWindowAttention(cfg, window)
            block = P.ODEAttentionBlock.from_params(cfg, p, dtype=torch.float32, ode_func=variant)
            with torch.no_grad():
                return block(torch.from_numpy(x)).numpy()
        runs["torch"] = torch_run
    if not missing_requirements("jax"):
        def jax_run(p, x):
            from odeattn.backends import jax as J

            return np.asarray(J.ode_block_jit(p, x, cfg, attention=J.LocalWindowAttention(cfg, window)))
        runs["jax"] = jax_run
    if not missing_requirements("onnxruntime"):
        def onnx_run(p, x):
            from odeattn.export.block import export_model
            from odeattn.export.runtime import session

            sess = session(export_model(cfg, p, padding_mask=False, attention=variant))
            return sess.run(["z"], {"x": x})[0]
        runs["onnxruntime"] = onnx_run
    return runs


@pytest.mark.parametrize("mode", R.MODES)
def test_a_narrowed_mask_keeps_causality(mode):
    """LocalWindowAttention (|i - j| < window), one Euler step (f evaluated once): the tokens
    outside the window of the bad one (and, decoding, before it) are the finite run's bits; those
    inside it see it and are non-finite. Each path, float32."""
    window = 2
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode=mode, ode_solver="euler", ode_steps=1)
    params, x, dirty, where = inputs(cfg, "float32", first=0)
    causal = mode == "decoder"

    def reads(s, i):
        return abs(i - s) < window and (i >= s or not causal)

    for path, run in local_window_runs(cfg, window).items():
        got, want = run(params, dirty), run(params, x)
        check_causal(got, want, where, reads)
        for r, s in enumerate(where):
            assert not any(np.isfinite(got[r, i]).all() for i in range(T) if reads(s, i)), (path, r, s)


# ---- padded tokens in the paths tests/backends/test_padding.py does not run: the tiled JAX
# attention here, cached decoding (a padded prompt) in test_cached_decoding_keeps_causality -------
@pytest.mark.parametrize("mode", R.MODES)
def test_non_finite_padded_tokens_stay_in_their_rows_tiled(mode):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode=mode, norm_type="dynamic_tanh", ode_solver="euler", ode_steps=1)
    if missing_requirements("jax"):
        pytest.skip("jax is not installed")
    params = {k: v.astype(np.float32) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    dirty, clean = padded(np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32), PADDING)
    got, want = (TiledJax().run_trajectory(cfg, params, a, PADDING, "float32") for a in (dirty, clean))
    assert np.isfinite(got[:, PADDING]).all()
    np.testing.assert_array_equal(got[:, PADDING], want[:, PADDING])

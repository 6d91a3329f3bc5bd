"""The JAX port (odeattn.backends.jax) as a backend: its functions under jax.jit, XLA's
compilations kept in a persistent cache in the user's cache folder."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from ode_ref.recording import recording

from ..cases import decode_loop


def jax_cache_dir() -> str:
    """Where the JAX backend keeps XLA's persistent compilation cache: the user's cache folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "odeattn", "jax")


def jax_with_cache():
    """jax, its persistent compilation cache in jax_cache_dir() and every program kept in it. A
    folder this process's JAX has already (an earlier call's, or the user's own) is kept: JAX opens
    the folder at its first compilation and keeps writing there, while a folder named later only
    enters every later program's cache key (never found again once that folder is gone)."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", jax_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jax


class JaxAdapter:
    """Through jax.jit: f(0, x) and the trajectory come from one compiled function, the port's
    ode_block_jit with return_f0 (f0 read off the first stage, so the program holds one evaluation
    of f), shared by the case configs that differ only in the solver's coefficients or the tables'
    fields (backends/jax/block.py); run_func and run_trajectory call it alike, the second call
    hitting JAX's own jit cache. f(t, x) at another t is ode_func, jitted. XLA's persistent
    compilation cache in the user's cache folder makes later runs skip compilation."""

    name = "jax"
    # bfloat16 arrays pass to the port as they are. Its float16 (tests/backends/test_precision.py) is
    # no default row: a JAX half row compiles every case config once more (the main job's slowest part).
    dtypes = ("float32", "float64", "bfloat16")
    # XLA on CPU flushes subnormal inputs and results to zero (cases/tolerance.py, flush_subnormals)
    flushes_subnormals = True

    def __init__(self):
        from odeattn.backends import jax as port

        jax = self.jax = jax_with_cache()
        self.port = port

        self._func = jax.jit(port.ode_func, static_argnames=("config",))

        def vjp(params, x, padding_mask, z1_bar, config):
            _, back = jax.vjp(lambda p, xx: port.ode_block(p, xx, config, padding_mask), params, x)
            params_bar, x_bar = back(z1_bar)
            return x_bar, params_bar

        self._vjp = jax.jit(vjp, static_argnames=("config",))

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _run(self, config, params, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            _, trajectory, f0 = self.port.ode_block_jit(params, x, config, padding_mask, return_trajectory=True,
                                                        return_f0=True)
            return np.asarray(f0), np.asarray(trajectory)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return self._run(config, params, x, padding_mask, dtype)[1]

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._run(config, params, x, padding_mask, dtype)[1][-1]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        if t == 0.0:  # the case's f0: the block's own program
            return self._run(config, params, x, padding_mask, dtype)[0]
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._func(params, t, x, config, padding_mask))

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        """jax.vjp of the block, jitted once per case config (the cotangent is an argument)."""
        with self.jax.enable_x64(dtype == "float64"):
            x_bar, params_bar = self._vjp(params, x, padding_mask, z1_bar, config=config)
            return np.asarray(x_bar), {k: np.asarray(v) for k, v in params_bar.items()}

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        port = self.port
        with self.jax.enable_x64(dtype == "float64"):
            return decode_loop(lambda x, m, n: port.prefill(params, x, config, m, max_len=n),
                               lambda x_t, cache: port.decode_step(params, x_t, cache, config), x, padding_mask, prompt)

    def run_encoder(self, config, params, x, padding_mask, dtype):
        """The port's ode_encoder, jitted once per case config and dtype."""
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self.port.ode_encoder(params, x, config, padding_mask))

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (cases/stages.py): the port's SelfAttention, recording, run eagerly."""
        from odeattn.backends.jax.attention import SelfAttention

        attention = recording(SelfAttention)(config)
        with self.jax.enable_x64(dtype == "float64"):
            self.port.ode_func(params, 0.0, x, config, padding_mask, attention=attention)
            return {k: np.asarray(v) for k, v in type(attention).store.items()}

"""The Flax modules (odeattn.backends.flax) as a backend: module.apply under jax.jit, on the case's
parameters converted to the modules' variables."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..cases import decode_loop
from .jax import jax_with_cache


class FlaxAdapter:
    """odeattn.backends.flax through module.apply under jax.jit, one compilation per case config
    and function: the block (trajectory), f once (the block's f), the prefill and the
    decode step (mutable=['cache'], the slot index traced), and jax.vjp of the block. The
    parameters are the case's, converted by from_state_dict; the gradients come back under the
    seed's names (to_state_dict)."""

    name = "flax"
    dtypes = ("float32", "float64")
    flushes_subnormals = True  # XLA on CPU, as the JAX port (jax.py)

    def __init__(self):
        from odeattn.backends import flax as port

        jax = self.jax = jax_with_cache()
        self.port = port
        block = lambda config, **kw: port.ODEAttentionBlock(config=config, **kw)  # noqa: E731
        static = dict(static_argnames=("config", "max_len"))
        self._trajectory = jax.jit(lambda v, x, m, config: block(config).apply(v, x, padding_mask=m, return_trajectory=True)[1],
                                   static_argnames="config")
        self._func = jax.jit(lambda v, t, x, m, config: block(config).apply(v, t, x, m, method="f"), static_argnames="config")
        self._prefill = jax.jit(lambda v, x, m, config, max_len: block(config, max_len=max_len).apply(
            v, x, padding_mask=m, mutable=["cache"]), **static)
        self._step = jax.jit(lambda v, x_t, config, max_len: block(config, max_len=max_len).apply(v, x_t, mutable=["cache"]),
                             **static)

        def vjp(v, x, m, z1_bar, config):
            _, back = jax.vjp(lambda vv, xx: block(config).apply(vv, xx, padding_mask=m), v, x)
            v_bar, x_bar = back(z1_bar)
            return x_bar, port.to_state_dict(v_bar)

        self._vjp = jax.jit(vjp, static_argnames="config")

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._trajectory(self.port.from_state_dict(config, params), x, padding_mask, config=config))

    def run_block(self, config, params, x, padding_mask, dtype):
        return self.run_trajectory(config, params, x, padding_mask, dtype)[-1]

    def run_func(self, config, params, t, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self._func(self.port.from_state_dict(config, params), t, x, padding_mask, config=config))

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            v = self.port.from_state_dict(config, params)
            n = x.shape[1]
            return decode_loop(lambda x, m, n: self._prefill(v, x, m, config=config, max_len=n),
                               lambda x_t, state: self._step({**v, **state}, x_t, config=config, max_len=n),
                               x, padding_mask, prompt)

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            x_bar, params_bar = self._vjp(self.port.from_state_dict(config, params), x, padding_mask, z1_bar, config=config)
            return np.asarray(x_bar), {k: np.asarray(v) for k, v in params_bar.items()}

    def run_encoder(self, config, params, x, padding_mask, dtype):
        """The Flax ODEEncoder's apply on the case's parameters (its from_state_dict)."""
        from odeattn.backends.flax import encoder

        with self.jax.enable_x64(dtype == "float64"):
            variables = encoder.from_state_dict(config, params)
            return np.asarray(encoder.ODEEncoder(config=config).apply(variables, x, padding_mask))

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (cases/stages.py): the Flax SelfAttention, recording, applied eagerly."""
        attention = recording_flax(self.port.SelfAttention)
        block = self.port.ODEAttentionBlock(config=config, attention=attention)
        with self.jax.enable_x64(dtype == "float64"):
            block.apply(self.port.from_state_dict(config, params), 0.0, x, padding_mask, method="f")
            return {k: np.asarray(v) for k, v in attention.store.items()}


def recording_flax(base: type) -> type:
    """ode_ref.recording's recording() for the Flax port's SelfAttention, whose stages take the
    module's own weights (project(h), postprocess_attn(y, padding_mask, deterministic), output_proj(y))."""
    def keep(self, name, a):
        type(self).store.setdefault(name, a)
        return a

    def project(self, x):
        return base.project(self, keep(self, "norm", x))

    def preprocess_qkv(self, q, k, v, **kw):
        return tuple(keep(self, n, a) for n, a in zip("qkv", base.preprocess_qkv(self, q, k, v, **kw)))

    def postprocess_attn(self, y, padding_mask, deterministic, **kw):
        return keep(self, "attn", base.postprocess_attn(self, y, padding_mask, deterministic, **kw))

    def output_proj(self, y):
        return keep(self, "output_proj", base.output_proj(self, y))

    return type(f"Recording{base.__name__}", (base,), {"store": {}, "project": project, "preprocess_qkv": preprocess_qkv,
                                                       "postprocess_attn": postprocess_attn, "output_proj": output_proj,
                                                       "__module__": __name__})

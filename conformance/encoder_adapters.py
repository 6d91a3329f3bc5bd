"""run_encoder (protocol.py's optional method) of the built-in adapters, one mixin each: the spec,
the torch port and the JAX port run the encoder cases (encoder_cases.py); the other built-ins
have no run_encoder, so those cases are reported "not supported" there."""

from __future__ import annotations

import numpy as np

import ode_ref as R


class SpecEncoder:
    def run_encoder(self, config, params, x, padding_mask, dtype):
        return R.ode_encoder(params, x, config, padding_mask)


class TorchEncoder:
    """The ODEEncoder module in evaluation mode, the case's parameters loaded strict."""

    def run_encoder(self, config, params, x, padding_mask, dtype):
        torch = self.torch
        encoder = self.port.ODEEncoder.from_params(config, params, dtype=getattr(torch, dtype))
        with torch.no_grad():
            mask = None if padding_mask is None else torch.from_numpy(padding_mask)
            return encoder(torch.from_numpy(np.ascontiguousarray(x)), mask).numpy()


class JaxEncoder:
    """The port's ode_encoder, jitted once per case config and dtype."""

    def run_encoder(self, config, params, x, padding_mask, dtype):
        with self.jax.enable_x64(dtype == "float64"):
            return np.asarray(self.port.ode_encoder(params, x, config, padding_mask))

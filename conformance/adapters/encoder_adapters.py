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


class OnnxEncoder:
    """The stack exported (export.encoder) and run by the adapter's ONNX Runtime session, after
    the spec's input checks (as export.encoder.run_encoder_model)."""

    def run_encoder(self, config, params, x, padding_mask, dtype):
        from ode_ref.encoder import check_encoder_input
        from odeattn.export.encoder import export_encoder_model
        from odeattn.export.runtime import make_feed

        from ..running.profile import compiling

        check_encoder_input(x, config, padding_mask)
        with compiling("exports"):
            model = export_encoder_model(config, params, padding_mask=padding_mask is not None)
        return self._session(model)(make_feed(model, x, padding_mask))["z"]


class FlaxEncoder:
    """The Flax ODEEncoder's apply on the case's parameters (its from_state_dict)."""

    def run_encoder(self, config, params, x, padding_mask, dtype):
        from odeattn.backends.flax import encoder

        with self.jax.enable_x64(dtype == "float64"):
            variables = encoder.from_state_dict(config, params)
            return np.asarray(encoder.ODEEncoder(config=config).apply(variables, x, padding_mask))

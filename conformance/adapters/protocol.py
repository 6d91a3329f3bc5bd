"""The adapter protocol: what the suite asks of a backend, as typing.Protocol classes.

An adapter needs no base class: any object with Adapter's attributes and methods runs, and each
method of OptionalMethods it has gives finer reports. config is an ode_ref.ODEConfig; params a
dict name -> array of dtype; every array is NumPy, a fresh copy for every call. dtype is
"float32", "float64", "bfloat16" or "float16", the precision of the arrays in and out (bfloat16
arrays are ml_dtypes.bfloat16; a half row runs the half-precision policy, ode_ref.precision).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

import numpy as np

if TYPE_CHECKING:
    from ode_ref import ODEConfig


class NotSupported(Exception):
    """Raised by a run method: this case is reported as not supported (skipped) with the message,
    for what a backend finds out only when it runs (an operator its runtime lacks, say)."""


class Adapter(Protocol):
    """The required part. A backend without one of these is refused (check_adapter)."""

    name: str
    """Shown in reports, e.g. "mylib"; not a built-in backend's name."""
    dtypes: tuple[str, ...]
    """The precisions it runs: any of "float32", "float64", "bfloat16", "float16" (ode_ref.precision.DTYPES)."""

    def supports(self, config: ODEConfig, dtype: str) -> Optional[str]:
        """None if it runs this config in this dtype, else the reason it does not (reported as
        skipped); anything else it returns or raises is reported as an error."""

    def run_block(self, config: ODEConfig, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                  dtype: str) -> np.ndarray:
        """The block forward z(1).

        x: (batch, seq, d_model) of dtype; padding_mask: bool (batch, seq), True for a real token,
        or None (every token real). Returns z(1): x's shape, dtype."""


class OptionalMethods(Protocol):
    """Methods an adapter may have, for finer reports. One that is absent (or None) is not a failure."""

    support: dict
    """What it runs, declared: {"config": {field: [value, ...]}} (adapters/support.py). A config
    outside it is not supported without supports() being asked, and the fuzzer draws only within it."""

    def run_trajectory(self, config: ODEConfig, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                       dtype: str) -> np.ndarray:
        """z at every step, x first: (steps + 1, batch, seq, d_model). With it, run_block is not called."""

    def run_func(self, config: ODEConfig, params: dict, t: float, x: np.ndarray, padding_mask: Optional[np.ndarray],
                 dtype: str) -> np.ndarray:
        """The vector field f(t, x): x's shape, dtype."""

    def run_decode(self, config: ODEConfig, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                   prompt: int, dtype: str) -> np.ndarray:
        """Cached decoding (decoder mode): prefill on the first `prompt` tokens (padding_mask,
        (batch, prompt) or None, covers them; the rest are real), then one decode step per
        remaining token. Returns (batch, seq, d_model): the prompt's z, then each decoded token's
        z. Without it, the decode cases are reported "not supported"."""

    def run_vjp(self, config: ODEConfig, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                z1_bar: np.ndarray, dtype: str) -> tuple[np.ndarray, dict]:
        """The block's backward pass: the vector-Jacobian product of z(1) for the cotangent z1_bar
        (x's shape). Returns (x_bar, params_bar): x_bar x's shape, params_bar a dict with every
        parameter name. Without it, the grad cases are reported "not supported"."""

    def run_encoder(self, config, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                    dtype: str) -> np.ndarray:
        """The ODE Transformer's encoder stack (ode_ref.ode_encoder): config an
        ode_ref.ODEEncoderConfig, params the released state_dict keys. Returns x's shape, dtype.
        Without it, the encoder cases are reported "not supported" (and supports() never sees
        their config)."""

    def run_lm(self, config, params: dict, ids: np.ndarray, attention_mask: Optional[np.ndarray],
               dtype: str) -> np.ndarray:
        """The language model's logits at every position (ode_ref.lm_logits): config an
        ode_ref.LMConfig, params the names of ode_ref.lm_param_shapes, ids int64 (batch, seq),
        attention_mask bool (batch, seq) or None. Returns (batch, seq, vocab_size) in dtype.
        Without it, the LM cases are reported "not supported" (and supports() never sees their
        config)."""

    def run_stages(self, config: ODEConfig, params: dict, x: np.ndarray, padding_mask: Optional[np.ndarray],
                   dtype: str) -> dict:
        """The first evaluation f(0, x)'s intermediate values under the spec's stage names (any
        subset): norm (h), q, k, v after preprocess_qkv, attn (after postprocess_attn) and
        output_proj (cases/stages.py). Used by fuzz to name the first stage of f that diverges; without
        it, a divergence is localised at its quantity alone."""


def members(protocol: type) -> tuple[str, ...]:
    """A protocol's own attributes, then its methods, in the order the class declares them."""
    methods = [k for k, v in vars(protocol).items() if callable(v) and not k.startswith("_")]
    return (*protocol.__dict__.get("__annotations__", {}), *methods)


REQUIRED = members(Adapter)
OPTIONAL = members(OptionalMethods)

"""The input files the commands share, read once each: a block's config and weights (`odeattn
export`, `odeattn diagnose`) and x (`odeattn run`, `odeattn diagnose`). Each refusal is a
UsageError naming the option."""

from __future__ import annotations

import numpy as np

import ode_ref as R
from ode_ref.config import NULL_ENCODINGS
from odeattn.commands.args import load_npy, read_json, user_input


def load_block(config_path, weights_path=None, *, seed: int = 0):
    """(config, params) from --config (a JSON object of ODEConfig fields) and --weights (the spec's
    parameter names, .safetensors or .npz; None: init_params(config, seed=seed)), checked against
    the config and for NaN or Inf; UsageError naming --config or --weights otherwise."""
    from odeattn.export.weights import check_finite

    with user_input("--config"):
        config = R.ODEConfig.from_any(read_json("--config", config_path))
    with user_input("--weights"):
        params = R.load_params(weights_path) if weights_path else R.init_params(config, seed=seed)
        R.check_params(params, config)
        check_finite(params)
    return config, params


def unused_encoding(config) -> str | None:
    """The warning for a config that names a positional_encoding (other than the default) while
    ode_use_pe is false: valid, the seed's own semantics (the encoding is read only with
    ode_use_pe on), but likely not what was meant; None otherwise."""
    import dataclasses

    default = next(f.default for f in dataclasses.fields(R.ODEConfig) if f.name == "positional_encoding")
    if config.ode_use_pe or config.positional_encoding in (default, *NULL_ENCODINGS):
        return None
    return (f"warning: positional_encoding {config.positional_encoding!r} is not used: ode_use_pe is false, and the "
            "seed reads the encoding only with it on; the block has no positions (set ode_use_pe true to use it)")


def load_x(path, width: int, *, batch: int, seq: int, seed: int, dtype=np.float64) -> np.ndarray:
    """x from --x (a .npy file, never unpickled: load_npy), as stored; without one, a normal
    batch [batch, seq, width] seeded with seed, as dtype. Its shape and dtype are the caller's
    to check, against what it runs."""
    if path:
        return load_npy("--x", path)
    return np.random.default_rng(seed).normal(size=(batch, seq, width)).astype(dtype, copy=False)

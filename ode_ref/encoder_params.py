"""The encoder stack's parameters: the released encoder's state_dict keys, shapes, init and checks.

Per layer N (C = encoder_embed_dim, FF = encoder_ffn_embed_dim):

    layers.N.self_attn.in_proj_weight    (3C, C)   rows q, k, v
    layers.N.self_attn.in_proj_bias      (3C,)
    layers.N.self_attn.out_proj.weight   (C, C)
    layers.N.self_attn.out_proj.bias     (C,)
    layers.N.fc1.weight (FF, C), layers.N.fc1.bias (FF,), layers.N.fc2.weight (C, FF), layers.N.fc2.bias (C,)
    layers.N.layer_norms.0.weight / .bias (C,)  the attention sublayer's norm
    layers.N.layer_norms.1.weight / .bias (C,)  the FFN sublayer's
and, once for the stack:
    layer_norm.weight / .bias (C,)       pre-norm only (encoder_normalize_before)
    gate_linear.weight (1, 2C), gate_linear.bias (1,)   rk2_gated only, shared by every block
    alpha (2,)                           rk2_weighted only, one weight per stage, shared likewise

The embedding's keys (embed_tokens.*, embed_positions.*, version) are not the stack's
(stack_params keeps them out).
"""

from __future__ import annotations

import numpy as np

from .encoder_config import ODEEncoderConfig

GATE_WEIGHT, GATE_BIAS, ALPHA = "gate_linear.weight", "gate_linear.bias", "alpha"
FINAL_NORM = "layer_norm."
EMBEDDING_PREFIXES = ("embed_tokens.", "embed_positions.", "layernorm_embedding.", "version")


def layer_prefix(i: int) -> str:
    return f"layers.{i}."


def _layer_shapes(c: int, ff: int) -> dict:
    return {
        "self_attn.in_proj_weight": (3 * c, c), "self_attn.in_proj_bias": (3 * c,),
        "self_attn.out_proj.weight": (c, c), "self_attn.out_proj.bias": (c,),
        "fc1.weight": (ff, c), "fc1.bias": (ff,), "fc2.weight": (c, ff), "fc2.bias": (c,),
        "layer_norms.0.weight": (c,), "layer_norms.0.bias": (c,),
        "layer_norms.1.weight": (c,), "layer_norms.1.bias": (c,),
    }


def encoder_param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the stack with its shape: the layers in order, then the stack's own."""
    cfg = ODEEncoderConfig.from_any(config)
    c = cfg.encoder_embed_dim
    shapes = {layer_prefix(i) + name: shape for i in range(cfg.encoder_layers)
              for name, shape in _layer_shapes(c, cfg.encoder_ffn_embed_dim).items()}
    if cfg.encoder_normalize_before:
        shapes[FINAL_NORM + "weight"], shapes[FINAL_NORM + "bias"] = (c,), (c,)
    if cfg.family == "rk2_gated":
        shapes[GATE_WEIGHT], shapes[GATE_BIAS] = (1, 2 * c), (1,)
    if cfg.family == "rk2_weighted":
        shapes[ALPHA] = (cfg.enc_calculate_num,)
    return shapes


def _xavier(rng, shape):
    """Xavier-uniform: U(-sqrt(6 / (fan_in + fan_out)), +sqrt(...)), fan_in, fan_out = shape[1], shape[0]."""
    return rng.uniform(-1.0, 1.0, size=shape) * np.sqrt(6.0 / (shape[0] + shape[1]))


def init_encoder_params(config, seed: int = 0, *, perturb: bool = False, dtype=np.float64) -> dict:
    """Deterministic parameters (NumPy's PCG64 seeded with `seed`, drawn in name order), the
    released init: every weight matrix Xavier-uniform, every bias 0, the LayerNorms weight 1 and
    bias 0, alpha 1. With perturb=True each bias, norm parameter and alpha gets U(-0.5, 0.5) added,
    so that a test or a golden case exercises them (a zero bias would let a port that drops it pass)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in encoder_param_shapes(config).items():
        if len(shape) == 2:
            value = _xavier(rng, shape)
        else:
            identity = 1.0 if name == ALPHA or name.endswith("weight") else 0.0  # 1-D weights: the norms'
            value = np.full(shape, identity)
            if perturb:
                value = value + rng.uniform(-0.5, 0.5, size=shape)
        params[name] = np.asarray(value, dtype=dtype)
    return params


def check_encoder_params(params, config) -> None:
    """ValueError unless params has exactly the stack's names, shapes and float dtypes."""
    cfg = ODEEncoderConfig.from_any(config)
    expected = encoder_param_shapes(cfg)
    if not hasattr(params, "keys"):
        raise ValueError(f"params: expected a dict of arrays; got {type(params).__name__}")
    if ALPHA in params and cfg.family == "rk2_weighted" and tuple(np.shape(params[ALPHA])) != expected[ALPHA]:
        raise ValueError(f"params['alpha']: rk2_weighted has one weight per stage, shape {expected[ALPHA]}; "
                         f"got shape {tuple(np.shape(params[ALPHA]))}")
    missing = [k for k in expected if k not in params]
    extra = sorted(k for k in params if k not in expected)
    if missing or extra:
        raise ValueError(
            f"params: for encoder_layers={cfg.encoder_layers}, encoder_normalize_before={cfg.encoder_normalize_before}, "
            f"family={cfg.family!r} expected exactly the {len(expected)} names of encoder_param_shapes; "
            f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}, unexpected {extra[:6]}{' ...' if len(extra) > 6 else ''}")
    for name, shape in expected.items():
        value = params[name]
        if not hasattr(value, "dtype"):
            raise ValueError(f"params[{name!r}]: expected an array; got {type(value).__name__}")
        if tuple(np.shape(value)) != shape:
            raise ValueError(f"params[{name!r}]: expected shape {shape}; got {tuple(np.shape(value))}")
        try:
            dtype = np.dtype(value.dtype)  # NumPy's and JAX's arrays (traced ones too)
        except TypeError:
            dtype = None  # a dtype NumPy does not name: the port checks its own
        if dtype is not None and dtype.kind != "f" and dtype.name != "bfloat16":
            raise ValueError(f"params[{name!r}]: expected a floating dtype; got {dtype}")


def stack_params(state_dict: dict) -> dict:
    """The stack's entries of a released encoder's state_dict: everything but the embedding's keys
    (EMBEDDING_PREFIXES). Any other key stays, so a strict load still names it."""
    if not hasattr(state_dict, "items") or not all(isinstance(k, str) for k in state_dict):
        raise TypeError(f"state_dict: expected a dict of parameter name -> array; got {type(state_dict).__name__}")
    return {k: v for k, v in state_dict.items() if not k.startswith(EMBEDDING_PREFIXES)}

"""The encoder stack's parameters: the released encoder's state_dict keys, shapes, init and checks.

Per layer N (C = encoder_embed_dim, FF = encoder_ffn_embed_dim):

    layers.N.self_attn.in_proj_weight    (3C, C)   rows q, k, v
    layers.N.self_attn.in_proj_bias      (3C,)
    layers.N.self_attn.out_proj.weight   (C, C)
    layers.N.self_attn.out_proj.bias     (C,)
    layers.N.fc1.weight (FF, C), layers.N.fc1.bias (FF,), layers.N.fc2.weight (C, FF), layers.N.fc2.bias (C,)
    layers.N.layer_norms.0.weight / .bias (C,)  the attention sublayer's norm
    layers.N.layer_norms.1.weight / .bias (C,)  the FFN sublayer's
and, in a Macaron layer (macaron), its first FFN and norm, as macaron-net names them:
    layers.N.macaron_fc1.weight (FF, C), .bias (FF,), layers.N.macaron_fc2.weight (C, FF), .bias (C,)
    layers.N.layer_norms.2.weight / .bias (C,)
and, once for the stack:
    layer_norm.weight / .bias (C,)       pre-norm only (encoder_normalize_before)
    gate_linear.weight (1, 2C), gate_linear.bias (1,)   rk2_gated only, shared by every block
    alpha (2,)                           rk2_weighted only, one weight per stage, shared likewise
    alpha (1,), (layers, 1) or (C,)      an ema family's (PCformer): one scalar, one per layer
                                         (layer_wise) or one per channel (alpha_type "vector")
and, with PCformer's corrector (encoder_history_type), its history's, as released (each present
under both norm placements; history.weight and the prediction norms are read pre-norm only):
    history.weight, history.weight_c (layers + 1, layers + 1)   lower-triangular, row r initialised to 1 / (r + 1)
    history.layer_norms.N.weight / .bias (C,)                   the corrector's norm after layer N
    history.rouge_predictions_norm.N.weight / .bias (C,)        the prediction's norm

qkvflow's time-dependent stack (time_embed_dim > 0; temporal.py) has no layers.N: one block, under
its released module paths (T = time_embed_dim, S = 2 sinusoidal_dim + 1, in x out each linear's):
    block.P.lin1.weight (T, S), .lin1.bias (T,), .lin2.weight (T, T), .lin2.bias (T,)   P's time MLP, for every P
    block.P.f_W.weight (in out, T), .f_W.bias (in out,), block.P.f_b (T, out)          P a linear: attn.c_attn
                                         (C -> 3C), attn.c_proj (C -> C), mlp.c_fc (C -> FF), mlp.c_proj (FF -> C)
    block.P.f_weight (C, T), block.P.f_bias (C, T)                                     P a norm: attn_ln, mlp_ln
    ln_f.weight / .bias (C,)                                                           the final norm
The names are the released modules' paths; the arrays are odeattn's flat layout: haliax holds each
with named axes (f_W's weight (T, in, out) in the haliax of qkvflow's time, c_attn's out itself
(3, heads, head_dim)), which flatten to these in that axis order (f_W's weight then transposed).
Released init: f_weight, f_bias 0 (each norm starts as LayerNorm's identity), f_b 1e-4 N(0, 1).

The embedding's keys (embed_tokens.*, embed_positions.*, version) are not the stack's
(stack_params keeps them out).
"""

from __future__ import annotations

import numpy as np

from .encoder_config import EMA_FAMILIES, ODEEncoderConfig

GATE_WEIGHT, GATE_BIAS, ALPHA = "gate_linear.weight", "gate_linear.bias", "alpha"
HISTORY_WEIGHT, HISTORY_WEIGHT_C = "history.weight", "history.weight_c"
HISTORY_NORM, PREDICTION_NORM = "history.layer_norms.", "history.rouge_predictions_norm."
FINAL_NORM = "layer_norm."
EMBEDDING_PREFIXES = ("embed_tokens.", "embed_positions.", "layernorm_embedding.", "version")


TEMPORAL_BLOCK, TEMPORAL_FINAL_NORM = "block.", "ln_f."
TEMPORAL_NORMS = ("attn_ln.", "mlp_ln.")
TEMPORAL_ZERO, TEMPORAL_SMALL = ("f_weight", "f_bias"), "f_b"  # the leaves whose released init is 0, 1e-4 N(0, 1)


def temporal_linears(config) -> dict[str, tuple[int, int]]:
    """qkvflow's temporal linear layers under block., each with its (in, out) widths."""
    cfg = ODEEncoderConfig.from_any(config)
    c, ff = cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim
    return {"attn.c_attn.": (c, 3 * c), "attn.c_proj.": (c, c), "mlp.c_fc.": (c, ff), "mlp.c_proj.": (ff, c)}


def _temporal_shapes(cfg: ODEEncoderConfig) -> dict:
    """The time-dependent stack's parameters (module docstring), in the released Block's field order."""
    c, te, s = cfg.encoder_embed_dim, cfg.time_embed_dim, 2 * cfg.sinusoidal_dim + 1
    mlp = lambda p: {p + "lin1.weight": (te, s), p + "lin1.bias": (te,), p + "lin2.weight": (te, te), p + "lin2.bias": (te,)}  # noqa: E731
    linear = lambda p, n_in, n_out: {**mlp(p), p + "f_W.weight": (n_in * n_out, te), p + "f_W.bias": (n_in * n_out,),  # noqa: E731
                                     p + "f_b": (te, n_out)}
    norm = lambda p: {**mlp(p), p + "f_weight": (c, te), p + "f_bias": (c, te)}  # noqa: E731
    shapes = {}
    for ln, sublayer in zip(TEMPORAL_NORMS, ("attn.", "mlp.")):
        shapes.update(norm(TEMPORAL_BLOCK + ln))
        for p, (n_in, n_out) in temporal_linears(cfg).items():
            if p.startswith(sublayer):
                shapes.update(linear(TEMPORAL_BLOCK + p, n_in, n_out))
    shapes[TEMPORAL_FINAL_NORM + "weight"], shapes[TEMPORAL_FINAL_NORM + "bias"] = (c,), (c,)
    return shapes


def layer_prefix(i: int) -> str:
    return f"layers.{i}."


def _layer_shapes(c: int, ff: int, macaron: bool) -> dict:
    shapes = {
        "self_attn.in_proj_weight": (3 * c, c), "self_attn.in_proj_bias": (3 * c,),
        "self_attn.out_proj.weight": (c, c), "self_attn.out_proj.bias": (c,),
        "fc1.weight": (ff, c), "fc1.bias": (ff,), "fc2.weight": (c, ff), "fc2.bias": (c,),
        "layer_norms.0.weight": (c,), "layer_norms.0.bias": (c,),
        "layer_norms.1.weight": (c,), "layer_norms.1.bias": (c,),
    }
    if macaron:  # after the others, so that a plain layer's draws stay as they were
        shapes.update({"macaron_fc1.weight": (ff, c), "macaron_fc1.bias": (ff,), "macaron_fc2.weight": (c, ff),
                       "macaron_fc2.bias": (c,), "layer_norms.2.weight": (c,), "layer_norms.2.bias": (c,)})
    return shapes


def encoder_param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the stack with its shape: the layers in order, then the stack's own."""
    cfg = ODEEncoderConfig.from_any(config)
    if cfg.temporal:
        return _temporal_shapes(cfg)
    c = cfg.encoder_embed_dim
    shapes = {layer_prefix(i) + name: shape for i in range(cfg.encoder_layers)
              for name, shape in _layer_shapes(c, cfg.encoder_ffn_embed_dim, cfg.macaron).items()}
    if cfg.encoder_normalize_before:
        shapes[FINAL_NORM + "weight"], shapes[FINAL_NORM + "bias"] = (c,), (c,)
    if cfg.family == "rk2_gated":
        shapes[GATE_WEIGHT], shapes[GATE_BIAS] = (1, 2 * c), (1,)
    if cfg.family == "rk2_weighted":
        shapes[ALPHA] = (cfg.enc_calculate_num,)
    if cfg.family in EMA_FAMILIES:
        shapes[ALPHA] = (c,) if cfg.alpha_type == "vector" else (cfg.encoder_layers, 1) if cfg.layer_wise else (1,)
    if cfg.corrector:
        rows = cfg.encoder_layers + 1
        shapes[HISTORY_WEIGHT], shapes[HISTORY_WEIGHT_C] = (rows, rows), (rows, rows)
        for norm in (HISTORY_NORM, PREDICTION_NORM):
            for i in range(cfg.encoder_layers):
                shapes[f"{norm}{i}.weight"], shapes[f"{norm}{i}.bias"] = (c,), (c,)
    return shapes


def lower_mean(rows: int) -> np.ndarray:
    """The corrector's released init: row r holds 1 / (r + 1) in its first r + 1 entries, 0 after."""
    return np.tril(np.ones((rows, rows))) / np.arange(1, rows + 1)[:, None]


def _xavier(rng, shape):
    """Xavier-uniform: U(-sqrt(6 / (fan_in + fan_out)), +sqrt(...)), fan_in, fan_out = shape[1], shape[0]."""
    return rng.uniform(-1.0, 1.0, size=shape) * np.sqrt(6.0 / (shape[0] + shape[1]))


def init_encoder_params(config, seed: int = 0, *, perturb: bool = False, dtype=np.float64) -> dict:
    """Deterministic parameters (NumPy's PCG64 seeded with `seed`, drawn in name order), the
    released init: every weight matrix Xavier-uniform, every bias 0, the LayerNorms weight 1 and
    bias 0, alpha 1 (an ema family's 1/2), the corrector's weights their row means, a time-dependent
    stack's f_weight and f_bias 0 and f_b 1e-4 N(0, 1) as released (its other matrices Xavier-uniform
    here, where qkvflow draws haliax's normal init). With perturb=True each bias, norm parameter
    and alpha, f_weight, f_bias, f_b, and each corrector weight read (the lower triangle), gets
    U(-0.5, 0.5) added, so that a test or a golden case exercises them (a zero bias would let a
    port that drops it pass)."""
    cfg = ODEEncoderConfig.from_any(config)
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in encoder_param_shapes(cfg).items():
        if name in (HISTORY_WEIGHT, HISTORY_WEIGHT_C):
            value = lower_mean(shape[0])
            if perturb:
                value = value + np.tril(rng.uniform(-0.5, 0.5, size=shape))
        elif temporal_init(name):
            value = 1e-4 * rng.standard_normal(shape) if temporal_init(name) == "small" else np.zeros(shape)
            if perturb:
                value = value + rng.uniform(-0.5, 0.5, size=shape)
        elif len(shape) == 2 and name != ALPHA:
            value = _xavier(rng, shape)
        else:
            identity = alpha_init(cfg) if name == ALPHA else 1.0 if name.endswith("weight") else 0.0
            value = np.full(shape, identity)  # 1-D weights above: the norms'
            if perturb:
                value = value + rng.uniform(-0.5, 0.5, size=shape)
        params[name] = np.asarray(value, dtype=dtype)
    return params


def _deciding(cfg: ODEEncoderConfig) -> str:
    """The fields that decide the stack's parameter names, as a refusal names them."""
    if cfg.temporal:
        return f"time_embed_dim={cfg.time_embed_dim} (qkvflow's stack: one block at any encoder_layers)"
    return (f"encoder_layers={cfg.encoder_layers}, encoder_normalize_before={cfg.encoder_normalize_before}, "
            f"family={cfg.family!r}, macaron={cfg.macaron}, encoder_history_type={cfg.encoder_history_type!r}")


def alpha_init(config) -> float:
    """alpha's released init: 1/2 for an ema family's (PCformer's alpha.data.fill_(0.5)), 1 for rk2_weighted's."""
    return 0.5 if ODEEncoderConfig.from_any(config).family in EMA_FAMILIES else 1.0


def temporal_init(name: str):
    """The released init of a time-dependent stack's f_weight, f_bias ('zeros': each norm starts as
    LayerNorm's identity) and f_b ('small': 1e-4 N(0, 1)); None for any other name (the stack's rule)."""
    leaf = name.rpartition(".")[2]
    return "zeros" if leaf in TEMPORAL_ZERO else "small" if leaf == TEMPORAL_SMALL else None


def check_encoder_params(params, config) -> None:
    """ValueError unless params has exactly the stack's names, shapes and float dtypes."""
    cfg = ODEEncoderConfig.from_any(config)
    expected = encoder_param_shapes(cfg)
    if not hasattr(params, "keys"):
        raise ValueError(f"params: expected a dict of arrays; got {type(params).__name__}")
    if ALPHA in params and cfg.family == "rk2_weighted" and tuple(np.shape(params[ALPHA])) != expected[ALPHA]:
        raise ValueError(f"params['alpha']: rk2_weighted has one weight per stage, shape {expected[ALPHA]}; "
                         f"got shape {tuple(np.shape(params[ALPHA]))}")
    if ALPHA in params and cfg.family in EMA_FAMILIES and tuple(np.shape(params[ALPHA])) != expected[ALPHA]:
        raise ValueError(f"params['alpha']: {cfg.family} with alpha_type={cfg.alpha_type!r}, layer_wise={cfg.layer_wise} "
                         f"has shape {expected[ALPHA]}; got shape {tuple(np.shape(params[ALPHA]))}")
    missing = [k for k in expected if k not in params]
    extra = sorted(k for k in params if k not in expected)
    if missing or extra:
        raise ValueError(
            f"params: for {_deciding(cfg)} expected exactly the {len(expected)} names of encoder_param_shapes; "
            f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}, unexpected {extra[:6]}{' ...' if len(extra) > 6 else ''}")
    for name, shape in expected.items():
        value = params[name]
        if not hasattr(value, "dtype"):
            raise ValueError(f"params[{name!r}]: expected an array; got {type(value).__name__}")
        if tuple(np.shape(value)) != shape:
            sizes = (f" (time_embed_dim={cfg.time_embed_dim}, sinusoidal_dim={cfg.sinusoidal_dim})" if cfg.temporal else "")
            raise ValueError(f"params[{name!r}]: expected shape {shape}{sizes}; got {tuple(np.shape(value))}")
        try:
            dtype = np.dtype(value.dtype)  # NumPy's and JAX's arrays (traced ones too)
        except TypeError:
            dtype = None  # a dtype NumPy does not name: the port checks its own
        if dtype is not None and dtype.kind != "f" and dtype.name != "bfloat16":
            raise ValueError(f"params[{name!r}]: expected a floating dtype; got {dtype}")


# fairseq 0.10's layer (PCformer's released encoder) names its attention's projections one by one and
# its norms by role; the fused layout here holds the same numbers: in_proj rows q, k, v.
SPLIT_PROJECTIONS = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")
NAMED_NORMS = {"self_attn_layer_norm.": "layer_norms.0.", "final_layer_norm.": "layer_norms.1."}


def stack_params(state_dict: dict) -> dict:
    """The stack's entries of a released encoder's state_dict: everything but the embedding's keys
    (EMBEDDING_PREFIXES), a fairseq 0.10 layer's keys (PCformer's) in the layout here: its q_proj,
    k_proj and v_proj stacked as in_proj (rows q, k, v), self_attn_layer_norm as layer_norms.0 and
    final_layer_norm as layer_norms.1. Any other key stays, so a strict load still names it.
    The arrays are NumPy's (a port converts its tensors first)."""
    if not hasattr(state_dict, "items") or not all(isinstance(k, str) for k in state_dict):
        raise TypeError(f"state_dict: expected a dict of parameter name -> array; got {type(state_dict).__name__}")
    def split(key):
        """(layer's prefix, 'weight' or 'bias') of a q/k/v_proj key whose three projections are all
        present; None otherwise (such a key stays, and a strict load names it)."""
        for p in SPLIT_PROJECTIONS:
            layer, _, rest = key.partition("." + p)
            if rest and all(f"{layer}.{q}{rest}" in state_dict for q in SPLIT_PROJECTIONS):
                return layer, rest
        return None

    out = {}
    for key, value in state_dict.items():
        if key.startswith(EMBEDDING_PREFIXES):
            continue
        if (parts := split(key)) is not None:
            layer, rest = parts
            if key == f"{layer}.{SPLIT_PROJECTIONS[0]}{rest}":  # the three stacked once, at q's place
                out[f"{layer}.self_attn.in_proj_{rest}"] = np.concatenate(
                    [np.asarray(state_dict[f"{layer}.{q}{rest}"]) for q in SPLIT_PROJECTIONS])
            continue
        if key.startswith("layers."):
            for named, numbered in NAMED_NORMS.items():
                key = key.replace(f".{named}", f".{numbered}")
        out[key] = value
    return out

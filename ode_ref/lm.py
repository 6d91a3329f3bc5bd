"""A small decoder language model built from ODE attention blocks, so that the block can be
deployed and checked as a whole model (not a training framework).

    ids (batch, seq) -> embed_tokens -> num_layers blocks -> layer_norm -> lm_head -> logits (batch, seq, vocab)

    LMConfig                          vocab_size, num_layers, block, and the block's ODEConfig fields
    init_lm_params(cfg, seed)         the parameters, by the names below
    lm_logits(params, ids, cfg, attention_mask=None)        every position's logits, no cache
    lm_greedy(params, ids, cfg, new_tokens, attention_mask=None) -> (tokens, logits)
                                      greedy decoding with the exact cache (cache.py): each block's
                                      prefill on the prompt, then one decode_step per new token

Parameter names (D = hidden_size, V = vocab_size):

    embed_tokens.weight    (V, D)
    blocks.N.<name>        block N's parameters by the block's own names (params.py), e.g.
                           blocks.0.ode_func.qkv.weight
    norm.weight, norm.bias (D,)   the final layer_norm (eps 1e-5)
    lm_head.weight         (V, D) no bias

block "attention" is the ODE attention block (F = attention alone) in the config's mode, with any
solver, norm, BitLinear and positional encoding the block takes. block "layer" is the ODE
Transformer's encoder layer (F = attention + FFN) in decoder mode, one layer per block, its
parameters blocks.N.<the stack's names> (lm_layer.py). attention_mask (batch, seq), True or 1 = a real token; a prompt
padded on either side decodes as the unpadded one would (positions count real tokens only).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, fields

import numpy as np

from .block import decode_step, ode_block, prefill
from .cache import evaluations
from .config import ODEConfig, field_values
from .encoder_config import ODEEncoderConfig
from .encoder_params import check_encoder_params, encoder_param_shapes, init_encoder_params
from .lm_layer import layer_block, layer_config, layer_evaluations, visible_keys
from .norms import layer_norm
from .params import check_params, init_params, param_shapes

BLOCKS = ("attention", "layer")
EMBED, NORM_W, NORM_B, HEAD = "embed_tokens.weight", "norm.weight", "norm.bias", "lm_head.weight"
_BLOCK_FIELDS = tuple(f for f in fields(ODEConfig) if f.name not in ("hidden_size", "num_heads", "mode"))


def block_prefix(i: int) -> str:
    return f"blocks.{i}."


@dataclass(frozen=True)
class _LMFields:
    vocab_size: int  # V: token ids are 0 .. V - 1
    num_layers: int  # blocks, each with its own parameters
    hidden_size: int  # D, the block's
    num_heads: int
    block: str = "attention"  # "attention" (the ODE attention block) or "layer" (the encoder layer)
    mode: str = "decoder"  # the block's mode; an LM decodes causally (encoder mode: lm_logits only)
    ffn_dim: int = 0  # block "layer": the FFN's inner width; 0 is 4 hidden_size

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1; got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.block not in BLOCKS:
            raise ValueError(f"block: expected one of {', '.join(map(repr, BLOCKS))}; got {self.block!r}")
        if isinstance(self.ffn_dim, (bool, np.bool_)) or not isinstance(self.ffn_dim, numbers.Integral) or self.ffn_dim < 0:
            raise ValueError(f"ffn_dim: expected an integer >= 0 (0: 4 hidden_size); got {self.ffn_dim!r}")
        self.block_config  # the block's fields checked now, by ODEConfig
        if self.block == "layer":
            if self.mode != "decoder":
                raise ValueError(f"mode: the 'layer' block is the encoder layer in decoder mode; expected 'decoder'; "
                                 f"got {self.mode!r}")
            layer_config(self)

    @property
    def layer_config(self) -> ODEEncoderConfig:
        """block 'layer': the one-layer encoder stack every block is (lm_layer.py)."""
        return layer_config(self)

    @property
    def evaluations(self) -> int:
        """Evaluations of F per block, each with its own K and V: steps x stages, or the layer's stages."""
        return layer_evaluations(self.layer_config) if self.block == "layer" else evaluations(self.block_config)

    @property
    def block_config(self) -> ODEConfig:
        """The config every block of the model shares."""
        return ODEConfig.from_any({f.name: getattr(self, f.name) for f in fields(ODEConfig)})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_any(cls, obj) -> "LMConfig":
        """An LMConfig from an LMConfig, a dict of field names (an unknown key is refused) or an object."""
        if isinstance(obj, LMConfig):
            return obj
        return LMConfig(**field_values(LMConfig, obj, ("vocab_size", "num_layers", "hidden_size", "num_heads")))


# LMConfig: _LMFields followed by every other ODEConfig field with its default, so that a block
# option added to ODEConfig is an LMConfig field too.
LMConfig = dataclasses.make_dataclass(
    "LMConfig", [(f.name, f.type, dataclasses.field(default=f.default)) for f in _BLOCK_FIELDS],
    bases=(_LMFields,), frozen=True, namespace={"__doc__": (
        "The language model's config: vocab_size, num_layers, block ('attention' or 'layer'), and the block's "
        "ODEConfig fields (mode defaults to 'decoder').")})
LMConfig.__module__ = __name__


def lm_param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the model with its shape, in order."""
    cfg = LMConfig.from_any(config)
    v, d = cfg.vocab_size, cfg.hidden_size
    shapes = {EMBED: (v, d)}
    block = encoder_param_shapes(cfg.layer_config) if cfg.block == "layer" else param_shapes(cfg.block_config)
    for i in range(cfg.num_layers):
        shapes.update({block_prefix(i) + k: s for k, s in block.items()})
    shapes.update({NORM_W: (d,), NORM_B: (d,), HEAD: (v, d)})
    return shapes


def init_lm_params(config, seed: int = 0, *, dtype=np.float64) -> dict:
    """Deterministic parameters: the embedding N(0, 1) and lm_head U(-1/sqrt(D), 1/sqrt(D)) from
    NumPy's PCG64 seeded with seed; block i from init_params(seed + 1 + i, perturb_norms=True)
    (block 'layer': init_encoder_params(seed + 1 + i, perturb=True)), so every norm parameter and
    bias is exercised; the final norm weight 1, bias 0."""
    cfg = LMConfig.from_any(config)
    rng = np.random.default_rng(seed)
    d = cfg.hidden_size
    params = {EMBED: rng.normal(size=(cfg.vocab_size, d))}
    for i in range(cfg.num_layers):
        block = (init_encoder_params(cfg.layer_config, seed + 1 + i, perturb=True) if cfg.block == "layer" else
                 init_params(cfg.block_config, seed=seed + 1 + i, perturb_norms=True))
        params.update({block_prefix(i) + k: v for k, v in block.items()})
    params[NORM_W], params[NORM_B] = np.ones(d), np.zeros(d)
    params[HEAD] = rng.uniform(-1.0, 1.0, size=(cfg.vocab_size, d)) / np.sqrt(d)
    return {k: np.asarray(v, dtype=dtype) for k, v in params.items()}


def block_params(params: dict, i: int) -> dict:
    """Block i's parameters under the block's own names."""
    prefix = block_prefix(i)
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def check_lm_params(params, config) -> None:
    """ValueError unless params has exactly the model's names and shapes (each block's by check_params)."""
    cfg = LMConfig.from_any(config)
    if not hasattr(params, "keys"):
        raise ValueError(f"params: expected a dict of arrays; got {type(params).__name__}")
    expected = lm_param_shapes(cfg)
    missing, extra = [k for k in expected if k not in params], sorted(k for k in params if k not in expected)
    if missing or extra:
        raise ValueError(f"params: for num_layers={cfg.num_layers} expected exactly the {len(expected)} names of "
                         f"lm_param_shapes; missing {missing[:6]}, unexpected {extra[:6]}")
    for name in (EMBED, NORM_W, NORM_B, HEAD):
        if tuple(np.shape(params[name])) != expected[name]:
            raise ValueError(f"params[{name!r}]: expected shape {expected[name]}; got {tuple(np.shape(params[name]))}")
    for i in range(cfg.num_layers):
        try:
            if cfg.block == "layer":
                check_encoder_params(block_params(params, i), cfg.layer_config)
            else:
                check_params(block_params(params, i), cfg.block_config)
        except ValueError as err:
            raise ValueError(f"{block_prefix(i)}{err}") from None


def check_ids(ids, config, attention_mask=None):
    """(ids int64, mask bool or None) after the checks: ids an integer array (batch, seq), each in
    [0, vocab_size); attention_mask bool or 0/1 integers of ids' shape, every row with a real token."""
    cfg = LMConfig.from_any(config)
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" or ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(f"ids: expected integer token ids of shape (batch, seq), batch, seq >= 1; "
                         f"got {ids.dtype} {ids.shape}")
    if ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise ValueError(f"ids: expected ids in [0, {cfg.vocab_size}) (vocab_size); got {int(ids.min())} .. {int(ids.max())}")
    if attention_mask is None:
        return ids.astype(np.int64), None
    mask = np.asarray(attention_mask)
    if mask.shape != ids.shape or not (mask.dtype == bool or (mask.dtype.kind in "iu" and np.isin(mask, (0, 1)).all())):
        raise ValueError(f"attention_mask: expected bool or 0/1 integers of shape {ids.shape} (1 = a real token); "
                         f"got {mask.dtype} {mask.shape}")
    mask = mask.astype(bool)
    if not mask.any(axis=1).all():
        raise ValueError("attention_mask: expected at least one real token per row")
    return ids.astype(np.int64), mask


def _head(params, z, dtype):
    h = layer_norm(z, params[NORM_W].astype(dtype), params[NORM_B].astype(dtype))
    return h @ params[HEAD].astype(dtype).T


def lm_logits(params, ids, config, attention_mask=None, *, dtype=np.float64):
    """The logits (batch, seq, vocab) at every position, no cache: ode_block per block over the
    whole sequence with attention_mask as its padding mask. dtype: float64 (the golden mode) or float32."""
    cfg = LMConfig.from_any(config)
    check_lm_params(params, cfg)
    ids, mask = check_ids(ids, cfg, attention_mask)
    z = params[EMBED].astype(dtype)[ids]
    for i in range(cfg.num_layers):
        block = {k: v.astype(dtype) for k, v in block_params(params, i).items()}
        if cfg.block == "layer":
            keys = np.ones(ids.shape, bool) if mask is None else mask
            z, _ = layer_block(block, z, cfg.layer_config, visible_keys(keys, 0, ids.shape[1]))
        else:
            z = ode_block(block, z, cfg.block_config, mask)
    return _head(params, z, dtype)


def lm_greedy(params, ids, config, new_tokens: int, attention_mask=None, *, dtype=np.float64):
    """(tokens (batch, new_tokens) int64, logits (batch, new_tokens, vocab)): greedy decoding of a
    prompt with the exact cache. Step s's logits are those that chose tokens[:, s]
    (argmax; the lowest id of a tie): the prompt's last real token's, then each decoded token's.
    The prompt may be padded on the left or the right (ONNX Runtime GenAI pads on the right): the
    decoded tokens follow every prompt slot, and each token's position counts the real tokens
    before it, so a padded row decodes as its unpadded prompt would."""
    cfg = LMConfig.from_any(config)
    check_lm_params(params, cfg)
    ids, mask = check_ids(ids, cfg, attention_mask)
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, numbers.Integral) or new_tokens < 1:
        raise ValueError(f"new_tokens: expected an integer >= 1; got {new_tokens!r}")
    blocks = [{k: v.astype(dtype) for k, v in block_params(params, i).items()} for i in range(cfg.num_layers)]
    embed, max_len = params[EMBED].astype(dtype), ids.shape[1] + new_tokens
    if cfg.block == "layer":
        return _layer_greedy(params, blocks, embed, ids, cfg, new_tokens, mask, dtype)
    z, caches = embed[ids], []
    for block in blocks:
        z, cache = prefill(block, z, cfg.block_config, mask, max_len=max_len)
        caches.append(cache)
    step_logits = [_head(params, z[np.arange(len(ids)), _last_real(ids, mask)][:, None], dtype)]  # each row's last real token
    for _ in range(new_tokens - 1):
        z = embed[step_logits[-1][:, 0].argmax(axis=-1)][:, None]
        for i, block in enumerate(blocks):
            z, caches[i] = decode_step(block, z, caches[i], cfg.block_config)
        step_logits.append(_head(params, z, dtype))
    logits = np.concatenate(step_logits, axis=1)
    return logits.argmax(axis=-1).astype(np.int64), logits


def _last_real(ids, mask):
    """Each row's last real token's slot."""
    if mask is None:
        return np.full(len(ids), ids.shape[1] - 1)
    return ids.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)


def _layer_greedy(params, blocks, embed, ids, cfg, new_tokens: int, mask, dtype):
    """lm_greedy for block 'layer': each block's evaluations keep their K and V (lm_layer.py)."""
    keys = np.ones(ids.shape, bool) if mask is None else mask
    z, caches = embed[ids], []
    for block in blocks:
        z, present = layer_block(block, z, cfg.layer_config, visible_keys(keys, 0, ids.shape[1]))
        caches.append(present)
    step_logits = [_head(params, z[np.arange(len(ids)), _last_real(ids, mask)][:, None], dtype)]
    for _ in range(new_tokens - 1):
        z = embed[step_logits[-1][:, 0].argmax(axis=-1)][:, None]
        keys = np.concatenate([keys, np.ones((len(ids), 1), bool)], axis=1)
        for i, block in enumerate(blocks):
            z, caches[i] = layer_block(block, z, cfg.layer_config, visible_keys(keys, keys.shape[1] - 1, 1), caches[i])
        step_logits.append(_head(params, z, dtype))
    logits = np.concatenate(step_logits, axis=1)
    return logits.argmax(axis=-1).astype(np.int64), logits

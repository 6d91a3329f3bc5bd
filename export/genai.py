"""The spec's language model (ode_ref/lm.py) as a folder ONNX Runtime GenAI loads and generates from.

    DIR/model.onnx          opset 17, float32
        inputs:  input_ids int64 [batch, seq]; attention_mask int64 [batch, total_seq] (1 = a real
                 token; total_seq = past_seq + seq); past_key_values.<l>.key / .value float32
                 [batch, heads, past_seq, head_dim] for each cache layer l
        outputs: logits float32 [batch, seq, vocab]; present.<l>.key / .value [batch, heads, total_seq, head_dim]
    DIR/genai_config.json   the sizes, the layer count, the input and output names, the search defaults

A cache layer is one evaluation of f: block b's evaluation e (step-major, stage-minor, as
ode_ref/cache.py orders them) is layer b * evaluations + e, so num_hidden_layers = num_layers x
ode_steps x stages. The present arrays are the past ones with this call's tokens appended (the
concat form: GenAI's past_present_share_buffer false).

The positions and the padding come from attention_mask, as GenAI feeds it (prompts of
different lengths padded on the right, then one column of 1 per generated token): a token's
position is the count of real tokens before it (cumsum - 1, as the spec's positions_from_padding), a padded key is
hidden, the query at slot i sees keys j <= i, and a padded query is zeroed as in the spec's
prefill. Each block is the export's own stages (export/attention.py) run by the spec's
Stages.integrate on main-graph Values (block 'layer': the encoder's stages, LayerStages), with a
kv hook that concatenates each evaluation's past (ConcatCache), or in the shared-buffer form
writes it in place (export.genai_shared_buffer).
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ode_ref as R
from ode_ref.config import PAPE_ENCODINGS
from ode_ref.files import replacing, writing_set
from ode_ref.lm import EMBED, HEAD, NORM_B, NORM_W, LMConfig, block_params, block_prefix, check_lm_params

from .attention import SelfAttention
from .block import block_initializers, block_weights
from .encoder import OnnxEncoderStages
from .genai_shared_buffer import OPSET as SHARED_OPSET, SharedCache, SharedSelfAttention, key_mask, write_indices
from .graph import Body, Value, ir_version
from .norms import layer_norm

OPSET = 17
MODEL_FILE, CONFIG_FILE = "model.onnx", "genai_config.json"
PAST, PRESENT = "past_key_values.%d.", "present.%d."
EXPORTED_ENCODINGS = ("none", "rope", "sinusoidal_rotary", "alibi")  # checked against the spec in tests


def check_genai_config(config) -> LMConfig:
    """The config, or ValueError naming the field GenAI's cache cannot reproduce exactly."""
    cfg = LMConfig.from_any(config)
    if cfg.mode != "decoder":
        raise ValueError(f"mode: GenAI generates token by token with a cache, which needs mode='decoder' (in encoder "
                         f"mode every token sees later ones); got {cfg.mode!r}")
    encoding = cfg.block_config.position_encoding
    if cfg.block_config.ssmax:
        raise ValueError("use_ssmax: SSMax's seed rule (ssmax_length 'padded') scales by the whole padded length, so "
                         "each new token changes every earlier one and no cache reproduces it; the 'visible' rule is "
                         "not exported for GenAI; expected use_ssmax=false")
    if encoding in PAPE_ENCODINGS:
        raise ValueError(f"positional_encoding: {encoding!r} (PaPE) takes its score term from each query's own state "
                         f"at every evaluation, which GenAI's key-value cache does not hold; expected one of "
                         f"{', '.join(EXPORTED_ENCODINGS)}")
    if encoding not in EXPORTED_ENCODINGS:
        raise ValueError(f"positional_encoding: the GenAI export takes {', '.join(EXPORTED_ENCODINGS)} "
                         f"(or ode_use_pe=false); got {encoding!r}")
    return cfg


def cache_layers(config) -> int:
    """GenAI's num_hidden_layers: one cache layer per evaluation of f of each block."""
    cfg = LMConfig.from_any(config)
    return cfg.num_layers * cfg.evaluations


class LayerStages(OnnxEncoderStages):
    """Block 'layer' (ode_ref/lm_layer.py): the encoder's stages on graph Values, each evaluation's
    k, v (heads-first, GenAI's layout already) stored by the cache (ConcatCache or, in the shared
    form, genai_shared_buffer.SharedCache) as present.<layer>; the layer attends to what it returns."""

    def __init__(self, config, cache):
        super().__init__(config)
        self.cache = cache

    def cache_kv(self, k, v):
        k, v = self.cache.store(k, "key"), self.cache.store(v, "value")
        self.cache.layer += 1
        return k, v


class ConcatCache:
    """The kv hook of Stages.evaluate for one block: evaluation e's past (GenAI's layout) with
    this call's k, v appended, written out as present.<layer>, and returned in the spec's layout
    (batch, total_seq, heads, head_dim) for the attention."""

    def __init__(self, main: Body, first_layer: int):
        self.main, self.layer = main, first_layer

    def store(self, new_t: Value, name: str) -> Value:
        """present.<layer>.<name>: the past with new_t (batch, heads, seq, head_dim) appended."""
        g, present = self.main, PRESENT % self.layer + name
        g.nodes.append(helper.make_node("Concat", [PAST % self.layer + name, new_t.name], [present], name=present, axis=2))
        return Value(g, present)

    def append(self, new: Value, name: str) -> Value:
        g = self.main
        return g.op("Transpose", self.store(g.op("Transpose", new, perm=[0, 2, 1, 3]), name), perm=[0, 2, 1, 3])

    def __call__(self, k, v):
        k, v = self.append(k, "key"), self.append(v, "value")
        self.layer += 1
        return k, v


def _renamed(weights, prefix: str):
    """block_weights' Values (nested in tuples and dicts) under block prefix's initializer names."""
    if isinstance(weights, Value):
        return Value(weights.body, prefix + weights.name)
    if isinstance(weights, tuple):
        return tuple(_renamed(w, prefix) for w in weights)
    return {k: _renamed(w, prefix) for k, w in weights.items()}


def _inputs(main: Body, shared: bool = False, see_self: bool = False):
    """(x, the visible keys (batch, 1, seq, keys), query padding, query positions, key positions,
    the shared form's write_indices or None) from input_ids and attention_mask. The keys are the
    total_seq slots, or in the shared form the buffers' max_length slots (those past total_seq hidden).
    see_self: every query sees its own slot too (block 'layer', ode_ref.lm_layer.visible_keys)."""
    g = main
    ids, mask = Value(g, "input_ids"), Value(g, "attention_mask")
    x = g.op("Gather", Value(g, EMBED), ids, axis=0)  # (batch, seq, D)
    seq, total = g.op("Shape", ids, start=1, end=2), g.op("Shape", mask, start=1, end=2)
    past = total - seq
    key_ints, keys_len = key_mask(g, mask, total, PAST % 0 + "key") if shared else (mask, total)
    keys = g.op("Cast", key_ints, to=TensorProto.BOOL)  # (batch, keys)
    key_positions = g.op("CumSum", key_ints, g.const(1, np.int64)) - g.const(1, np.int64)
    axis = g.ints(1)
    positions = g.op("Slice", key_positions, past, total, axis)  # (batch, seq)
    padding = g.op("Slice", keys, past, total, axis)
    one, zero = g.const(1, np.int64), g.const(0, np.int64)
    i = g.op("Range", g.op("Squeeze", past, g.ints(0)), g.op("Squeeze", total, g.ints(0)), one)
    j = g.op("Range", zero, g.op("Squeeze", keys_len, g.ints(0)), one)
    causal = g.op("LessOrEqual", g.op("Unsqueeze", j, g.ints(0)), g.op("Unsqueeze", i, g.ints(1)))  # (seq, keys)
    seen = g.op("Unsqueeze", keys, g.ints(1, 2))  # (batch, 1, 1, keys)
    if see_self:
        seen = g.op("Or", seen, g.op("Unsqueeze", g.op("Equal", g.op("Unsqueeze", j, g.ints(0)), g.op("Unsqueeze", i, g.ints(1))), g.ints(0, 1)))
    visible = g.op("And", g.op("Unsqueeze", causal, g.ints(0, 1)), seen)
    return x, visible, padding, positions, key_positions, write_indices(g, mask, seq, total) if shared else None


def _initializer_arrays(cfg: LMConfig, params: dict) -> dict:
    out = {EMBED: np.asarray(params[EMBED], np.float32)}
    for b in range(cfg.num_layers):
        block = block_params(params, b)
        arrays = ({k: np.asarray(v, np.float32) for k, v in block.items()} if cfg.block == "layer" else
                  block_initializers(cfg.block_config, block))
        out.update({block_prefix(b) + k: v for k, v in arrays.items()})
    out[NORM_W], out[NORM_B] = np.asarray(params[NORM_W], np.float32), np.asarray(params[NORM_B], np.float32)
    out[HEAD + "_t"] = np.ascontiguousarray(np.asarray(params[HEAD], np.float32).T)
    return out


def export_genai_model(config, params, *, shared_buffer: bool = False) -> onnx.ModelProto:
    """model.onnx of the folder (module docstring) for (config, params), an onnx.ModelProto;
    shared_buffer=True: the in-place form of export.genai_shared_buffer (opset 24)."""
    cfg = check_genai_config(config)
    check_lm_params(params, cfg)
    shared_buffer = check_shared_buffer(shared_buffer)
    block = cfg.block_config
    opset = SHARED_OPSET if shared_buffer else OPSET
    main = Body("", opset)
    x, visible, padding, positions, key_positions, writes = _inputs(main, shared_buffer, see_self=cfg.block == "layer")
    per_block = cfg.evaluations
    for b in range(cfg.num_layers):
        cache = SharedCache(main, b * per_block, writes, PAST, PRESENT) if shared_buffer else ConcatCache(main, b * per_block)
        if cfg.block == "layer":  # the spec's attention (ode_ref/encoder_layer.py) over what the cache returns
            weights = {k: Value(main, block_prefix(b) + k) for k in block_params(params, b)}
            x = LayerStages(cfg.layer_config, cache).block(weights, 0, x, visible)
            continue
        att = (SharedSelfAttention if shared_buffer else SelfAttention)(block, OPSET)  # opset 17's stage shapes
        weights = _renamed(block_weights(block, main), block_prefix(b))
        prepared = att.prepare_with(weights, x, visible, padding, positions, key_positions, None)
        x = att.integrate(prepared, x, cache, trajectory=False)[-1]
    h = layer_norm(x, Value(main, NORM_W), Value(main, NORM_B))
    logits = main.op("MatMul", h, Value(main, HEAD + "_t"))
    main.nodes.append(helper.make_node("Identity", [logits.name], ["logits"]))

    kv = lambda seq: ["batch", block.num_heads, "max_length" if shared_buffer else seq, block.head_dim]  # noqa: E731
    layers = range(cache_layers(cfg))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_seq"])]
    inputs += [helper.make_tensor_value_info(PAST % e + n, TensorProto.FLOAT, kv("past_seq")) for e in layers for n in ("key", "value")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", cfg.vocab_size])]
    outputs += [helper.make_tensor_value_info(PRESENT % e + n, TensorProto.FLOAT, kv("total_seq")) for e in layers for n in ("key", "value")]
    graph = helper.make_graph(main.nodes, "ode_attention_lm", inputs, outputs, initializer=[
        numpy_helper.from_array(v, k) for k, v in _initializer_arrays(cfg, params).items()])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, producer_name="odeattn", producer_version=R.__version__, opset_imports=opsets,
                              ir_version=ir_version(opsets))
    helper.set_model_props(model, {"odeattn_version": R.__version__, "lm_config": json.dumps(cfg.to_dict(), sort_keys=True),
                                   "past_present_share_buffer": str(shared_buffer).lower()})
    return model


MAX_LENGTH = 2**31 - 1  # GenAI reads max_length (and context_length) as a 32-bit int


def _integer(value) -> bool:
    """value is an integer (Python's or NumPy's), and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_token_id(cfg: LMConfig, name: str, value) -> int:
    """value as an int, if it is a token id of cfg's vocabulary; ValueError naming `name` otherwise."""
    if not _integer(value) or not 0 <= value < cfg.vocab_size:
        raise ValueError(f"{name}: expected an integer token id in [0, {cfg.vocab_size}) (vocab_size); got {value!r}")
    return int(value)


def check_max_length(max_length) -> int:
    """max_length as an int, if it is an integer in [1, MAX_LENGTH] (the prompt and the generated
    tokens); ValueError naming it otherwise (a bool or a float is no integer)."""
    if not _integer(max_length) or not 1 <= max_length <= MAX_LENGTH:
        raise ValueError(f"max_length: expected an integer in [1, {MAX_LENGTH}] (the prompt and the generated tokens; "
                         f"GenAI reads a 32-bit int); got {max_length!r}")
    return int(max_length)


def check_shared_buffer(shared_buffer) -> bool:
    """shared_buffer as a bool, if it is True or False; ValueError naming it otherwise (the string
    "no" would count as true, and write the shared-buffer model)."""
    if not isinstance(shared_buffer, (bool, np.bool_)):
        raise ValueError(f"shared_buffer: expected True or False (GenAI's past_present_share_buffer); got {shared_buffer!r}")
    return bool(shared_buffer)


def genai_config(config, *, max_length: int = 256, pad_token_id: int = 0, eos_token_id: int | None = None,
                 shared_buffer: bool = False) -> dict:
    """genai_config.json's content: the sizes, the layer count (cache_layers), the names, and
    greedy search of at most max_length tokens (prompt included). GenAI pads a batch's shorter
    prompts with pad_token_id and reads that id in a prompt as padding; eos_token_id (default:
    pad_token_id) ends a row."""
    cfg = check_genai_config(config)
    block = cfg.block_config
    max_length, shared_buffer = check_max_length(max_length), check_shared_buffer(shared_buffer)
    pad_token_id = check_token_id(cfg, "pad_token_id", pad_token_id)
    eos = pad_token_id if eos_token_id is None else check_token_id(cfg, "eos_token_id", eos_token_id)
    return {
        "model": {
            "type": "decoder",
            "bos_token_id": pad_token_id, "pad_token_id": pad_token_id, "eos_token_id": eos,
            "vocab_size": cfg.vocab_size, "context_length": max_length,
            "decoder": {
                "filename": MODEL_FILE, "session_options": {"log_id": "odeattn", "provider_options": []},
                "hidden_size": block.hidden_size, "head_size": block.head_dim,
                "num_attention_heads": block.num_heads, "num_key_value_heads": block.num_heads,
                "num_hidden_layers": cache_layers(cfg),
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": PAST + "key", "past_value_names": PAST + "value"},
                "outputs": {"logits": "logits", "present_key_names": PRESENT + "key", "present_value_names": PRESENT + "value"},
            },
        },
        "search": {"do_sample": False, "num_beams": 1, "top_k": 1, "top_p": 1.0, "temperature": 1.0,
                   "max_length": max_length, "min_length": 0, "repetition_penalty": 1.0,
                   "past_present_share_buffer": shared_buffer, "num_return_sequences": 1, "early_stopping": True},
    }


def write_genai(config, params, folder, **search) -> tuple[Path, Path]:
    """Write folder/model.onnx and folder/genai_config.json (genai_config's search options); their
    paths. A new folder (missing or empty) appears with both files or not at all (files.writing_set)."""
    folder = Path(folder)
    gen = genai_config(config, **search)  # its checks before the model is built
    model = export_genai_model(config, params, shared_buffer=gen["search"]["past_present_share_buffer"])
    with writing_set(folder) as into:
        with replacing(into / MODEL_FILE) as tmp:  # each file whole or not at all
            onnx.save(model, str(tmp))
        with replacing(into / CONFIG_FILE) as tmp:
            tmp.write_text(json.dumps(gen, indent=1) + "\n")
    return folder / MODEL_FILE, folder / CONFIG_FILE

"""ONNX Runtime's own deployment tools on an exported block: the inlined graph, int8 dynamic
quantisation, and the saved optimised model.

inline(model): the graph without model-local functions (onnx.inliner), for tools and runtimes
that do not read them: export_model's default, and what it makes of functions=True. These are the nodes ONNX Runtime runs after inlining the functions
itself, so it computes the same z; the file grows with the steps (each evaluation is written out).

int8_error_bound(config, params, x): the bound on the error of quantize_dynamic(...,
reduce_range=True) on the default export, derived from the quantisation steps.

quiet_quantizer(): onnxruntime.quantization without its advice to pre-process, on every call.

quantize_int8(model): onnxruntime.quantization.quantize_dynamic on the inlined graph (the Loop
form: on its Loop's body, quantize_dynamic's EnableSubgraph, which it needs), MatMuls only. Each projection's weight initializer becomes int8 (one scale per tensor), its input is
quantised at every call (DynamicQuantizeLinear: uint8, one scale per tensor) and the product is a
MatMulInteger. Lossy, so not a conformance backend. This is not the BitLinear path (ternary
weights, exact accumulation): a BitLinear block is refused, its weights are dequantised in the
graph and no initializer reaches a MatMul.

save_optimized(model, path): the graph ONNX Runtime runs after every optimisation
(SessionOptions.optimized_model_filepath); at ORT_ENABLE_ALL it may hold kernels specific to
this machine's CPU, so it is for the machine kind it was written on.

check_against_spec(model, config, params): the error of an exported model (the block, the
prefill or the decode-step model, in any of these forms) in ONNX Runtime against the spec on a
random batch: what `odeattn export` prints after writing a file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx

import ode_ref as R

from . import check_batch
from ode_ref.cache import evaluations
from ode_ref.norms import apply_norm
from ode_ref.precision import half_block

from .graph import inline as inline  # export_model's default form; here beside the other tools
from .half import numpy_dtype

PROJECTIONS = 4  # MatMuls with a weight initializer per evaluation of f: q, k, v, out_proj


def _props(model: onnx.ModelProto) -> dict:
    return {p.key: p.value for p in model.metadata_props}


def config_of(model: onnx.ModelProto) -> R.ODEConfig:
    """The config an exported model's metadata holds."""
    return R.ODEConfig.from_any(json.loads(_props(model)["config"]))


def check_quantizable(config, *, name: str = "int8 quantisation") -> None:
    """ValueError unless int8 dynamic quantisation applies to this block: float weights. The
    message begins with name (a command passes the option that asked for it)."""
    if R.ODEConfig.from_any(config).use_bitnet:
        raise ValueError(f"{name}: expected a float block; got use_bitnet=true, whose ternary weights are "
                         "dequantised in the graph (nothing to quantise; its exact integer path is BitLinear)")


def int8_error_bound(config, params, x) -> float:
    """The bound on max|z_int8 - z| / max|z| for quantize_dynamic(..., reduce_range=True) on the
    default export, derived from the quantisation steps (docs/export.md, "Deploying").

    Each projection y = a W^T rounds W to 7 bits, step s_w = max|W| / 64, and its input a to uint8,
    step s_a = range(a) / 255 (per tensor, at every call). Rounding errors, uniform and independent,
    add to y a relative rms error eps = sqrt((s_w^2 / mean(W^2) + s_a^2 / mean(a^2)) / 12). f has two
    projections in series (q, k, v, then out_proj); the attention between them averages v and
    moves the softmax by at most as much again, so f's relative rms error is at most 3 eps, and
    z(1) - x, a combination of f's values, carries it: rms(dz) <= 3 eps rms(z(1) - x). The max of
    a sum of many independent roundings over the batch's values is within 4.5 rms of it (a
    Gaussian tail of 7e-6). The input's range is the first stage's norm output's, over the batch,
    as the out projection's input (an average of v's rows) has a smaller range for its rms.
    It assumes attention scores of order one, as at init: the softmax's change grows with the
    scores' magnitude, which it leaves out (qkv weights scaled by 8: the error is 6.8x the bound)."""
    config = R.ODEConfig.from_any(config)
    check_quantizable(config)
    w = [params["ode_func.qkv.weight"], params["ode_func.out_proj.weight"]]
    h = apply_norm(config.norm_type, {k.rsplit(".", 1)[1]: v for k, v in params.items() if k.startswith("ode_func.norm.")}, x)
    a_term = ((max(h.max(), 0) - min(h.min(), 0)) / 255) ** 2 / np.mean(h ** 2)
    eps = max(np.sqrt(((np.abs(m).max() / 64) ** 2 / np.mean(m ** 2) + a_term) / 12) for m in w)
    z = R.ode_block(params, x, config)
    return float(4.5 * 3 * eps * np.sqrt(np.mean((z - x) ** 2)) / np.abs(z).max())


class _QuietPreprocessHint(logging.Filter):
    """onnxruntime.quantization advises shape-inference pre-processing on every call; quantize_int8
    checks instead that every projection was quantised."""

    def filter(self, record):
        return "pre-processing before quantization" not in record.getMessage()


@contextlib.contextmanager
def quiet_quantizer():
    """Within it, onnxruntime.quantization's advice to pre-process (a root-logger warning on every
    call) is not printed; other warnings are. quantize_int8 (odeattn export --quantize int8) runs in it."""
    hint = _QuietPreprocessHint()
    logging.getLogger().addFilter(hint)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(hint)


def quantize_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """The block (exported, with or without its local functions) with every projection dynamically
    quantised to int8; RuntimeError if any projection was left in float.

    The weights are quantised to 7 bits (quantize_dynamic's reduce_range), so the file is as
    accurate on every x86 CPU: on one without VNNI, ONNX Runtime multiplies uint8 activations by
    int8 weights with AVX2's pairwise multiply-add, whose 16-bit sums saturate at full range: there
    8-bit weights err over ten times as much against the spec as 7-bit ones."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cfg = config_of(model)
    check_quantizable(cfg)
    flat = inline(model) if len(model.functions) else model
    looped = loop_body(flat) is not None
    with quiet_quantizer(), tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "int8.onnx")
        quantize_dynamic(flat, path, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         reduce_range=True, extra_options={"EnableSubgraph": True} if looped else None)
        out = onnx.load(path)
    if looped:
        in_order(out.graph)
    found = sum(n.op_type == "MatMulInteger" for n in out.graph.node)
    want = PROJECTIONS * evaluations(cfg)
    if looped:  # the body holds one step: PROJECTIONS x stages
        found, want = sum(n.op_type == "MatMulInteger" for n in loop_body(out).node), want // cfg.ode_steps
    if found != want:
        where = f"{evaluations(cfg) // cfg.ode_steps} evaluations in the Loop's body" if looped else f"{evaluations(cfg)} evaluations"
        raise RuntimeError(f"int8 quantisation: expected {want} MatMulInteger nodes ({PROJECTIONS} projections x "
                           f"{where}); onnxruntime's quantiser made {found}")
    onnx.helper.set_model_props(out, {**_props(flat), "quantization": "int8 dynamic (lossy)"})
    return out


def _needs(node) -> set:
    """The names a node reads: its inputs, and what its subgraphs read from the outer scope."""
    names = set(node.input)
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            inner = {i.name for i in a.g.input} | {t.name for t in a.g.initializer} | {o for n in a.g.node for o in n.output}
            names |= {name for n in a.g.node for name in _needs(n)} - inner
    return names - {""}


def in_order(graph) -> None:
    """graph's nodes sorted in place so that each comes after what it and its subgraphs read
    (onnx.checker requires it; onnxruntime's quantiser leaves a Loop before the values its body
    reads from the outer scope). The nodes keep their order where they may."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    pending, ordered = list(graph.node), []
    while pending:
        ready = next((n for n in pending if _needs(n) <= known), None)
        if ready is None:
            raise ValueError(f"graph: no order computes {sorted(_needs(pending[0]) - known)[:3]}")
        pending.remove(ready)
        ordered.append(ready)
        known |= set(ready.output)
    del graph.node[:]
    graph.node.extend(ordered)


def transformer_fusions():
    """onnxruntime.transformers.optimizer's options for an exported block: every fusion but the
    layer norms'. The block's norms compute their statistics on x / s per token (export.norms),
    which no fused LayerNormalization or SimplifiedLayerNormalization expresses, and the simplified
    layer norm's pattern matcher fails with a TypeError on them (onnxruntime 1.32)."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_layer_norm = False
    return options


def save_optimized(model_path, out_path, *, threads: int | None = None) -> None:
    """Write what ONNX Runtime runs for the model at model_path (every optimisation on) to out_path."""
    from .runtime import session

    session(model_path, threads=threads, optimized_path=out_path)


def optimized_path(output) -> Path:
    """Where the optimised model of `output` is written: block.onnx -> block.optimized.onnx."""
    return Path(output).with_suffix(".optimized.onnx")


def loop_body(model: onnx.ModelProto):
    """The Loop form's body graph (export.loop), or None for a model without a Loop."""
    loop = next((n for n in model.graph.node if n.op_type == "Loop"), None)
    return None if loop is None else next(a.g for a in loop.attribute if a.name == "body")


def node_counts(model: onnx.ModelProto) -> tuple[int, int]:
    """(nodes in the file, nodes ONNX Runtime runs once the local functions are inlined); the Loop
    form: its body's nodes counted once stored, and once per step (at its default) run."""
    sizes = {f.name: len(f.node) for f in model.functions}
    body = loop_body(model)
    per_step = 0 if body is None else len(body.node)

    def inlined(nodes):
        return sum(inlined(next(f.node for f in model.functions if f.name == n.op_type)) if n.op_type in sizes else 1
                   for n in nodes)

    steps = int(_props(model).get("ode_steps", 0))
    return len(model.graph.node) + sum(sizes.values()) + per_step, inlined(model.graph.node) + steps * per_step


def check_against_spec(model: onnx.ModelProto, config, params) -> float:
    """max|z - z_spec| / max|z_spec| of the exported model, run in ONNX Runtime in float32, against
    ode_ref.ode_block in float64 on a random batch: x normal [2, 8, hidden_size], seed 0 (a half
    export: in its dtype, against ode_ref.precision.half_block in that dtype). A block
    model runs on it with the second row padded after 5 tokens (every token real if the model has
    no padding_mask input); a prefill model on the 8 tokens; a decode-step model generates them one
    by one from an empty cache."""
    from .decode import OnnxDecoder, session_runner
    from .runtime import declared_inputs, run, session

    cfg = R.ODEConfig.from_any(config)
    graph = _props(model).get("kind", "block")  # the metadata key "kind" names the graph (ExportOptions.graph)
    x, mask = check_batch(cfg.hidden_size, padded=False)
    x32 = x.astype(np.float32)
    dtype = _props(model).get("dtype", "float32")  # a half export (export.half): against the spec's policy
    if graph == "block":
        if "padding_mask" in {i.name for i in model.graph.input}:
            mask = check_batch(cfg.hidden_size)[1]
        fed = x32 if dtype == "float32" or _props(model).get("keep_io_types") == "true" else x32.astype(numpy_dtype(dtype))
        steps = cfg.ode_steps if "steps" in declared_inputs(model) else None  # a required steps input: the config's
        z = run(model, session(model), fed, mask, steps=steps)["z"].astype(np.float32)
        if dtype != "float32":
            want = half_block(params, x, cfg, mask, dtype=dtype)
            return float(np.abs(z - want).max() / np.abs(want).max())
    elif graph == "prefill":
        z = OnnxDecoder(cfg, prefill_run=session_runner(model)).prefill(x32, None, x32.shape[1])[0]
    else:
        z = OnnxDecoder(cfg, decode_run=session_runner(model)).generate(x32)
    want = R.ode_block(params, x, cfg, mask)
    return float(np.abs(z - want).max() / np.abs(want).max())

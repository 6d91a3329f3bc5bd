"""The whole ODE attention block as one ONNX model, built from the spec's config and parameters.

    inputs:  x float32 [batch, seq, d_model]; padding_mask bool [batch, seq] (unless omitted)
    output:  z float32 [batch, seq, d_model] = z(1)

Structure: the main graph holds the parameters (initializers, stored once), the mask and the
weight quantisation (computed once), then one node per step calling the local function
`ode_step`, whose body is ode_ref.rk.rk_step run on symbolic values: one call of the local
function `ode_func` per stage, combined with the tableau's coefficients. The calls pass the
projection weights by their initializer names, so the inlined graph's MatMuls read them directly.
By default the functions are then inlined (export.graph.inline): every step and stage is written
out, the graph ONNX Runtime runs, and the one ONNX Runtime's quantiser and optimizer can read.
functions=True keeps them: the file holds each once, and a step adds one call node to it (~200
bytes), nothing that grows with the width.

export_model(..., steps_input=True) writes the Loop form instead (export.loop): an int64 input
`steps` (default ode_steps) and one Loop node whose body is one step, stages written out.

Every export function here takes the model's form as one ExportOptions (export.options: its
fields, their rules and their errors), or that object's fields as keywords.

export_prefill_model: the prompt through a decoder-mode block, returning the cache, opset 17:

    inputs:  x float32 [batch, seq, d_model]; padding_mask bool [batch, seq] (unless omitted);
             max_len int64 []
    outputs: z float32 [batch, seq, d_model]; present_key_<e>, present_value_<e> float32
             [batch, max_len, heads, head_dim]; present_padding_mask bool [batch, max_len]

export_decode_model: one decoding step of a decoder-mode block, on the spec's fixed-size cache
(ode_ref/cache.py), opset 17:

    inputs:  x_t float32 [batch, 1, d_model]; index int64 [] (the slot to write: tokens so far);
             padding_mask bool [batch, max_len]; past_key_<e>, past_value_<e> float32
             [batch, max_len, heads, head_dim] for each evaluation e = 0 .. steps x stages - 1
    outputs: z float32 [batch, 1, d_model]; present_padding_mask; present_key_<e>, present_value_<e>

A generation loop feeds the present outputs back as the past inputs with index + 1. Both models
are ode_ref's Stages.prefill and Stages.decode run on symbolic values, their steps unrolled in the
main graph: each evaluation of f records, or reads and writes, its own cache slot.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ode_ref as R
from ode_ref.attention import Prepared
from ode_ref.bitlinear import ternarize_weight
from ode_ref.block import attention_for
from ode_ref.cache import KVCache, check_mode, evaluations
from ode_ref.norms import NORM_PARAMS
from ode_ref.precision import check_float16_range
from ode_ref.params import GATE_BIAS, GATE_WEIGHT, NORM_PREFIX, OUT_PROJ, POS_PREFIX, QKV, encoder_shapes
from ode_ref.recording import STAGES, recording
from ode_ref.rk import rk_step, step_times
from ode_ref.variants import port_variant
from ode_ref.multistep import MultistepMethod, solve, solver, solver_of
from ode_ref.tableaus import TABLEAUS

from .attention import SelfAttention
from .bitlinear import check_form, product_scale
from .graph import Body, Function, Value, inline, ir_version
from .half import HalfIO, as_storage, half_export_attention, stored_params
from .loop import STEPS, Scalar, loop_over_steps, outer, step_count, step_size, step_time, steps_info, steps_initializer
from .options import ExportOptions, loop_refusal


BLOCKS = ("q", "k", "v")  # W_qkv's row blocks, in the spec's order


def _scale_name(bitlinear: str) -> str:
    """A BitLinear weight's scale: w_s (float form) or the integer form's c = 1 / (127 w_s)."""
    return "product_scale" if bitlinear == "integer" else "scale"


def _encoder_names(cfg) -> dict:
    """The encoder's parameters: short name -> initializer name, the seed's name with _t added
    where the weight is stored transposed (PaPE's Linear weights, as every projection)."""
    return {k: POS_PREFIX + k + ("_t" if k.endswith(".weight") and k != "position.weight" else "")
            for k in encoder_shapes(cfg)}


def block_initializers(cfg, params, bitlinear: str = "float") -> dict:
    """Initializer name -> float32/int8 array: each weight transposed (in, out); W_qkv split into
    its q, k, v row blocks. BitLinear weights: ternary^T as int8 and a float32 scalar, computed
    by the spec's own functions on the whole tensor: w_s, or with bitlinear="integer" the
    product's scale c (export.bitlinear.product_scale)."""
    out = {}
    d = cfg.hidden_size
    for key, name in ((QKV, "qkv"), (OUT_PROJ, "out_proj")):
        w = np.asarray(params[key], np.float32)
        kind = "weight_t"
        if cfg.use_bitnet:
            ternary, scale = ternarize_weight(w)  # in float32, as the spec does for a float32 input
            if bitlinear == "integer":
                scale = product_scale(w)  # from the same float32 weights, in float64
            out[f"ode_func.{name}.{_scale_name(bitlinear)}"] = np.asarray(scale, np.float32)
            w, kind = ternary.astype(np.int8), "ternary_t"
        if name == "qkv":
            out.update({f"ode_func.qkv.{b}_{kind}": np.ascontiguousarray(w[i * d:(i + 1) * d].T) for i, b in enumerate(BLOCKS)})
        else:
            out[f"ode_func.out_proj.{kind}"] = np.ascontiguousarray(w.T)
    for k in NORM_PARAMS[cfg.norm_type]:
        out[NORM_PREFIX + k] = np.asarray(params[NORM_PREFIX + k], np.float32)
    for k, name in _encoder_names(cfg).items():
        w = np.asarray(params[POS_PREFIX + k], np.float32)
        out[name] = np.ascontiguousarray(w.T) if name.endswith("_t") else w
    if solver(cfg.ode_solver).gated:
        out["gate.weight_t"] = np.ascontiguousarray(np.asarray(params[GATE_WEIGHT], np.float32).T)
        out[GATE_BIAS] = np.asarray(params[GATE_BIAS], np.float32)
    return out


def _typed_initializers(cfg, params, bitlinear: str = "float", dtype: str = "float32") -> tuple[dict, set]:
    """(initializer name -> array, the names kept as they are): in float32, block_initializers; in a
    half dtype, those of the parameters rounded to it, stored in it, except BitLinear's ternary
    weights and scales (int8 and float32, exact: derived from the rounded weights in float32)."""
    if dtype == "float32":
        return block_initializers(cfg, params, bitlinear), set()
    out = block_initializers(cfg, stored_params(params, dtype), bitlinear)
    exact = {k for k in out if cfg.use_bitnet and k.startswith(("ode_func.qkv.", "ode_func.out_proj."))}  # ternary, scale
    return as_storage(out, dtype, exact), exact


def _half(cfg, params, att, io: HalfIO, bitlinear: str = "float"):
    """The export's attention under the half-precision policy of io.dtype (as it is in float32)."""
    if not io.half:
        return att
    stored, exact = _typed_initializers(cfg, params, bitlinear, io.dtype)
    return half_export_attention(att, io.dtype, set(stored) - exact, exact)


def block_weights(cfg, main, bitlinear: str = "float") -> dict:
    """The prepare stage's view of the initializers (Values in the main graph)."""
    kind = "ternary_t" if cfg.use_bitnet else "weight_t"
    w = {"qkv": tuple(Value(main, f"ode_func.qkv.{b}_{kind}") for b in BLOCKS),
         "out_proj": Value(main, f"ode_func.out_proj.{kind}")}
    if cfg.use_bitnet:
        scale = _scale_name(bitlinear)
        w["qkv_scale"], w["out_proj_scale"] = Value(main, f"ode_func.qkv.{scale}"), Value(main, f"ode_func.out_proj.{scale}")
    for k in NORM_PARAMS[cfg.norm_type]:
        w["norm." + k] = Value(main, NORM_PREFIX + k)
    w["encoder"] = {k: Value(main, name) for k, name in _encoder_names(cfg).items()}
    if solver(cfg.ode_solver).gated:
        w["gate"] = (Value(main, "gate.weight_t"), Value(main, GATE_BIAS))
    return w


def _flatten(prepared: Prepared) -> list:
    """The Values every evaluation reads, in field order (tuples and dicts opened, None skipped):
    the inputs of the local functions."""
    out = []
    for field in prepared:
        items = field if isinstance(field, tuple) else field.values() if isinstance(field, dict) else [field]
        out += [v for v in items if v is not None]
    return out


def _as_prepared(template: Prepared, values: list) -> Prepared:
    """The same structure as template, over a function's input Values."""
    it = iter(values)
    fields = []
    for field in template:
        if isinstance(field, tuple):
            fields.append(tuple(next(it) for _ in field))
        elif isinstance(field, dict):
            fields.append({k: next(it) for k in field})
        else:
            fields.append(None if field is None else next(it))
    return Prepared(*fields)


def _step_arguments(main: Body, prepared: Prepared, weights: dict) -> list:
    """What every step call passes: a projection's weight initializer by its own name, so that once
    the functions are inlined the projections' MatMuls read their weights directly (what
    quantisation tools look for); anything else (norm parameters, mask, positions, dequantised
    BitLinear weights) under a short alias w<i>, so that a step costs the file a few bytes."""
    stored = {v.name for v in _flatten((weights["qkv"], weights["out_proj"]))}
    out = []
    for i, v in enumerate(_flatten(prepared)):
        if v.name not in stored:
            main.nodes.append(helper.make_node("Identity", [v.name], [f"w{i}"]))
            v = Value(main, f"w{i}")
        out.append(v)
    return out


def _checked(config, params, options: ExportOptions, attention):
    """(config, the export's attention) after the checks every export runs once its options are
    built: parameters, the BitLinear form for this config, a variant that can be exported
    (export_attention), and with float16 every parameter within its range (the policy refuses
    what it would round to Inf)."""
    cfg = R.ODEConfig.from_any(config)
    R.check_params(params, cfg)
    check_form(options.bitlinear, cfg)
    if (refusal := loop_refusal(options, cfg)) is not None:
        raise ValueError(f"steps_input: {refusal} (export the default form)")
    attention = attention_for(cfg, attention)  # a variant built for another config is refused, as everywhere
    att = export_attention(attention, options.opset, options.bitlinear)
    for name, value in params.items():
        check_float16_range(f"params[{name!r}]", value, options.dtype)
    return cfg, att


class VariantExportError(NotImplementedError):
    """A variant's stage uses an operation the export cannot express."""


def _stage_named(variant: str, stage: str, method):
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except VariantExportError:
            raise
        except (NotImplementedError, TypeError, AttributeError) as err:
            raise VariantExportError(f"attention: the variant {variant}'s stage {stage} cannot be exported: {err}") from None
    return run


def export_attention(attention, opset: int, bitlinear: str = "float") -> SelfAttention:
    """The export's SelfAttention for attention (the spec's, or a variant of it): the variant's
    classes rebuilt over the export's stages (ode_ref.variants.port_variant), its settings copied,
    each overridden stage reporting its name if it uses an operation with no ONNX form. Variants
    export at opset 17, where q, k, v are (batch, seq, heads, head_dim) and the mask is bool."""
    cfg, variant = attention.config, type(attention)
    if variant is R.SelfAttention:
        return SelfAttention(cfg, opset, bitlinear)
    if opset != 17:
        raise ValueError(f"opset: a variant ({variant.__name__}) exports at opset 17, where its stages see the spec's "
                         f"shapes (at 23, q, k, v are 3D and the mask additive); got {opset!r}")
    ported = port_variant(variant, SelfAttention)
    own = {name for cls in variant.__mro__[:variant.__mro__.index(R.SelfAttention)]
           for name, value in vars(cls).items() if callable(value) and not name.startswith("__")}
    for stage in own:
        setattr(ported, stage, _stage_named(variant.__name__, stage, getattr(ported, stage)))
    att = ported.__new__(ported)
    SelfAttention.__init__(att, cfg, opset, bitlinear)
    vars(att).update({k: v for k, v in vars(attention).items() if k != "config"})  # the variant's settings
    return att


def _model(cfg, params, main: Body, inputs, outputs, functions, options: ExportOptions,
           extra_initializers=(), value_info=(), **props) -> onnx.ModelProto:
    opset, bitlinear = options.opset, options.bitlinear
    initializers, _ = _typed_initializers(cfg, params, bitlinear, options.dtype)
    graph = helper.make_graph(
        main.nodes, "ode_attention_block", inputs, outputs,
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()]
        + list(extra_initializers), value_info=list(value_info),
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(Function.DOMAIN, 1)]
    model = helper.make_model(graph, functions=functions, producer_name="odeattn", producer_version=R.__version__,
                              opset_imports=opsets, ir_version=ir_version(opsets))
    helper.set_model_props(model, {
        "odeattn_version": R.__version__,
        "config": json.dumps(cfg.to_dict(), sort_keys=True),
        "ode_solver": cfg.ode_solver,
        "ode_steps": str(cfg.ode_steps),
        "opset": str(opset),
        **({"bitlinear": bitlinear} if bitlinear != "float" else {}),  # a float file stays as it was
        **({"dtype": options.dtype, "keep_io_types": str(options.keep_io_types).lower()} if options.half else {}),  # a float32 one too
        **props,
    })
    return model


def export_model(config, params, options: ExportOptions | None = None, *, attention=None, **form) -> onnx.ModelProto:
    """The model `options` names for (config, params) as an onnx.ModelProto: by default the block
    (float32, or the half dtype given); graph="prefill" or "decode_step", export_prefill_model's or
    export_decode_model's. options: an ExportOptions, or form, its fields as keywords (opset=23,
    steps_input=True, ...; with options, they replace those fields). attention: a variant of the
    spec's SelfAttention exported in its place (opset 17).

    functions=False (default): every step and stage written out in the main graph, the graph
    ONNX Runtime runs; what its quantize_dynamic and transformers optimizer read (metadata
    form=inlined). functions=True: the steps as calls of the model-local functions ode_step and
    ode_func, a file that stays flat in the steps, which those two tools do not look into.

    diagnostics=True adds the outputs f0 = f(0, x) and step_1 .. step_n (the state after each
    step), which the conformance suite uses to name the first divergent quantity; with
    steps_input, f0 and trajectory [steps, batch, seq, d_model] (the state after each step).
    stages=True adds f(0, x)'s stage values under the spec's stage names (stage_outputs), which the
    conformance suite uses to name the first stage of f that diverges.
    bitlinear: with use_bitnet, "float" (default) dequantises the ternary weights once and runs
    float MatMuls; "integer" runs every projection as an exact integer product (MatMulInteger on
    the stored int8 ternary weights) times one float scale per token (export.bitlinear); the
    model's metadata then says bitlinear=integer.
    steps_input=True: the Loop form (export.loop), one file for any number of steps: an int64
    input `steps` (default the config's ode_steps) is the Loop's trip count; metadata form=loop.
    dtype: "float16" or "bfloat16" runs ode_ref.precision's policy (export.half): S initializers,
    x and the outputs typed S (keep_io_types=True: float32, holding S values), float32 between
    the policy's rounding points; the metadata says dtype and keep_io_types.
    """
    options = ExportOptions.of(options, **form)  # every rule of the form checked, before any work
    if options.graph != "block":
        return _cached(config, params, options, attention)
    opset, bitlinear, padding_mask = options.opset, options.bitlinear, options.padding_mask
    io = HalfIO(options.dtype, options.keep_io_types)
    cfg, att = _checked(config, params, options, attention)
    att = _half(cfg, params, att, io, bitlinear)
    main = Body("", opset)
    x = io.entry(main, Value(main, "x"))
    mask_in = Value(main, "padding_mask") if padding_mask else None
    weights = block_weights(cfg, main, bitlinear)
    prepared = att.prepare(weights, x, mask_in)
    d = cfg.hidden_size
    inputs = [helper.make_tensor_value_info("x", io.elem, ["batch", "seq", d])]
    if padding_mask:
        inputs.append(helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, ["batch", "seq"]))
    extra = stage_outputs(cfg, att, main, x, prepared, io) if options.stages else []
    if options.steps_input:
        outputs, shapes = _looped(cfg, att, main, x, prepared, options.diagnostics, io)
        return _model(cfg, params, main, inputs + [steps_info()], outputs + extra, [], options,
                      extra_initializers=[steps_initializer(cfg.ode_steps)] if options.steps_default else [],
                      value_info=shapes, form="loop")
    outputs, local = _unrolled(cfg, att, main, x, prepared, weights, options.diagnostics, io)
    model = _model(cfg, params, main, inputs, outputs + extra, local, options)
    return model if options.functions else inline(model)


def _state_info(name: str, d: int, *leading, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, [*leading, "batch", "seq", d])


def _output(main: Body, value: Value, name: str) -> None:
    main.nodes.append(helper.make_node("Identity", [value.name], [name], name=name if name != "z" else "output"))


def _unrolled(cfg, att, main: Body, x: Value, prepared: Prepared, weights: dict, diagnostics: bool, io: HalfIO):
    """(outputs, local functions) of the default form: one call of ode_step per step (a multistep
    solver's steps, which carry their past evaluations, written in the main graph: one call of
    ode_func per evaluation)."""
    shared = _step_arguments(main, prepared, weights)
    names = ["z", "t"] + [f"shared_{i}" for i in range(len(shared))]  # t: the stage's time (ode_step: the step's)

    func = Function("ode_func", names, main.opset)
    func.outputs = [att.evaluate(_as_prepared(prepared, func.inputs[2:]), func.inputs[1], func.inputs[0])]
    method, functions, evaluated = solver_of(cfg), [func.proto()], []
    if isinstance(method, MultistepMethod):
        def f(t, y):  # the first evaluation kept: f0 is it, not a second call of f(0, x)
            value = func.call(main, y, main.const(t), *shared)
            evaluated.append(value) if not evaluated else None
            return value

        states = solve(f, x, method, cfg.ode_steps)
    else:
        step = Function("ode_step", names, main.opset)
        stage = lambda t, y: func.call(step, y, t, *step.inputs[2:])  # noqa: E731
        gate = att.solution_gate(_as_prepared(prepared, step.inputs[2:]))
        step.outputs = [rk_step(stage, step.inputs[1], 1.0 / cfg.ode_steps, step.inputs[0], method, gate)]
        functions.append(step.proto())
        states = [x]
        for t0 in step_times(cfg.ode_steps):
            states.append(step.call(main, states[-1], main.const(t0), *shared))

    d = cfg.hidden_size
    extra = []
    if diagnostics:
        f0 = evaluated[0] if evaluated else func.call(main, x, main.const(0.0), *shared)
        _output(main, io.exit(main, f0), "f0")
        extra.append(_state_info("f0", d, elem=io.elem))
        for k, z in enumerate(states[1:], start=1):
            _output(main, io.exit(main, z), f"step_{k}")
            extra.append(_state_info(f"step_{k}", d, elem=io.elem))
    _output(main, io.exit(main, states[-1]), "z")
    return [_state_info("z", d, elem=io.elem)] + extra, functions


def stage_outputs(cfg, att, main: Body, x: Value, prepared: Prepared, io: HalfIO) -> list:
    """The outputs stage_<name> for each of the spec's stage names (ode_ref.recording: norm, q, k,
    v, attn, output_proj): f(0, x) evaluated once more in the main graph by the export's own
    attention, recording each stage's Value as it builds it. q, k, v and attn are (batch, seq,
    heads, head_dim) at every opset (at 23, where the graph keeps them 3D, reshaped for the output)."""
    cls = recording(type(att))
    rec = cls.__new__(cls)
    rec.__dict__.update(vars(att))
    rec.evaluate(prepared, main.const(0.0), x)
    d, heads = cfg.hidden_size, ["batch", "seq", cfg.num_heads, cfg.head_dim]
    outputs = []
    for name in STAGES:
        value, per_head = cls.store[name], name in ("q", "k", "v", "attn")
        if per_head and att.opset >= 23:
            value = main.op("Reshape", value, main.ints(0, 0, cfg.num_heads, cfg.head_dim))
        _output(main, io.exit(main, value), f"stage_{name}")
        outputs.append(helper.make_tensor_value_info(f"stage_{name}", io.elem, heads if per_head else ["batch", "seq", d]))
    return outputs


def _looped(cfg, att, main: Body, x: Value, prepared: Prepared, diagnostics: bool, io: HalfIO):
    """(the outputs, the Loop's outputs' shapes) of the Loop form: one Loop node over the steps
    (export.loop). The shapes are declared: onnx's shape inference leaves a Loop's loop-carried
    and scan outputs without one, though the body's outputs have theirs."""
    trip, steps = step_count(main)
    dt = step_size(steps)
    tableau = TABLEAUS[cfg.ode_solver]

    def make_step(body: Body, k: Value, z: Value) -> Value:
        inner = _as_prepared(prepared, [outer(body, v) for v in _flatten(prepared)])
        stage = lambda t, y: att.evaluate(inner, t.as_float(), y)  # noqa: E731
        return rk_step(stage, step_time(body, k, steps), Scalar(outer(body, dt)), z, tableau, att.solution_gate(inner))

    d = cfg.hidden_size
    z, trajectory = loop_over_steps(main, x, make_step, ["batch", "seq", d], trip=trip, trajectory=diagnostics)
    _output(main, io.exit(main, z), "z")
    outputs, shapes = [_state_info("z", d, elem=io.elem)], [_state_info(z.name, d)]
    if diagnostics:
        _output(main, io.exit(main, att.evaluate(prepared, main.const(0.0), x)), "f0")
        _output(main, io.exit(main, trajectory), "trajectory")
        outputs += [_state_info("f0", d, elem=io.elem), _state_info("trajectory", d, STEPS, elem=io.elem)]
        shapes.append(_state_info(trajectory.name, d, STEPS))
    return outputs, shapes


def decode_names(config) -> tuple[list[str], list[str]]:
    """The decode-step model's cache input names and output names, in KVCache field order
    (keys of every evaluation, values of every evaluation, padding mask)."""
    n = evaluations(R.ODEConfig.from_any(config))
    past = [f"past_key_{e}" for e in range(n)] + [f"past_value_{e}" for e in range(n)] + ["padding_mask"]
    present = [f"present_key_{e}" for e in range(n)] + [f"present_value_{e}" for e in range(n)] + ["present_padding_mask"]
    return past, present


def _cached_model(cfg, params, options: ExportOptions, main, z, cache, inputs) -> onnx.ModelProto:
    """The model whose outputs are z and the cache's present arrays, named as decode_names says."""
    _, present = decode_names(cfg)
    for value, name in zip([z, *cache.k, *cache.v, cache.padding_mask], ["z", *present]):
        main.nodes.append(helper.make_node("Identity", [value.name], [name], name=name))
    kv = ["batch", "max_len", cfg.num_heads, cfg.head_dim]
    seq = "seq" if options.graph == "prefill" else 1
    outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", seq, cfg.hidden_size])]
    outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, kv) for name in present[:-1]]
    outputs.append(helper.make_tensor_value_info(present[-1], TensorProto.BOOL, ["batch", "max_len"]))
    return _model(cfg, params, main, inputs, outputs, [], options, kind=options.graph)  # metadata "kind": the file format's key


def _check_cached(config, params, options: ExportOptions, attention):
    """(config, the export's attention) of a prefill or decode-step model: a decoder block, then _checked."""
    cfg = R.ODEConfig.from_any(config)
    check_mode(cfg)
    return _checked(cfg, params, options, attention)


def check_export(config, params, options: ExportOptions | None = None, *, attention=None, **form) -> ExportOptions:
    """The checks the export of `options` (or of form, its fields as keywords, as export_model
    takes them) runs before building anything: every rule of the form (ExportOptions), then the
    parameters, the mode, the BitLinear form for this config, a variant that can be exported and
    float16's range. ValueError or TypeError naming what it refuses, so a caller can check its
    input before the work; the options, once they pass."""
    options = ExportOptions.of(options, **form)
    (_checked if options.graph == "block" else _check_cached)(config, params, options, attention)
    return options


def _cached(config, params, options: ExportOptions, attention) -> onnx.ModelProto:
    """The prefill or decode-step model (options.graph) for export_model."""
    cfg, att = _check_cached(config, params, options, attention)
    main = Body("", options.opset)
    weights = block_weights(cfg, main)
    if options.graph == "prefill":
        x, mask = Value(main, "x"), Value(main, "padding_mask") if options.padding_mask else None
        max_len = main.op("Reshape", Value(main, "max_len"), main.ints(1))
        z, cache = att.prefill(weights, x, mask, max_len)
        d = cfg.hidden_size
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])]
        if options.padding_mask:
            inputs.append(helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, ["batch", "seq"]))
        inputs.append(helper.make_tensor_value_info("max_len", TensorProto.INT64, []))
        return _cached_model(cfg, params, options, main, z, cache, inputs)
    n = evaluations(cfg)
    past, _ = decode_names(cfg)
    cache = KVCache(cfg, tuple(Value(main, name) for name in past[:n]), tuple(Value(main, name) for name in past[n:2 * n]),
                    Value(main, "padding_mask"), Value(main, "index"))
    z, new = att.decode(weights, Value(main, "x_t"), cache)
    kv = ["batch", "max_len", cfg.num_heads, cfg.head_dim]
    inputs = [helper.make_tensor_value_info("x_t", TensorProto.FLOAT, ["batch", 1, cfg.hidden_size]),
              helper.make_tensor_value_info("index", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, kv) for name in past[:2 * n]]
    inputs.append(helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, ["batch", "max_len"]))
    return _cached_model(cfg, params, options, main, z, new, inputs)


def export_prefill_model(config, params, *, attention=None, **form) -> onnx.ModelProto:
    """The prompt through the block (decoder mode), with the cache it leaves, as an onnx.ModelProto
    (float32): export_model with graph="prefill"; see the module's docstring for its inputs and
    outputs. form: opset (17 only), padding_mask (False: a model without that input, for prompts
    whose every token is real; the cache's present_padding_mask is then True for the prompt's
    slots, as the spec's prefill without a mask gives)."""
    return export_model(config, params, ExportOptions(graph="prefill", **form), attention=attention)


def export_decode_model(config, params, *, attention=None, **form) -> onnx.ModelProto:
    """One cached decoding step of the block (decoder mode) as an onnx.ModelProto (float32):
    export_model with graph="decode_step"; see the module's docstring for its inputs and outputs.
    form: opset (17 only)."""
    return export_model(config, params, ExportOptions(graph="decode_step", **form), attention=attention)


def check(model: onnx.ModelProto) -> None:
    """onnx.checker with full shape inference (raises onnx.checker.ValidationError)."""
    onnx.checker.check_model(model, full_check=True)

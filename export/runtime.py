"""Running an exported block: ONNX Runtime sessions, and onnx's reference evaluator.

run() checks the feed against the model's own inputs first, so a wrong name, rank, width or
dtype is reported by name instead of surfacing as a runtime error deep in a kernel. The Loop
form's `steps` (export.loop) is an input with a default: a feed may give it or leave it out, and
one given is checked (an int64 scalar >= 1) before ONNX Runtime sees it.
"""

from __future__ import annotations

import numbers
import os
import re

import numpy as np
import onnx
from onnx import numpy_helper

from ode_ref.config import MAX_STEPS


class ModelError(ValueError):
    """A model file that is missing or is not a readable ONNX model."""


def load_model(path) -> onnx.ModelProto:
    """The model at path, checked by onnx.checker; ModelError naming the file if it is missing,
    is not an ONNX model at all (another kind of file, or one cut short), or is not a valid one.
    The message is one line: no parser's dump of the file."""
    shown = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError(f"model: no such file {shown!r}")
    try:
        model = onnx.load(shown)
    except OSError as err:  # an unreadable file
        raise ModelError(f"model {shown!r}: {err.strerror or err}") from None
    except onnx.checker.ValidationError as err:  # onnx's own refusal of external data outside the model's folder
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else "refused by onnx"
        raise ModelError(f"model {shown!r}: its external data is refused ({reason}); expected tensor files beside "
                         "the model, named by relative paths inside its folder") from None
    except Exception:  # protobuf's DecodeError, or json_format's ParseError for a .json file
        raise ModelError(f"model {shown!r}: not an ONNX model (it does not parse as one; "
                         "expected a .onnx file written by odeattn export)") from None
    try:
        onnx.checker.check_model(model)
    except Exception as err:  # ValidationError, ...
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ModelError(f"model {shown!r}: not a valid ONNX model ({type(err).__name__}: {reason})") from None
    custom = custom_ops(model)
    if custom:
        raise ModelError(f"model {shown!r}: uses the operator {custom[0]} of a custom-op domain, which ONNX Runtime runs "
                         f"only with that domain's library registered; expected the standard ONNX domains "
                         f"({', '.join(repr(d) for d in sorted(STANDARD_DOMAINS))}) and the model's own functions")
    return model


STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})  # what ONNX Runtime's CPU provider has


def custom_ops(model: onnx.ModelProto) -> list:
    """'domain:op' of each node (in the graph, its subgraphs and the local functions) whose domain is
    none of STANDARD_DOMAINS and that calls none of the model's local functions."""
    local = {(f.domain, f.name) for f in model.functions}
    found = []

    def visit(nodes):
        for node in nodes:
            if node.domain not in STANDARD_DOMAINS and (node.domain, node.op_type) not in local:
                found.append(f"{node.domain}:{node.op_type}")
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    visit(sub.node)

    visit(model.graph.node)
    for f in model.functions:
        visit(f.node)
    return sorted(set(found))


def block_width(model: onnx.ModelProto) -> int:
    """d_model from the model's x (or x_t) input; ModelError unless it is a block, prefill or
    decode-step model: an input x [batch, seq, d_model] or x_t [batch, 1, d_model] (d_model
    fixed) and an output z."""
    inputs = {vi.name: vi for vi in model.graph.input}
    outputs = [o.name for o in model.graph.output]
    name = "x_t" if "x_t" in inputs else "x"
    if name not in inputs:
        raise ModelError(f"model: expected an input 'x' [batch, seq, d_model]; it has inputs {sorted(inputs)}")
    if "z" not in outputs:
        raise ModelError(f"model: expected an output 'z'; it has outputs {outputs}")
    dims = inputs[name].type.tensor_type.shape.dim
    if len(dims) != 3 or not dims[2].HasField("dim_value"):
        raise ModelError(f"model: input 'x' must be [batch, seq, d_model] with d_model fixed; it has rank {len(dims)}")
    return dims[2].dim_value


def session(model, *, threads: int | None = None, optimized_path=None):
    """An onnxruntime InferenceSession on the CPU, every graph optimisation on; optimized_path:
    also write the optimised graph there (ONNX Runtime's warning that it may be specific to this
    machine's CPU is left out: export.deploy says so). A model with an input that has a default
    (the Loop form's steps) is not warned about it either."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    if optimized_path is not None:
        opts.optimized_model_filepath = os.fspath(optimized_path)
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model), load_external_data=False)
    check_stored_steps(proto)  # ONNX Runtime would fail on a bad one inside, in its own words
    if optimized_path is not None or default_inputs(proto):
        # errors only; for an input with a default (the Loop form's steps), ONNX Runtime warns that
        # it is not folded as a constant, which is what such an input is for
        opts.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    try:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's NotImplemented: an operator without a CPU kernel for its types
        found = re.search(r"Could not find an implementation for (\w+)\((\d+)\)", str(err))
        if found is None:
            raise
        raise ModelError(f"model: ONNX Runtime {ort.__version__}'s CPU provider has no kernel for {found[1]} (opset "
                         f"{found[2]}) with the types the model gives it (computing in bfloat16 has almost none: a half "
                         "export computes in float32, export.half)") from None


def _info(vi) -> tuple:
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)), dims


def default_inputs(model: onnx.ModelProto) -> dict:
    """input name -> (NumPy dtype, dims) for the inputs that also have an initializer of their
    name: a default that a feed may override (the Loop form's steps)."""
    stored = {t.name for t in model.graph.initializer}
    return {vi.name: _info(vi) for vi in model.graph.input if vi.name in stored}


def declared_inputs(model: onnx.ModelProto) -> dict:
    """input name -> (NumPy dtype, dims: int or symbolic str), for the inputs a feed gives (not
    an initializer that a model also lists as an input)."""
    stored = {t.name for t in model.graph.initializer}
    return {vi.name: _info(vi) for vi in model.graph.input if vi.name not in stored}


def check_x(x, width=None, *, name: str = "x", dtype=np.float32, seq=None) -> np.ndarray:
    """x as an array, checked: dtype float32 (or the one given), shape [batch, seq, width] with
    batch, seq >= 1 (width None: any; seq given: exactly that); TypeError or ValueError naming it."""
    x = np.asarray(x)
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}; got {x.dtype}")
    if x.ndim != 3 or (width is not None and x.shape[-1] != width) or 0 in x.shape or (seq is not None and x.shape[1] != seq):
        raise ValueError(f"{name}: expected shape [batch, {'seq' if seq is None else seq}, {'d_model' if width is None else width}] "
                         f"with batch, seq >= 1; got {list(x.shape)}")
    return x


def check_mask(mask, shape, *, name: str = "padding_mask") -> np.ndarray:
    """mask as an array, checked: dtype bool, the given shape (batch, seq); TypeError or ValueError naming it."""
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"{name}: expected dtype bool; got {mask.dtype}")
    if mask.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)} (batch, seq); got {list(mask.shape)}")
    return mask


NO_MASK = "padding_mask: this model was exported without a padding_mask input; got one"
STEPS = "steps"  # export.loop.STEPS (not imported: this module reads models, it builds none)


def check_steps(steps, *, name: str = STEPS) -> np.ndarray:
    """steps as an int64 scalar array, checked: an integer (a Python or NumPy integer, or an
    integer array of shape []) in [1, MAX_STEPS], the config's bound (the graph clamps to it,
    export.loop.step_count); TypeError or ValueError naming it (never NumPy's OverflowError)."""
    if isinstance(steps, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer in [1, {MAX_STEPS}]; got {steps!r}")
    if isinstance(steps, numbers.Integral):
        value = int(steps)  # a Python int of any size, before NumPy sees it
    else:
        a = np.asarray(steps)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer in [1, {MAX_STEPS}]; got {steps!r} ({a.dtype})")
        if a.shape != ():
            raise ValueError(f"{name}: expected a scalar (shape []); got shape {list(a.shape)}")
        value = int(a)
    if not 1 <= value <= MAX_STEPS:
        raise ValueError(f"{name}: expected an integer in [1, {MAX_STEPS}]; got {value}")
    return np.array(value, np.int64)


def check_stored_steps(model: onnx.ModelProto) -> None:
    """ValueError naming the stored default unless a Loop form's steps initializer is an int64
    scalar in [1, MAX_STEPS] and its input is declared int64 []: checked before ONNX Runtime
    builds a session (it would fail inside, in its words) and before a run that leaves steps out."""
    stored = next((t for t in model.graph.initializer if t.name == STEPS), None)
    if stored is None:
        return
    declared = next((vi for vi in model.graph.input if vi.name == STEPS), None)
    where = "the model's stored steps"
    if stored.data_type != onnx.TensorProto.INT64 or list(stored.dims):
        raise ValueError(f"{where}: expected an int64 scalar; got {onnx.helper.tensor_dtype_to_np_dtype(stored.data_type)} "
                         f"of shape {list(stored.dims)}")
    if declared is not None and _info(declared) != (np.dtype(np.int64), []):
        dtype, dims = _info(declared)
        raise ValueError(f"{where}: expected its input declared int64 of shape []; got {dtype} of shape {dims}")
    check_steps(numpy_helper.to_array(stored), name=where)


REQUIRED_STEPS = ("steps: this Loop form takes its step count as a required input (exported with "
                  "steps_default=False, odeattn export --steps-input --steps-required); expected steps; got none")


def fixed_steps(model: onnx.ModelProto) -> str:
    """Why a model without a steps input takes none, naming its step count (for the refusal)."""
    props = {p.key: p.value for p in model.metadata_props}
    steps, graph = props.get("ode_steps", "?"), props.get("kind", "block")  # the metadata key "kind" names the graph
    if graph != "block":
        return (f"steps: the {graph} model keeps a fixed step count (ode_steps={steps}: its cache layout depends on "
                "it); expected no steps")
    return (f"steps: this model runs a fixed step count (ode_steps={steps}, unrolled in the graph); export it with "
            "steps_input=True (odeattn export --steps-input) to choose the steps at run time")


def make_feed(model: onnx.ModelProto, x, padding_mask=None, steps=None) -> dict:
    """The feed for a block model, checked: x [batch, seq, d_model] of the model's dtype (float32,
    or a half export's float16 or bfloat16, export.half); padding_mask bool
    [batch, seq] (all True if the model takes one and none is given); steps (the Loop form only)
    an integer >= 1, or None for the model's default (its ode_steps)."""
    declared = declared_inputs(model)
    if "x" not in declared:
        raise ValueError(f"model inputs: expected 'x'; the model declares {sorted(declared)}")
    dtype, dims = declared["x"]
    x = check_x(x, dims[-1] if dims and isinstance(dims[-1], int) else None, dtype=dtype)
    check_half_feed(model, x)
    feed = {"x": x}
    if "padding_mask" in declared:
        feed["padding_mask"] = np.ones(x.shape[:2], bool) if padding_mask is None else check_mask(padding_mask, x.shape[:2])
    elif padding_mask is not None:
        raise ValueError(NO_MASK)
    if steps is not None:
        if STEPS not in default_inputs(model) and STEPS not in declared:
            raise ValueError(f"{fixed_steps(model)}; got steps={steps!r}")
        feed[STEPS] = check_steps(steps)
    elif STEPS in declared:
        raise ValueError(REQUIRED_STEPS)
    else:
        check_stored_steps(model)  # the default the run takes
    return feed


def check_half_feed(model: onnx.ModelProto, x) -> None:
    """For a float16 export (its metadata dtype), ValueError for what the ports' float16 policy
    refuses, in its words (ode_ref.precision): x beyond float16's range (a keep_io_types model takes
    float32 and would round it to Inf), and hope over more tokens than its factor r cosh(a) keeps
    within float16. The graph cannot refuse either itself: fed directly, ONNX Runtime gives NaN."""
    import json

    from ode_ref.config import ODEConfig
    from ode_ref.precision import check_float16_range, check_hope_range

    props = {p.key: p.value for p in model.metadata_props}
    if props.get("dtype") != "float16":
        return
    check_float16_range("x", x, "float16")
    if "config" in props:
        config = ODEConfig.from_any(json.loads(props["config"]))
        check_hope_range(config, "float16", x.shape[1], config.layer_idx)


def check_feed(declared: dict, feed: dict, defaults: dict | None = None) -> dict:
    """feed, checked against a model's declared inputs (declared_inputs) before ONNX Runtime sees
    it: every input given and no other, each of its declared dtype and rank, every fixed dim as
    declared, each symbolic dim (batch, seq, max_len) >= 1 and the same in every input that has
    it; TypeError or ValueError naming the input. The prefill and decode-step models' feeds
    (export.decode.OnnxDecoder) are checked with this, as make_feed checks a block model's.
    defaults (default_inputs): the inputs a feed may leave out; each one given is checked as the
    others, and steps is >= 1 besides."""
    defaults = defaults or {}
    declared = {**declared, **{name: info for name, info in defaults.items() if name in feed}}
    extra = sorted(set(feed) - set(declared))
    if extra:
        if extra == ["padding_mask"]:
            raise ValueError(NO_MASK)
        raise ValueError(f"{extra[0]}: the model has no such input; it takes {sorted(declared)}")
    missing = [name for name in declared if name not in feed]
    if missing:
        raise ValueError(f"{missing[0]}: the model takes this input; the feed has {sorted(feed)}")
    sizes: dict = {}  # symbolic dim -> (size, the input that set it)
    out = {}
    for name, (dtype, dims) in declared.items():
        a = np.asarray(feed[name])
        if a.dtype != dtype:
            raise TypeError(f"{name}: expected dtype {dtype.name}; got {a.dtype}")
        shown = "[" + ", ".join(map(str, dims)) + "]"
        if a.ndim != len(dims):
            raise ValueError(f"{name}: expected shape {shown}; got {list(a.shape)}")
        for dim, size in zip(dims, a.shape):
            if isinstance(dim, int) and dim and size != dim:
                raise ValueError(f"{name}: expected shape {shown}; got {list(a.shape)}")
            if isinstance(dim, str) and dim:
                if size < 1:
                    raise ValueError(f"{name}: expected shape {shown} with {dim} >= 1; got {list(a.shape)}")
                known, source = sizes.setdefault(dim, (size, name))
                if size != known:
                    raise ValueError(f"{name}: expected shape {shown} with {dim} = {known}, as in {source}; got {list(a.shape)}")
        out[name] = a
    if STEPS in defaults and STEPS in out:
        check_steps(out[STEPS])
    return out


def run_session(sess, names, feed: dict) -> list:
    """sess.run(names, feed), bfloat16 arrays (ml_dtypes) included: ONNX Runtime's Python API
    has no NumPy type for bfloat16, so such a feed goes in as OrtValues of its bits (uint16, typed
    bfloat16) and each bfloat16 output comes back as a copy of its bits, viewed as ml_dtypes'."""
    import ml_dtypes
    import onnxruntime as ort

    bf16 = np.dtype(ml_dtypes.bfloat16)
    if not any(np.asarray(a).dtype == bf16 for a in feed.values()) and not any(
            o.type == "tensor(bfloat16)" for o in sess.get_outputs() if o.name in names):
        return sess.run(names, feed)
    values = {k: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(a).view(np.uint16), onnx.TensorProto.BFLOAT16)
              if a.dtype == bf16 else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
              for k, a in ((k, np.asarray(a)) for k, a in feed.items())}
    return [_fetched(v, bf16) for v in sess.run_with_ort_values(names, values)]


def _fetched(value, bf16) -> np.ndarray:
    """An output OrtValue as a NumPy array: a bfloat16 one copied from its bits."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ctypes

    count = int(np.prod(value.shape()))
    bits = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr())) if count else np.empty(0, np.uint16)
    return bits.copy().view(bf16).reshape(value.shape())


def run(model: onnx.ModelProto, sess, x, padding_mask=None, outputs=None, steps=None) -> dict:
    """name -> array for the requested outputs (default: all) of an onnxruntime session; steps:
    the Loop form's step count (None: its default)."""
    names = outputs or [o.name for o in sess.get_outputs()]
    return dict(zip(names, run_session(sess, names, make_feed(model, x, padding_mask, steps))))


def run_reference(model: onnx.ModelProto, x, padding_mask=None, steps=None) -> dict:
    """The same with onnx.reference.ReferenceEvaluator, an independent NumPy runtime."""
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ref.run(None, make_feed(model, x, padding_mask, steps))))

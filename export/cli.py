"""`odeattn export` (config and weights in, .onnx out) and `odeattn run` (an exported model on
inputs from .npy files or a random batch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from odeattn.cli import check_output_path, non_negative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("export", help="export a block (config + weights) to ONNX", description=__doc__)
    p.add_argument("--config", required=True, type=Path, help="JSON file with the ODEConfig fields")
    p.add_argument("--weights", required=True, type=Path, help=".safetensors or .npz with the spec's parameter names")
    p.add_argument("-o", "--output", required=True, type=Path, help="the .onnx file to write")
    p.add_argument("--opset", type=int, default=None, choices=[17, 18, 23],
                   help="direct route: 17 (default) or 23; torch route: 18 (default) or 23")
    p.add_argument("--no-padding-mask", action="store_true", help="omit the padding_mask input")
    p.add_argument("--route", choices=["direct", "torch"], default="direct",
                   help="direct: built from the spec with onnx's helpers (default); torch: torch.onnx.export")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--prefill", action="store_true",
                      help="the prefill model: the prompt's z and the KV cache it leaves (decoder mode, opset 17)")
    kind.add_argument("--decode", action="store_true",
                      help="the decode-step model: one token and the cache in, its z and the new cache out "
                           "(decoder mode, opset 17)")
    p.add_argument("--bitlinear", choices=["float", "integer"], default="float",
                   help="with use_bitnet, BitLinear's products: float (default), dequantised weights and float MatMuls; "
                        "integer, exact int8 MatMulInteger on the ternary weights times one float scale per token "
                        "(block model of the direct route)")
    p.add_argument("--inline", action="store_true",
                   help="write the graph without model-local functions, for tools and runtimes that do not read "
                        "them (the same z; the file grows with the steps)")
    p.add_argument("--quantize", choices=["int8"],
                   help="int8: onnxruntime's dynamic quantisation of the four projections, on the inlined graph; "
                        "lossy, so not a conformance backend (float weights only: not with use_bitnet)")
    p.add_argument("--optimize", action="store_true",
                   help="also write the graph ONNX Runtime runs after its optimisations, as <output>.optimized.onnx "
                        "(it may hold kernels specific to this machine's CPU)")
    p.set_defaults(func=cmd_export)

    r = sub.add_parser("run", help="run an exported model in onnxruntime (a decode-step model: generating "
                                   "--seq tokens from an empty cache)")
    r.add_argument("model", type=Path)
    r.add_argument("--x", type=Path, help=".npy float32 [batch, seq, d_model]; default: a random batch")
    r.add_argument("--padding-mask", type=Path, help=".npy bool [batch, seq]")
    r.add_argument("--batch", type=positive_int, default=2)
    r.add_argument("--seq", type=positive_int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("-o", "--output", type=Path, default=None, help="save z here (.npy); default: print a summary only")
    r.add_argument("--repeats", type=positive_int, default=None,
                   help="also time N runs after one warm-up: latency median and min..max, and the session's creation")
    r.add_argument("--threads", type=non_negative_int, default=0,
                   help="ONNX Runtime's intra-op threads; default (0): every core")
    r.set_defaults(func=cmd_run)


def _fail(message: str) -> int:
    print(f"odeattn: {message}", file=sys.stderr)
    return 2


def read_json(option: str, path: Path):
    """The parsed file; ValueError naming the option and the file if it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{option} {str(path)!r}: not valid JSON ({err})") from None


def check_finite(params: dict) -> None:
    for name, value in params.items():
        if not np.isfinite(value).all():
            raise ValueError(f"--weights: params[{name!r}] holds NaN or Inf; a block with them computes nothing useful")


def _node_counts(model) -> tuple[int, int]:
    """(nodes in the file, nodes ONNX Runtime runs once the local functions are inlined)."""
    sizes = {f.name: len(f.node) for f in model.functions}

    def inlined(nodes):
        return sum(inlined(next(f.node for f in model.functions if f.name == n.op_type)) if n.op_type in sizes else 1
                   for n in nodes)

    return len(model.graph.node) + sum(sizes.values()), inlined(model.graph.node)


def cmd_export(args) -> int:
    import ode_ref as R

    from .block import check, export_model
    from .runtime import run, session

    try:
        check_output_path("-o", args.output, ".onnx")
        config = R.ODEConfig.from_any(read_json("--config", args.config))
        params = R.load_params(args.weights)
        R.check_params(params, config)
        check_finite(params)
    except FileNotFoundError as err:
        return _fail(f"--config/--weights: {err}")
    except (ValueError, TypeError) as err:
        return _fail(str(err))
    except OSError as err:  # a folder given as a file, an unreadable file
        return _fail(f"--config/--weights: {err.strerror}: {err.filename!r}")
    allowed = {"direct": (17, 23), "torch": (18, 23)}[args.route]
    opset = args.opset or allowed[0]
    if opset not in allowed:
        return _fail(f"--opset: the {args.route} route exports opset {' or '.join(map(str, allowed))}; got {opset}")
    try:
        check_deploy_options(args, config)
        check_bitlinear(args, config)
    except ValueError as err:
        return _fail(str(err))
    if args.prefill or args.decode:
        return export_cached(args, config, params, opset)
    notes = []
    if args.route == "direct":
        model = export_model(config, params, opset=opset, padding_mask=not args.no_padding_mask, bitlinear=args.bitlinear)
        check(model)
        try:
            model, notes = deploy_form(model, args)
        except RuntimeError as err:  # the quantiser left a projection in float: no file rather than a wrong one
            print(f"odeattn: {err}", file=sys.stderr)
            return 1
        args.output.write_bytes(model.SerializeToString())
        if args.bitlinear == "integer":
            from ode_ref.cache import evaluations

            from .deploy import PROJECTIONS

            notes.append(f"integer BitLinear: {PROJECTIONS} projections x {evaluations(config)} evaluations as exact MatMulInteger "
                         "(uint8 levels, int8 ternary weights) times one float scale per token; weights stored as int8 only")
    else:
        from odeattn.backends.torch import ODEAttentionBlock

        from .from_torch import export_torch

        block = ODEAttentionBlock.from_params(config, params)
        if args.no_padding_mask:
            return _fail("--no-padding-mask: the torch route always has a padding_mask input")
        export_torch(block, args.output, opset=opset)
    import onnx

    model = onnx.load(str(args.output))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 8, config.hidden_size))
    mask = None if args.no_padding_mask else np.array([[True] * 8, [True] * 5 + [False] * 3])
    z = run(model, session(model), x.astype(np.float32), mask)["z"]
    want = R.ode_block(params, x, config, mask)
    err = float(np.abs(z - want).max() / np.abs(want).max())
    stored, executed = _node_counts(model)
    print(f"wrote {args.output}: {args.output.stat().st_size / 1e3:.1f} kB, opset {opset}, "
          f"{stored} nodes stored ({executed} executed after inlining), "
          f"max relative error vs ode_ref (float64) on a random batch (2 x 8): {err:.2e}")
    if args.optimize:
        from .deploy import save_optimized

        save_optimized(args.output, optimized_path(args.output))
        notes.append(f"optimised model: {optimized_path(args.output)}, {optimized_path(args.output).stat().st_size / 1e3:.1f} kB "
                     "(ONNX Runtime's graph after every optimisation; it may hold kernels specific to this machine's CPU)")
    for note in notes:
        print(f"  {note}")
    return 0


DEPLOY_OPTIONS = ("inline", "quantize", "optimize")


def optimized_path(output: Path) -> Path:
    """Where --optimize writes: block.onnx -> block.optimized.onnx."""
    return output.with_suffix(".optimized.onnx")


def check_deploy_options(args, config) -> None:
    """ValueError naming the option unless --inline, --quantize and --optimize apply: the direct
    route's block model, float weights for int8, a writable path for the optimised model."""
    from .deploy import check_quantizable

    given = [f"--{o}" for o in DEPLOY_OPTIONS if getattr(args, o)]
    if not given:
        return
    other = "--prefill" if args.prefill else "--decode" if args.decode else f"--route {args.route}" if args.route != "direct" else None
    if other:
        raise ValueError(f"{'/'.join(given)}: expected the block model of the direct route; got {other}")
    if args.quantize:
        check_quantizable(config)
    if args.optimize:
        check_output_path("--optimize", optimized_path(args.output), ".onnx")


def check_bitlinear(args, config) -> None:
    """ValueError naming --bitlinear unless the integer form applies: the direct route's block
    model of a use_bitnet config (export.bitlinear.check_form)."""
    from .bitlinear import check_form

    if args.bitlinear == "float":
        return
    other = "--prefill" if args.prefill else "--decode" if args.decode else f"--route {args.route}" if args.route != "direct" else None
    if other:
        raise ValueError(f"--bitlinear {args.bitlinear}: expected the block model of the direct route; got {other}")
    try:
        check_form(args.bitlinear, config)
    except ValueError as err:
        raise ValueError(f"--{err}") from None  # its message begins 'bitlinear: '


def deploy_form(model, args):
    """(the model to write, notes to print): the export as is, inlined (--inline) or quantised to
    int8 on its inlined graph (--quantize int8)."""
    from .deploy import PROJECTIONS, inline, quantize_int8

    if args.quantize:
        int8 = quantize_int8(model)
        return int8, [f"int8 dynamic quantisation (lossy, not a conformance backend): {PROJECTIONS} projections x "
                      f"{sum(n.op_type == 'MatMulInteger' for n in int8.graph.node) // PROJECTIONS} evaluations as "
                      f"MatMulInteger; the float export is {len(model.SerializeToString()) / 1e3:.1f} kB"]
    if args.inline:
        return inline(model), ["inlined: no model-local functions; the file grows with the steps"]
    return model, []


def export_cached(args, config, params, opset: int) -> int:
    """--prefill or --decode: write the model, then run it as `odeattn run` does on a random batch
    of 8 tokens (the decode-step model generating them from an empty cache) and compare with
    ode_block on the whole sequence."""
    import ode_ref as R

    from .block import check, decode_names, export_decode_model, export_prefill_model
    from .runtime import session

    flag = "--prefill" if args.prefill else "--decode"
    if args.route != "direct":
        return _fail(f"{flag}: the direct route only; got --route {args.route}")
    try:
        model = (export_prefill_model if args.prefill else export_decode_model)(config, params, opset=opset)
    except ValueError as err:
        return _fail(str(err))
    check(model)
    args.output.write_bytes(model.SerializeToString())
    x = np.random.default_rng(0).normal(size=(2, 8, config.hidden_size))
    want = R.ode_block(params, x, config)
    out = run_cached(model, "prefill" if args.prefill else "decode_step", x.astype(np.float32), None, session(model))
    err = float(np.abs(out - want).max() / np.abs(want).max())
    what = "the prefill of 8 tokens" if args.prefill else "8 tokens decoded one by one from an empty cache"
    print(f"wrote {args.output}: {args.output.stat().st_size / 1e3:.1f} kB, opset {opset}, {len(model.graph.node)} nodes, "
          f"{len(decode_names(config)[0]) - 1} cache arrays; max relative error vs ode_ref on the whole sequence, {what} "
          f"(batch 2): {err:.2e}")
    return 0


def cmd_run(args) -> int:
    import os
    import time

    from .runtime import ModelError, load_model, make_feed, session

    threads = args.threads or os.cpu_count() or 1
    try:
        check_output_path("-o", args.output, ".npy")
        model = load_model(args.model)
        width = block_width(model)
        if args.x:
            x = np.load(args.x, allow_pickle=False)
        else:
            x = np.random.default_rng(args.seed).normal(size=(args.batch, args.seq, width)).astype(np.float32)
        mask = np.load(args.padding_mask, allow_pickle=False) if args.padding_mask else None
        kind = {p.key: p.value for p in model.metadata_props}.get("kind", "block")
        feed = make_feed(model, x, mask) if kind == "block" else None  # checked before the session is built
        start = time.perf_counter()
        sess = session(model, threads=threads)
        created = time.perf_counter() - start
        if kind == "block":
            forward = lambda: sess.run(["z"], feed)[0]  # noqa: E731
        else:
            forward = lambda: run_cached(model, kind, x, mask, sess)  # noqa: E731
        z = forward()  # also the warm-up of --repeats
    except (ModelError, ValueError, TypeError, FileNotFoundError) as err:
        return _fail(str(err))
    except OSError as err:  # a folder given as a file, an unreadable file
        return _fail(f"--x/--padding-mask: {err.strerror}: {err.filename!r}")
    summary = f"z: shape {list(z.shape)}, dtype {z.dtype}, finite {bool(np.isfinite(z).all())}, max |z| {float(np.abs(z).max()):.4g}"
    if args.output:
        np.save(args.output, z)
        summary += f", saved to {args.output}"
    print(summary)
    if args.repeats:
        print(latency(forward, args.repeats, created, threads, kind, x.shape))
    return 0


def latency(forward, repeats: int, created: float, threads: int, kind: str, shape) -> str:
    """One line: the median and min..max of `repeats` timed forwards (after the warm-up the caller
    ran), the thread count and the session's creation time."""
    import statistics

    from odeattn.bench import measure

    times = measure(forward, warmup=0, repeats=repeats)
    what = "a forward" if kind == "block" else "the prefill" if kind == "prefill" else f"decoding {shape[1]} tokens"
    return (f"latency of {what} (batch {shape[0]}, seq {shape[1]}), {repeats} runs after 1 warm-up, threads {threads}: "
            f"median {statistics.median(times) * 1e3:.2f} ms, min..max {min(times) * 1e3:.2f}..{max(times) * 1e3:.2f} ms; "
            f"session created in {created * 1e3:.0f} ms")


def run_cached(model, kind: str, x, mask, sess):
    """A prefill model on all of x; a decode-step model generating x's tokens one by one from an
    empty cache of seq slots (every token real: a padding mask is refused), in the session sess
    of model. Returns z."""
    from .block import decode_names

    config = json.loads({p.key: p.value for p in model.metadata_props}["config"])
    if x.dtype != np.float32 or x.ndim != 3:
        raise TypeError(f"x: expected float32 [batch, seq, d_model]; got {x.dtype} of shape {list(x.shape)}")
    b, t, _ = x.shape
    if kind == "prefill":
        mask = np.ones((b, t), bool) if mask is None else mask
        return sess.run(["z"], {"x": x, "padding_mask": mask, "max_len": np.array(t)})[0]
    if mask is not None:
        raise ValueError("--padding-mask: a decode-step model decodes real tokens only; got a mask")
    past, present = decode_names(config)
    heads = config["num_heads"]
    empty = np.zeros((b, t, heads, config["hidden_size"] // heads), np.float32)
    feeds, out = {**{n: empty for n in past[:-1]}, "padding_mask": np.zeros((b, t), bool)}, []
    for i in range(t):
        z, *state = sess.run(["z", *present], {"x_t": x[:, i:i + 1], "index": np.array(i), **feeds})
        feeds = dict(zip(past, state))
        out.append(z)
    return np.concatenate(out, axis=1)


def block_width(model) -> int:
    """d_model from the model's x (or x_t) input; ModelError unless it is a block, prefill or
    decode-step model: an input x [batch, seq, d_model] or x_t [batch, 1, d_model] (d_model
    fixed) and an output z."""
    from .runtime import ModelError

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

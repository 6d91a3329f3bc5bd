"""`odeattn export` (config and weights in, .onnx out) and `odeattn run` (an exported model on
inputs from .npy files or a random batch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from odeattn.cli import check_output_path, positive_int


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
    if args.prefill or args.decode:
        return export_cached(args, config, params, opset)
    if args.route == "direct":
        model = export_model(config, params, opset=opset, padding_mask=not args.no_padding_mask)
        check(model)
        args.output.write_bytes(model.SerializeToString())
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
          f"max relative error vs ode_ref on a random batch (2 x 8): {err:.2e}")
    return 0


def export_cached(args, config, params, opset: int) -> int:
    """--prefill or --decode: write the model, then run it as `odeattn run` does on a random batch
    of 8 tokens (the decode-step model generating them from an empty cache) and compare with
    ode_block on the whole sequence."""
    import ode_ref as R

    from .block import check, decode_names, export_decode_model, export_prefill_model

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
    out = run_cached(model, "prefill" if args.prefill else "decode_step", x.astype(np.float32), None)
    err = float(np.abs(out - want).max() / np.abs(want).max())
    what = "the prefill of 8 tokens" if args.prefill else "8 tokens decoded one by one from an empty cache"
    print(f"wrote {args.output}: {args.output.stat().st_size / 1e3:.1f} kB, opset {opset}, {len(model.graph.node)} nodes, "
          f"{len(decode_names(config)[0]) - 1} cache arrays; max relative error vs ode_ref on the whole sequence, {what} "
          f"(batch 2): {err:.2e}")
    return 0


def cmd_run(args) -> int:
    from .runtime import ModelError, load_model, run, session

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
        if kind == "block":
            z = run(model, session(model), x, mask, outputs=["z"])["z"]
        else:
            z = run_cached(model, kind, x, mask)
    except (ModelError, ValueError, TypeError, FileNotFoundError) as err:
        return _fail(str(err))
    except OSError as err:  # a folder given as a file, an unreadable file
        return _fail(f"--x/--padding-mask: {err.strerror}: {err.filename!r}")
    summary = f"z: shape {list(z.shape)}, dtype {z.dtype}, finite {bool(np.isfinite(z).all())}, max |z| {float(np.abs(z).max()):.4g}"
    if args.output:
        np.save(args.output, z)
        summary += f", saved to {args.output}"
    print(summary)
    return 0


def run_cached(model, kind: str, x, mask):
    """A prefill model on all of x; a decode-step model generating x's tokens one by one from an
    empty cache of seq slots (every token real: a padding mask is refused). Returns z."""
    from .block import decode_names
    from .runtime import session

    config = json.loads({p.key: p.value for p in model.metadata_props}["config"])
    if x.dtype != np.float32 or x.ndim != 3:
        raise TypeError(f"x: expected float32 [batch, seq, d_model]; got {x.dtype} of shape {list(x.shape)}")
    b, t, _ = x.shape
    sess = session(model)
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

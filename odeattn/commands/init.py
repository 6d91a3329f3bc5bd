"""`odeattn init DIR`: a block to start from. Writes DIR/config.json (the ODEConfig fields),
DIR/weights.safetensors (ode_ref.init_params with --seed, float32, the spec's parameter names)
and DIR/x.npy (a seeded normal batch, float32 [batch, seq, hidden_size]): the inputs of
`odeattn export`, `odeattn run` and `odeattn diagnose`. With --lm, a decoder language model
instead: DIR/config.json (an LMConfig) and DIR/weights.safetensors (ode_ref.init_lm_params), no
x.npy, the inputs of `odeattn export --genai`.

A new DIR (missing or empty) appears with all its files or none: they are written into a hidden
sibling folder, which one rename makes DIR, so an interrupted init (even kill -9) never leaves a
part of the set in it. Into a DIR that holds files (with --force), each file is replaced whole, one
after another."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path

import ode_ref as R
from ode_ref.files import save_npy, write_text, writing_set
from odeattn.commands.args import UsageError, check_output_path, non_negative_int, positive_int, require, user_input

FILES = ("config.json", "weights.safetensors", "x.npy")


def register(sub) -> None:
    p = sub.add_parser("init", help="write a config, seeded weights and an input batch to start from",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, metavar="DIR", help="the folder to write into (made if missing)")
    p.add_argument("--hidden-size", type=positive_int, default=64, help="d_model (default 64)")
    p.add_argument("--num-heads", type=positive_int, default=4, help="heads; must divide --hidden-size (default 4)")
    p.add_argument("--solver", choices=list(R.SOLVERS), default="rk4", help="the solver: a Butcher tableau, or ab2, ab3, momentum (default rk4)")
    p.add_argument("--steps", type=positive_int, default=4, help="ode_steps (default 4)")
    p.add_argument("--mode", choices=list(R.MODES), help="encoder (default) or decoder (causal); not with --lm")
    p.add_argument("--norm-type", choices=list(R.NORM_TYPES), default="layer_norm", help="the pre-norm (default layer_norm)")
    p.add_argument("--bitnet", action="store_true", help="BitLinear (ternary weights) in both projections")
    p.add_argument("--seed", type=non_negative_int, default=0, help="of the weights and of x (default 0)")
    p.add_argument("--batch", type=positive_int, help="of x (default 2); not with --lm")
    p.add_argument("--seq", type=positive_int, help="of x (default 8); not with --lm")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.add_argument("--lm", action="store_true",
                   help="write a decoder language model of --num-layers blocks instead: config.json (an LMConfig, "
                        "mode decoder) and weights.safetensors, no x.npy; the input of `odeattn export --genai`")
    p.add_argument("--vocab-size", type=positive_int, help="with --lm: the vocabulary (default 64)")
    p.add_argument("--num-layers", type=positive_int, help="with --lm: the blocks (default 2)")


# the options of one kind of model only (None when not given): refused with the other, not ignored
BLOCK_ONLY, LM_ONLY = ("--mode", "--batch", "--seq"), ("--vocab-size", "--num-layers")
DEFAULTS = {"mode": "encoder", "batch": 2, "seq": 8, "vocab_size": 64, "num_layers": 2}


def check_paths(folder: Path, force: bool, files=FILES) -> dict[str, Path]:
    """name -> path in DIR of each of files (FILES, or --lm's two), once DIR is a folder (made if
    missing) that takes them; UsageError naming DIR or the files that exist (unless force)."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"DIR: expected a folder; got the file {str(folder)!r}")
    out = {name: folder / name for name in files}
    existing = [str(p) for p in out.values() if p.exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)}: {'exists' if len(existing) == 1 else 'exist'} already; "
                         "pass --force to overwrite")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"DIR: cannot make the folder {str(folder)!r} ({err.strerror or err})") from None
    for path in out.values():
        check_output_path("DIR", path, path.suffix, force=force)
    return out


def check_memory_of(config, batch: int, seq: int) -> int:
    """The bytes init allocates (ode_ref.memory's estimate, refused past the limit before anything
    is drawn): the parameters drawn in float64, their float32 copy and its serialised bytes; x
    drawn in float64 and its float32 copy."""
    from ode_ref.memory import Need, check_memory

    count = sum(math.prod(shape) for shape in R.param_shapes(config).values())
    return check_memory(f"--hidden-size {config.hidden_size}, --batch {batch}, --seq {seq}",
                        Need("the parameters drawn", 1, (count,), "float64", 8),
                        Need("the parameters in float32 and serialised", 2, (count,), "float32", 4),
                        Need("x drawn", 1, (batch, seq, config.hidden_size), "float64", 8),
                        Need("x in float32", 1, (batch, seq, config.hidden_size), "float32", 4))


def run(args) -> int:
    import numpy as np

    given = lambda flags: [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None]  # noqa: E731
    wrong = given(BLOCK_ONLY) if args.lm else given(LM_ONLY)
    if wrong:
        raise UsageError(f"{', '.join(wrong)}: " + ("--lm writes a decoder language model (always mode decoder) and no "
                                                    "x.npy; drop them" if args.lm else "apply to --lm only"))
    for name, default in DEFAULTS.items():
        setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    if args.lm:
        from odeattn.commands.genai import init_lm

        return init_lm(args, check_paths)
    require("safetensors")  # before anything is written; main() names the extra that installs it
    with user_input():
        config = R.ODEConfig(hidden_size=args.hidden_size, num_heads=args.num_heads, ode_solver=args.solver,
                             ode_steps=args.steps, mode=args.mode, norm_type=args.norm_type, use_bitnet=args.bitnet)
        check_memory_of(config, args.batch, args.seq)
        out = check_paths(args.dir, args.force)
    params = R.init_params(config, seed=args.seed, dtype=np.float32)
    x = np.random.default_rng(args.seed).normal(size=(args.batch, args.seq, config.hidden_size)).astype(np.float32)
    with writing_set(args.dir) as into:  # a new DIR appears with its three files or not at all
        write_text(into / "config.json", json.dumps(config.to_dict(), indent=1) + "\n")
        R.save_params(params, into / "weights.safetensors")
        save_npy(into / "x.npy", x)
    fields = ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items() if k in (
        "hidden_size", "num_heads", "ode_solver", "ode_steps", "mode", "norm_type", "use_bitnet"))
    print(f"wrote {out['config.json']}: {fields}")
    print(f"wrote {out['weights.safetensors']}: init_params(seed={args.seed}), {len(params)} arrays, "
          f"{sum(v.size for v in params.values()):,} parameters, float32")
    print(f"wrote {out['x.npy']}: float32 {list(x.shape)} (batch, seq, hidden_size), normal, seed {args.seed}")
    q = {name: shlex.quote(str(path)) for name, path in out.items()}
    onnx = shlex.quote(str(args.dir / "block.onnx"))
    print("next:")
    print(f"  odeattn export --config {q['config.json']} --weights {q['weights.safetensors']} -o {onnx}")
    print(f"  odeattn run {onnx} --x {q['x.npy']}")
    print(f"  odeattn diagnose --config {q['config.json']} --weights {q['weights.safetensors']} --x {q['x.npy']}")
    return 0

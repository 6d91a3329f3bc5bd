"""`odeattn diagnose`: the error of z(1) against steps for every solver, and the fewest steps that
meet a tolerance (the method: odeattn.diagnose)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ode_ref as R
from ode_ref.files import replacing
from odeattn.commands.args import UsageError, add_force, check_output_path, non_negative_int, positive_int, require, user_input
from odeattn.commands.inputs import load_block, load_x, unused_encoding


def positive_fraction(text: str) -> float:
    """argparse type: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1); got {text!r}")
    return value


def register(sub) -> None:
    from odeattn import diagnose as D

    p = sub.add_parser("diagnose", help="error of z(1) against steps for every solver: how many steps you need",
                       description=D.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="JSON file with the ODEConfig fields")
    p.add_argument("--weights", type=Path,
                   help=".safetensors or .npz with the spec's parameter names; default: init_params(config, --seed), "
                        "random weights, said so in the output")
    p.add_argument("--x", type=Path, help=".npy float [batch, seq, d_model]; default: a random normal batch (--seed)")
    p.add_argument("--batch", type=positive_int, default=2, help="of the random x (default 2)")
    p.add_argument("--seq", type=positive_int, default=8, help="of the random x (default 8)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="of the random x and of the default weights (default 0)")
    p.add_argument("--tol", type=positive_fraction, default=1e-4, help="relative error to meet (default 1e-4)")
    p.add_argument("--max-steps", type=positive_int, default=128, help="steps 1, 2, 4, ... up to this (default 128)")
    p.add_argument("--ref-steps", type=positive_int, default=1024, help="steps of the rk4 reference (default 1024)")
    p.add_argument("--plot", type=Path, default=Path("diagnose.png"),
                   help="the log-log PNG of error against steps (default diagnose.png; needs odeattn[bench])")
    p.add_argument("--no-plot", dest="plot", action="store_const", const=None, help="write no PNG")
    add_force(p)


def load_inputs(args):
    """(config, params, x) from --config, --weights (else init_params with --seed) and --x (else a
    random normal batch with --seed, float64); UsageError naming the option otherwise."""
    import numpy as np

    import ode_ref as R

    config, params = load_block(args.config, args.weights, seed=args.seed)
    with user_input("--x"):
        x = load_x(args.x, config.hidden_size, batch=args.batch, seq=args.seq, seed=args.seed)
        R.check_input(x, config, name="--x")
        if not np.isfinite(x).all():
            raise ValueError("holds NaN or Inf")
    return config, params, x


def check_options(args) -> None:
    """UsageError naming the option unless the steps and the plot make sense; before any work."""
    if args.ref_steps > R.MAX_STEPS:
        raise UsageError(f"--ref-steps: expected at most {R.MAX_STEPS} (the config's bound on ode_steps); got {args.ref_steps}")
    if args.ref_steps % 2 or args.ref_steps < 2 * args.max_steps:
        raise UsageError(f"--ref-steps: expected an even integer >= 2 x --max-steps ({2 * args.max_steps}); "
                         f"got {args.ref_steps}")
    if args.plot:
        check_output_path("--plot", args.plot, ".png", force=args.force,
                          others={"--config": args.config, "--weights": args.weights, "--x": args.x})
        require("matplotlib")  # main() names the extra that installs it


def run(args) -> int:
    from odeattn import diagnose as D

    with user_input():
        check_options(args)
        config, params, x = load_inputs(args)
    warning = unused_encoding(config)
    if warning:
        print(f"odeattn diagnose: {warning}", file=sys.stderr)
    weights = str(args.weights) if args.weights else f"init_params(seed={args.seed}), no --weights given"
    source = str(args.x) if args.x else f"random normal, seed {args.seed}"
    print(f"weights: {weights}; x: {source}, shape {list(x.shape)}, every token real; float64 (the spec)")
    result = D.diagnose(params, x, config, max_steps=args.max_steps, ref_steps=args.ref_steps, tol=args.tol)
    print(D.format_report(result, knobs=("--ref-steps", "--tol")))
    if args.plot:
        with replacing(args.plot) as tmp:
            D.plot(result, tmp)
        print(f"plot: {args.plot}")
    return 0

"""`odeattn demo train`: loss curves of euler, rk4 and rk2_gated on a tiny task (odeattn.demo)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ode_ref.files import replacing, write_text
from odeattn.commands.args import add_force, check_output_path, non_negative_int, positive_int, require, user_input


def register(sub) -> None:
    from odeattn import demo as D

    p = sub.add_parser("demo", help="small demonstrations on CPU", description="small demonstrations on CPU: "
                       "`odeattn demo train`, loss curves of euler, rk4 and rk2_gated on a tiny task")
    demos = p.add_subparsers(dest="demo", required=True)
    t = demos.add_parser("train", help="loss curves of euler, rk4 and rk2_gated on a tiny task (under a minute)",
                         description=D.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--steps", type=positive_int, default=300, help="Adam steps per solver (default 300)")
    t.add_argument("--seed", type=non_negative_int, default=0, help="of the initial weights and of the data (default 0)")
    t.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (default 1: on a busy machine more threads wait on each other at this size)")
    t.add_argument("--plot", type=Path, default=Path("demo_train.png"),
                   help="PNG of the loss curves (default demo_train.png; needs odeattn[bench])")
    t.add_argument("--no-plot", dest="plot", action="store_const", const=None, help="write no PNG")
    t.add_argument("--json", type=Path, help="the losses of every step, per solver")
    add_force(t)
    t.add_argument("--blocks", choices=D.BLOCKS, default="attention",
                   help="attention: the ODE attention block with euler, rk4, rk2_gated (default); layer: the ODE "
                        "Transformer's block (F a whole encoder layer), residual against rk2_gated at equal parameter count")


def title(args) -> str:
    return f"demo {args.demo}"


def check_options(args) -> None:
    """UsageError naming the option unless the outputs can be written; a missing matplotlib (for
    --plot) is raised as ModuleNotFoundError, which main() turns into the extra's name. Before any work."""
    check_output_path("--json", args.json, ".json", force=args.force)
    if args.plot:
        check_output_path("--plot", args.plot, ".png", force=args.force, others={"--json": args.json})
        require("matplotlib")


def run(args) -> int:
    from odeattn import demo as D

    with user_input():
        check_options(args)
    result = D.run(steps=args.steps, seed=args.seed, threads=args.threads, blocks=args.blocks,
                   log=lambda m: print(m, file=sys.stderr, flush=True))
    print(D.format_summary(result))
    if args.json:
        write_text(args.json, json.dumps(result, indent=1))
        print(f"json: {args.json}")
    if args.plot:
        with replacing(args.plot) as tmp:
            D.plot(result, tmp)
        print(f"plot: {args.plot}")
    return 0

"""The floor under the main job's JAX time (odeattn.bench.floor): the suite's JAX rows each compiling
f once and nothing else, through `odeattn conformance --profile`, cold then warm; --with-jax runs the
`jax` backend the same way after it.

    python benchmarks/compile_floor.py [--with-jax] [-k REGEX] [--json F]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from odeattn.bench.floor import FLOOR, floor_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-jax", action="store_true", help="run the jax backend the same way after the floor")
    p.add_argument("-k", help="only the cases matching this regular expression")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    backends = (FLOOR, "jax") if args.with_jax else (FLOOR,)
    rows = floor_rows(backends, ("-k", args.k) if args.k else (), log=partial(print, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

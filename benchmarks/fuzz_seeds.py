"""The fuzzing page's catch table: each planted kernel bug (conformance/mutation/planted.py) fuzzed
at the default budget at seeds 0 to 19, and the spec against itself at the same seeds.

    python benchmarks/fuzz_seeds.py [--seeds N]

Per planted port, in float32: the seeds at which the default run (the covering array, then random
draws) finds a divergence, and where the first divergent example came from (a row of the array,
or the random draws after it); shrinking is cut to 1 s, which changes what is reported, not
whether the bug is caught. Then the spec through SpecAdapter in float64 at each seed: the seeds
with a false alarm (none expected), and the examples judged. A run each, one process; the CPU
seconds of each line are printed beside it.
"""

from __future__ import annotations

import argparse
import time

from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.fuzzing.fuzz import fuzz
from odeattn.conformance.mutation import planted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    seeds = range(parser.parse_args().seeds)
    for port in planted.PLANTED:
        start, caught, where = time.process_time(), [], []
        for seed in seeds:
            run = fuzz(port(), "float32", seed=seed, shrink_seconds=1.0)
            if run.finding is not None:
                caught.append(seed)
                where.append("random" if run.found_in == "random" else "array")
        missed = [s for s in seeds if s not in caught]
        print(f"{port.__name__}: caught at {len(caught)} of {len(seeds)} seeds (missed: {missed or 'none'}; "
              f"{where.count('array')} in the array's rows, {where.count('random')} in the random draws), "
              f"{time.process_time() - start:.0f} s CPU", flush=True)
    start, alarms, judged = time.process_time(), [], []
    for seed in seeds:
        run = fuzz(SpecAdapter(), "float64", seed=seed)
        judged.append(run.examples)
        if run.failed:
            alarms.append(seed)
    print(f"spec (float64): false alarms at {alarms or 'no seed'}; examples judged {min(judged)} to {max(judged)}; "
          f"{time.process_time() - start:.0f} s CPU")


if __name__ == "__main__":
    main()

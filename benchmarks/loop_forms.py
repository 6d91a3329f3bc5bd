"""The export's forms side by side (odeattn.bench.forms): file size and session creation at 1, 4,
16 and 64 steps, and the time of a forward at 4 steps, local functions vs inlined vs the Loop form.

    python benchmarks/loop_forms.py --shape small|large [--threads 2] [--rounds 5] [--session-rounds 3] [--solver rk4]
"""

from __future__ import annotations

import argparse

from odeattn.bench.forms import FORMS, form_costs, form_forwards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=["small", "large"], default="small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--solver", default="rk4")
    p.add_argument("--steps", type=int, default=4, help="the forward's step count")
    p.add_argument("--session-rounds", type=int, default=3, help="interleaved rounds of session creation per count")
    args = p.parse_args()
    print(f"shape {args.shape}, {args.solver}, threads {args.threads}")
    print(f"{'form':<10}{'steps':>6}{'kB':>10}{'session ms':>12}  session vs functions (min..max)")
    for row in form_costs(args.shape, solver=args.solver, threads=args.threads, rounds=args.session_rounds):
        r = row["vs_functions"]
        print(f"{row['form']:<10}{row['steps']:>6}{row['bytes'] / 1e3:>10.1f}{row['session_s'] * 1e3:>12.0f}"
              f"  x{r['median']:.2f} ({r['min']:.2f}..{r['max']:.2f})")
    times = form_forwards(args.shape, solver=args.solver, steps=args.steps, threads=args.threads, repeats=args.rounds,
                          burst_s=0.25)
    print(f"forward at {args.steps} steps, {args.rounds} interleaved rounds:")
    for form in FORMS:
        r = times[form]["vs_functions"]
        print(f"{form:<10} {times[form]['median_s'] * 1e3:8.2f} ms   x{r['median']:.3f} vs functions "
              f"({r['min']:.3f}..{r['max']:.3f})")


if __name__ == "__main__":
    main()

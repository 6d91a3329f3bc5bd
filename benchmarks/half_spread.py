"""The half-precision figures of conformance/cases/tolerance.py and docs/conformance.md, from the
packaged golden set: the e16/ebf16 distribution, the untestable counts by reason, and the spread
of the two other implementations of the policy (half.OTHERWISE) behind HALF_SAFETY.

    python benchmarks/half_spread.py

Per dtype: the testable cases; the median over quantities and over cases (each its worst
quantity) of e_S and the worst case, in units u of the dtype's rounding; the count of each
untestable reason; and, for each other implementation, the worst ratio of its error to
max(e_S, u) and its largest difference from the spec's run, in u.
"""

from __future__ import annotations

import collections

import numpy as np

from ode_ref.precision import HALF_DTYPES
from odeattn.conformance.golden import load_cases
from odeattn.conformance.cases.half import OTHERWISE, policy_otherwise, spec_half
from odeattn.conformance.cases.tolerance import UNIT_ROUNDOFF, relative_error


def main() -> None:
    cases = load_cases()
    for dtype in HALF_DTYPES:
        u = UNIT_ROUNDOFF[dtype]
        reasons = collections.Counter(c.untestable(dtype).split(":")[0].split(";")[0] for c in cases if c.untestable(dtype))
        testable = [c for c in cases if not c.untestable(dtype)]
        per_case = {c.name: max(v for q, v in c.e_half(dtype).items() if q in c.e32) for c in testable}
        every = [v for c in testable for q, v in c.e_half(dtype).items() if q in c.e32]
        worst = max(per_case, key=per_case.get)
        print(f"{dtype}: {len(testable)} testable; e_S median {np.median(every) / u:.2f} u over quantities, "
              f"{np.median(list(per_case.values())) / u:.2f} u over cases; worst {per_case[worst] / u:.2f} u ({worst})")
        for reason, n in sorted(reasons.items()):
            print(f"  untestable, {reason}: {n}")
        for how in OTHERWISE:
            ratio = diff = 0.0
            for c in testable:
                golden = {q: a for q, a in c.quantities().items() if q in c.e32}
                e = c.e_half(dtype)
                other = policy_otherwise(c.config, c.params, c.x, c.padding_mask, dtype=dtype, how=how, decoded=c.decoded)
                spec = spec_half(c.config, c.params, c.x, c.padding_mask, dtype=dtype, decoded=c.decoded)
                for q in golden:
                    ratio = max(ratio, relative_error(other[q], golden[q]) / max(e[q], u))
                    diff = max(diff, float(np.abs(other[q] - spec[q]).max() / np.abs(golden[q]).max()) / u)
            print(f"  {how}: worst error / max(e_S, u) {ratio:.3f}; largest difference from the spec's run {diff:.2f} u")


if __name__ == "__main__":
    main()

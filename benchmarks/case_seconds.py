"""The golden cases' measured times that `--shard I/N` balances (conformance/running/case_seconds.json),
from one or more main-run JSON reports:

    odeattn conformance --json run.json
    python benchmarks/case_seconds.py run.json [more.json ...]

A case's seconds are its results' `seconds` (its worker's time for the case, transfer included)
summed over every backend and dtype of the reports, so a case that every backend finds slow
weighs most. Untestable and expectation-skipped results took no time and add nothing.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from odeattn.conformance.running.shards import SECONDS_FILE


def main(paths) -> None:
    seconds = defaultdict(float)
    rows = set()
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for r in report["results"]:
            seconds[r["case"]] += r["seconds"]
            rows.add(f"{r['backend']}/{r['dtype']}")
    table = {"measured": f"the main run's per-case seconds summed over {len(paths)} report(s) of " + ", ".join(sorted(rows)),
             "seconds": {name: round(s, 4) for name, s in sorted(seconds.items())}}
    SECONDS_FILE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(seconds)} cases to {SECONDS_FILE.name} ({sum(seconds.values()):.1f} s in all)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python benchmarks/case_seconds.py REPORT.json [REPORT.json ...]")
    main(sys.argv[1:])

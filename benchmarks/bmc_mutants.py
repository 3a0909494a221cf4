"""Each spec mutant's counterexample by BMC (Z3), against the breadth-first one.

For every mutant of the spec (verification/mutants): incremental, shortest-first BMC on the
model the mutant is hunted in (`models.mutant_model`), stopping at the first
violated property, with a per-mutant time limit; then breadth-first search
on the same model for the shortest counterexample's length. Both traces are
replayed on the concrete spec before they count. Prints one row per mutant
and exits non-zero if any mutant is not killed by BMC within the limit, or
if the two lengths differ (both are shortest, so they must agree; a mutant
that only breaks liveness has no safety counterexample for either).

    python benchmarks/bmc_mutants.py [--budget 60] [--max-depth 12] [--mutant NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from flightcheck.spec import SOMETIMES
from flightcheck.verification.mutants import MUTANTS
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification import models
from flightcheck.verification.z3.bmc.engine import first_counterexample


def measure(name: str, budget: float, max_depth: int) -> dict:
    model = models.mutant_model(name)
    t0 = time.perf_counter()
    found = first_counterexample(model, max_depth=max_depth, time_budget=budget)
    seconds = time.perf_counter() - t0
    bfs = explicit.search(model, stop_at_first=True, check_liveness=False)
    sometimes = {s.name for s in SOMETIMES}
    shortest = min((len(v.path) for v in bfs.violations if v.property not in sometimes), default=None)
    return {"mutant": name, "model": model.name, "killed": found is not None,
            "property": None if found is None else found.name,
            "depth": None if found is None else found.depth,
            "bfs_length": shortest, "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per mutant")
    parser.add_argument("--max-depth", type=int, default=12)
    parser.add_argument("--mutant", action="append", help="only these mutants")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = args.mutant or list(MUTANTS)
    unknown = sorted(set(names) - set(MUTANTS))
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(MUTANTS)}")
    rows = []
    if not args.json:
        print(f"{'mutant':<40} {'model':<12} {'property':<24} {'depth':>5} {'bfs':>4} {'seconds':>8}")
    for name in names:
        row = measure(name, args.budget, args.max_depth)
        rows.append(row)
        if not args.json:
            print(f"{row['mutant']:<40} {row['model']:<12} {row['property'] or 'SURVIVED':<24} "
                  f"{row['depth'] if row['killed'] else '-':>5} {row['bfs_length'] or '-':>4} "
                  f"{row['seconds']:>8.2f}", flush=True)
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(),
                          "budget": args.budget, "rows": rows}, indent=1))
    ok = all(r["killed"] and r["bfs_length"] in (None, r["depth"]) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

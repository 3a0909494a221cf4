"""How deep Z3 BMC gets in a time budget, with every feature on.

    python benchmarks/bmc_depth.py [--model default] [--budget 600] [--max-depth 30] [--lemmas] [--no-aborts]
                                   [--no-sometimes] [--reduce]

Prints one line per completed depth (seconds since the start, the SAT
solver's conflicts and propagations so far) and the rows
that are not merely "bounded" (violations, reached "sometimes" targets).
Default: models.DEFAULT (3 requests, K = 3, prefix caching, spec decode k = 2,
long-prefill threshold, aborts), 10 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from flightcheck.verification import models
from flightcheck.verification.z3_bmc import bmc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", choices=sorted(models.MODELS))
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--max-depth", type=int, default=30)
    ap.add_argument("--lemmas", action="store_true", help="also check the auxiliary invariants, as lemmas")
    ap.add_argument("--no-sometimes", action="store_true")
    ap.add_argument("--no-aborts", action="store_true", help="the model without the environment's aborts")
    ap.add_argument("--reduce", action="store_true",
                    help="twin symmetry and peephole partial-order reduction (verification/z3_reduction.py)")
    args = ap.parse_args()
    model = models.MODELS[args.model]
    if args.no_aborts:
        model = dataclasses.replace(model, allow_abort=False)
    print(f"model {model.name}: {model.describe()}; budget {args.budget:.0f} s", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    res = bmc(model, args.max_depth, time_budget=args.budget, lemmas=args.lemmas,
              sometimes=[] if args.no_sometimes else None, reduce=args.reduce,
              progress=lambda d, s, n: print(f"depth {d:3d} done at {s:7.1f} s wall, "
                                             f"{time.process_time() - cpu0:7.1f} s cpu, {n['conflicts']:9,d} conflicts, "
                                             f"{n['propagations'] / 1e6:8.1f} M propagations so far", flush=True))
    print(f"deepest depth completed: {res.depth} in {time.perf_counter() - t0:.1f} s")
    for p in res.properties:
        if p.status != "bounded":
            print(f"  {p.name}: {p.status} at depth {p.depth} ({p.seconds:.1f} s)")


if __name__ == "__main__":
    main()

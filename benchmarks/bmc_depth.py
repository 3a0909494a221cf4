"""How deep Z3 BMC gets in a time budget, with every feature on.

    python benchmarks/bmc_depth.py [--model default] [--budget 600] [--max-depth 30] [--lemmas] [--no-aborts]
                                   [--no-sometimes] [--reduce] [--jobs N] [--json FILE]

Prints one line per completed depth (seconds since the start, the SAT
solver's conflicts and propagations so far) and the rows
that are not merely "bounded" (violations, reached "sometimes" targets).
Default: models.DEFAULT (3 requests, K = 3, prefix caching, spec decode k = 2,
long-prefill threshold, aborts), 10 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

from flightcheck.verification import models
from flightcheck.verification.z3.bmc.cubes import max_parts
from flightcheck.verification.z3.bmc.engine import BmcOptions
from flightcheck.verification.z3.bmc.parallel import bmc_split


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", choices=sorted(models.MODELS))
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--max-depth", type=int, default=30)
    ap.add_argument("--lemmas", action="store_true", help="also check the auxiliary invariants, as lemmas")
    ap.add_argument("--no-sometimes", action="store_true")
    ap.add_argument("--no-aborts", action="store_true", help="the model without the environment's aborts")
    ap.add_argument("--reduce", action="store_true",
                    help="twin symmetry and peephole partial-order reduction (verification/z3/bmc/reduction.py)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes sharing the paths (z3.bmc.parallel.bmc_split); the seconds are wall-clock")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the per-depth figures and the rows here")
    args = ap.parse_args()
    if args.budget <= 0 or args.max_depth < 0 or args.jobs < 1:
        ap.error("--budget must be positive, --max-depth at least 0 and --jobs at least 1")
    if args.json and not args.json.parent.is_dir():
        ap.error(f"--json: no directory {args.json.parent} to write {args.json.name} in")   # before, not after, the run
    model = models.MODELS[args.model]
    if args.no_aborts:
        model = dataclasses.replace(model, allow_abort=False)
    if args.jobs > max_parts(model):
        ap.error(f"--jobs: at most {max_parts(model)} for {model.name} (one part per label of a step)")
    print(f"model {model.name}: {model.describe()}; budget {args.budget:.0f} s", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    depths: list[dict] = []

    def progress(d: int, seconds: float, counts: dict[str, int]) -> None:
        row = {"depth": d, "seconds": round(seconds, 1)}
        cpu = ""
        if args.jobs == 1:      # the parts' CPU time is not this process's
            row["cpu_seconds"] = round(time.process_time() - cpu0, 1)
            cpu = f", {row['cpu_seconds']:7.1f} s cpu"
        depths.append({**row, **counts})
        print(f"depth {d:3d} done at {seconds:7.1f} s wall{cpu}, {counts['conflicts']:9,d} conflicts, "
              f"{counts['propagations'] / 1e6:8.1f} M propagations so far", flush=True)

    options = BmcOptions(sometimes=() if args.no_sometimes else None, time_budget=args.budget,
                         lemmas=args.lemmas, reduce=args.reduce)
    res = bmc_split(model, args.max_depth, options, jobs=args.jobs, progress=progress)
    print(f"deepest depth completed: {res.depth} in {time.perf_counter() - t0:.1f} s")
    for note in res.notes:
        print(f"  {note}")
    for p in res.properties:
        if p.status != "bounded":
            print(f"  {p.name}: {p.status} at depth {p.depth} ({p.seconds:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps({
            "model": model.name, "describe": model.describe(), "budget_seconds": args.budget,
            "reduce": args.reduce, "jobs": args.jobs, "sometimes": not args.no_sometimes, "lemmas": args.lemmas,
            "machine": _machine(),
            "deepest_depth": res.depth, "seconds": round(res.seconds, 1), "depths": depths, "notes": res.notes,
            "rows": [{"name": p.name, "kind": p.kind, "status": p.status, "depth": p.depth,
                      "seconds": round(p.seconds, 1)} for p in res.properties],
        }, indent=1) + "\n")


def _machine() -> str:
    """CPU model and count, and the Python version: what the seconds were measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
             if ln.startswith("model name")] if cpuinfo.exists() else []
    cpu = names[0] if names else platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    main()

"""Time-to-kill of every reference mutant by `flightcheck fuzz`.

For each mutant and each of the fixed seeds, run the refinement machine for
at most --steps rule steps (example database off, no explicit examples) and
record the steps and seconds until the first failure (before shrinking, which
is not part of finding the bug) and the profile whose part of the run was
running then (the default run drives every profile in turn; fuzz.py
`profile_steps`). Prints one row per mutant: kills out of seeds, median and
worst steps and seconds to kill.

    python benchmarks/fuzz_kill.py [--steps 20000] [--seeds 10] [--first-seed 0] [--mutant NAME] [--json]
        [--executor local|ray] [--ray-address ADDR] [--jobs N]

Each mutant × seed is a task of the executor (verification/executors; local
processes, --jobs of them, or a Ray cluster: docs/cluster.md); the rows come
out by mutant and seed whichever finished first.

(--first-seed 10 measures ten seeds the strategies were not tuned on.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from flightcheck.verification import executors
from flightcheck.verification.refinement.fuzz import fuzz, list_mutants


def kill_run(mutant: str, seed: int, steps: int) -> dict:
    """One task: the mutant fuzzed from one seed until it is caught or the steps run out."""
    result = fuzz(steps, seed, mutant, shrink=False)
    return {"seed": seed, "killed": result.failed, "steps": result.steps_run,
            "seconds": result.seconds_to_failure if result.failed else result.seconds,
            "profile": result.profiles[-1] if result.profiles else None}


def row_of(mutant: str, runs: list[dict]) -> dict:
    killed = [r for r in runs if r["killed"]]
    row = {"mutant": mutant, "kills": len(killed), "seeds": len(runs), "runs": runs}
    if killed:
        row["median_steps"] = statistics.median(r["steps"] for r in killed)
        row["max_steps"] = max(r["steps"] for r in killed)
        row["median_seconds"] = statistics.median(r["seconds"] for r in killed)
        row["max_seconds"] = max(r["seconds"] for r in killed)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1")
    parser.add_argument("--mutant", action="append", help="only these mutants")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="local processes (default: one per core)")
    executors.add_options(parser)
    args = parser.parse_args(argv)
    refused = executors.configure_from(args)
    if refused:
        parser.error(refused)
    mutants = args.mutant or list_mutants()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    t0 = time.perf_counter()
    tasks = [executors.Task((m, s), kill_run, (mutant, seed, args.steps), f"{mutant} seed {seed}")
             for m, mutant in enumerate(mutants) for s, seed in enumerate(seeds)]
    runs = executors.run_tasks(tasks, args.jobs, executors.progress_printer("fuzz_kill"))
    rows = [row_of(mutant, runs[m * len(seeds):(m + 1) * len(seeds)]) for m, mutant in enumerate(mutants)]
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "executor": args.executor,
                          "tasks": len(tasks), "steps": args.steps, "seeds": seeds, "rows": rows}, indent=1))
    else:
        for row in rows:
            _print_row(row)
        print(f"# {len(seeds)} seeds, at most {args.steps} steps each; "
              f"{time.perf_counter() - t0:.0f} s in all")
    return 0 if all(r["kills"] == r["seeds"] for r in rows) else 1


def _print_row(row: dict) -> None:
    if not hasattr(_print_row, "header"):
        _print_row.header = True
        print(f"{'mutant':<40} {'kills':>6} {'median steps':>13} {'max steps':>10} "
              f"{'median s':>9} {'max s':>7}")
    if row["kills"]:
        print(f"{row['mutant']:<40} {row['kills']:>3}/{row['seeds']:<2} {row['median_steps']:>13.0f} "
              f"{row['max_steps']:>10} {row['median_seconds']:>9.2f} {row['max_seconds']:>7.2f}",
              flush=True)
    else:
        print(f"{row['mutant']:<40} {0:>3}/{row['seeds']:<2} {'-':>13} {'-':>10} {'-':>9} {'-':>7}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())

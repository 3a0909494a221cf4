"""How long a 150-prompt simulation takes, and how much of it is the
reference scheduler (schedule() + update_from_output()) rather than the
simulator (executor, cost model, client loop, metrics).

    python benchmarks/sim_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from dataclasses import replace

from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload_args import WorkloadArgs, build_workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print("| policy | batches | wall s (median) | scheduler share | scheduler us/batch | "
          "simulator us/batch |")
    print("|---|---|---|---|---|---|")
    for policy in ("one-batch-per-request", "continue-prefill"):
        runs = [simulate(build_workload(WorkloadArgs(), 0), replace(SimConfig(), policy=policy))
                for _ in range(args.repeats)]
        run = sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]
        other = run.wall_s - run.scheduler_wall_s
        print(f"| {policy} | {run.num_batches} | {statistics.median(r.wall_s for r in runs):.2f} | "
              f"{run.scheduler_share:.0%} | {1e6 * run.scheduler_wall_s / run.num_batches:.0f} | "
              f"{1e6 * other / run.num_batches:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

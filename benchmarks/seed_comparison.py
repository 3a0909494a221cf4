"""The seed PR's comparison, simulated: both policies with the seed's
configuration over workload seeds 0-19 (declared before the run), the
calibrated cost model, nothing refitted.

    python benchmarks/seed_comparison.py [--out docs/results] [--processes 2]

Prints the median report blocks next to the seed's, and a table of every
headline metric: seed, simulated median and its min-max over seeds, and the
gain of continue-prefill over one-batch-per-request in points, both as the
gain between the two medians and as the median of the per-seed paired gains
(with their min-max). Writes the multi-seed result JSON of each policy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

from flightcheck.bench.multiseed import aggregate, gain_points, multiseed_json, paired_gains
from flightcheck.bench.report import format_report, side_by_side
from flightcheck.bench.seed_results import THIS_PR, V1_MAIN
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload_args import WorkloadArgs, build_workload

SEEDS = tuple(range(20))
KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
        "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "output_throughput",
        "duration")


def _one(job: tuple[str, int]) -> tuple[dict[str, float], list[float], list[float], float, float]:
    policy, seed = job
    run = simulate(build_workload(WorkloadArgs(), seed), replace(SimConfig(), policy=policy))
    return (run.metrics.summary(), list(run.metrics.ttfts), list(run.metrics.tpots),
            run.wall_s, run.scheduler_share)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/results")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = {}
    with get_context("fork").Pool(args.processes) as pool:
        for policy in ("one-batch-per-request", "continue-prefill"):
            results[policy] = pool.map(_one, [(policy, s) for s in SEEDS])
    old = [r[0] for r in results["one-batch-per-request"]]
    new = [r[0] for r in results["continue-prefill"]]
    med_old, spread_old = aggregate(old)
    med_new, spread_new = aggregate(new)

    blocks = [format_report(V1_MAIN), format_report(med_old), format_report(THIS_PR),
              format_report(med_new)]
    print(side_by_side(blocks[:2], ["seed: V1 main", "sim: one-batch (median, 20 seeds)"]))
    print()
    print(side_by_side(blocks[2:], ["seed: this PR", "sim: continue-prefill (median)"]))
    print()
    print("| metric | seed V1 main | sim one-batch median [min-max] | seed this PR | "
          "sim continue-prefill median [min-max] | seed gain | sim gain of medians | "
          "sim paired gain median [min-max] |")
    print("|---|---|---|---|---|---|---|---|")
    for k in KEYS:
        gains = sorted(paired_gains(old, new, k))
        print(f"| {k} | {V1_MAIN[k]:.2f} | {med_old[k]:.2f} [{spread_old[k]['min']:.2f}-"
              f"{spread_old[k]['max']:.2f}] | {THIS_PR[k]:.2f} | {med_new[k]:.2f} "
              f"[{spread_new[k]['min']:.2f}-{spread_new[k]['max']:.2f}] | "
              f"{gain_points(V1_MAIN[k], THIS_PR[k]):+.1f} | {gain_points(med_old[k], med_new[k]):+.1f} | "
              f"{statistics.median(gains):+.1f} [{gains[0]:+.1f} to {gains[-1]:+.1f}] |")
    walls = [r[3] for rs in results.values() for r in rs]
    shares = [r[4] for rs in results.values() for r in rs]
    print(f"\n{len(walls)} simulations in {time.perf_counter() - t0:.1f} s on {args.processes} "
          f"processes; per simulation {min(walls):.2f}-{max(walls):.2f} s wall, scheduler share "
          f"{min(shares):.0%}-{max(shares):.0%}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for policy, med, spread, summaries in (("one-batch-per-request", med_old, spread_old, old),
                                           ("continue-prefill", med_new, spread_new, new)):
        doc = multiseed_json(med, spread, SEEDS, summaries, policy=policy, simulator=True,
                             ttfts=[t for r in results[policy] for t in r[1]],
                             tpots=[t for r in results[policy] for t in r[2]])
        (out / f"sim-{policy}-20seeds.json").write_text(json.dumps(doc, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())

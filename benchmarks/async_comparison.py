"""Synchronous vs asynchronous scheduling (issue 22), simulated: the seed's
workload (synthetic BurstGPT, 150 prompts at 2 req/s, Llama-3.1-8B on L4,
budget 2048) under PP = 2 and PP = 4, workload seeds 0-19 (declared before
the run), the calibrated cost model, nothing refitted.

    python benchmarks/async_comparison.py [--out docs/results] [--processes 2] [--gpu H100]

Profiles: `vllm-0.8.5` (the seed's engine), `vllm-0.33` (0.33 scheduling
synchronously) and `vllm-0.33-async` (0.33's AsyncScheduler, queue K + 1,
decodes K steps apart). The two 0.33 profiles run a second time with the
engine thread's CPU time set to 0 (schedule() and update_from_output()
free), which shows how much of the async gain is that CPU time hidden.

Prints one table per PP: medians over the seeds of each metric, and the
median of the per-seed paired gains of async over sync 0.33 (positive =
async better). Writes docs/results/sim-async-20seeds.json (per-seed scalars).
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

from flightcheck.bench.multiseed import aggregate, gain_points
from flightcheck.bench.simulation import SimConfig, simulate
from flightcheck.bench.workload_args import WorkloadArgs, build_workload

SEEDS = tuple(range(20))
PPS = (2, 4)
# (label, profile, engine CPU free?)
VARIANTS = (("0.8.5 sync", "vllm-0.8.5", False), ("0.33 sync", "vllm-0.33", False),
            ("0.33 async", "vllm-0.33-async", False), ("0.33 sync, CPU 0", "vllm-0.33", True),
            ("0.33 async, CPU 0", "vllm-0.33-async", True))
KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "output_throughput", "duration", "batches", "empty_batches",
        "tokens_per_batch", "stage0_busy_share")
HIGHER_IS_BETTER = {"output_throughput"}
GAIN_KEYS = KEYS[:8]          # the rest describe the batches: no better or worse


def _one(job: tuple[str, int, str, bool, int]) -> tuple[dict[str, float], float]:
    gpu, pp, profile, cpu_free, seed = job
    config = SimConfig(gpu=gpu, pp=pp, profile=profile)
    if cpu_free:
        config = replace(config, params=replace(config.params, sched_fixed_s=0.0,
                                                sched_per_running_s=0.0, update_fixed_s=0.0,
                                                update_per_entry_s=0.0))
    run = simulate(build_workload(WorkloadArgs(), seed), config)
    summary = run.metrics.summary()
    summary["batches"] = run.num_batches
    summary["empty_batches"] = run.num_empty_batches
    summary["tokens_per_batch"] = (summary["total_input_tokens"] + summary["total_output_tokens"]
                                   ) / run.num_batches
    summary["stage0_busy_share"] = run.stage_busy_s[0] / run.metrics.duration
    return summary, run.wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/results")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="first N of seeds 0-19")
    parser.add_argument("--gpu", default="L4", help="what-if: another GPU (the L4 fit carried over)")
    args = parser.parse_args()
    seeds = SEEDS[:args.seeds]
    t0 = time.perf_counter()
    jobs = [(args.gpu, pp, profile, cpu_free, s) for pp in PPS for _, profile, cpu_free in VARIANTS
            for s in seeds]
    with get_context("fork").Pool(args.processes) as pool:
        outputs = pool.map(_one, jobs)
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    for (_, pp, profile, cpu_free, _), (summary, _) in zip(jobs, outputs):
        label = next(v[0] for v in VARIANTS if v[1] == profile and v[2] == cpu_free)
        results.setdefault((pp, label), []).append(summary)
    doc: dict[str, object] = {"seeds": list(seeds), "statistic": "median over seeds",
                              "workload": "synthetic BurstGPT, 150 prompts, 2 req/s",
                              "model": "llama-3.1-8b", "gpu": args.gpu,
                              "max_num_batched_tokens": 2048, "runs": {}}
    for pp in PPS:
        print(f"\nPP = {pp}: medians over {len(seeds)} seeds; paired = median of per-seed "
              f"gains of async over sync 0.33 [min to max], positive = async better")
        labels = [v[0] for v in VARIANTS]
        print("| metric | " + " | ".join(labels) + " | async vs sync, paired | "
              "same with CPU 0 |")
        print("|---" * (len(labels) + 3) + "|")
        medians = {label: aggregate(results[(pp, label)])[0] for label in labels}
        for key in KEYS:
            cells = [f"{medians[label][key]:.2f}" for label in labels]
            gains = []
            for sync, async_ in (("0.33 sync", "0.33 async"),
                                 ("0.33 sync, CPU 0", "0.33 async, CPU 0")):
                if key not in GAIN_KEYS:
                    gains.append("")
                    continue
                per_seed = sorted(
                    (-1 if key in HIGHER_IS_BETTER else 1) * gain_points(a[key], b[key])
                    for a, b in zip(results[(pp, sync)], results[(pp, async_)]))
                gains.append(f"{statistics.median(per_seed):+.1f}% "
                             f"[{per_seed[0]:+.1f} to {per_seed[-1]:+.1f}]")
            print(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(gains) + " |")
        for label in labels:
            doc["runs"][f"pp{pp} {label}"] = {  # type: ignore[index]
                "median": medians[label], "per_seed": results[(pp, label)]}
    walls = [wall for _, wall in outputs]
    elapsed = time.perf_counter() - t0
    print(f"\n{len(jobs)} simulations in {elapsed:.1f} s on {args.processes} processes; "
          f"per simulation {min(walls):.2f}-{max(walls):.2f} s wall")
    doc["elapsed_s"] = round(elapsed, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.gpu == "L4" else f"-{args.gpu}"
    (out / f"sim-async-20seeds{suffix}.json").write_text(json.dumps(doc, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())

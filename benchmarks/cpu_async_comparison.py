"""Synchronous vs asynchronous scheduling (issue 22) on the real PyTorch
runtime, on this machine's CPU: `flightcheck bench --profile vllm-0.33` and
`--profile vllm-0.33-async` alternated seed by seed (so a change in the
machine's load hits both alike), then medians over seeds, the async / sync
ratio of each, and each run's stage compute and hop times from its trace.

    python benchmarks/cpu_async_comparison.py [--seeds 5] [--out docs/results] [--tag=-5seeds]

Workload (fixed before the first run; decode-heavy, where async scheduling
acts): the runtime's seeded "tiny" model, PP = 2, budget 256 tokens, random
prompts of 256 +- 50 % tokens, 32 output tokens, 20 prompts at 4 req/s
(Poisson), max-model-len 2048. Async runs with sampled-token feedback (the
last stage sends tokens to stage 0), which async scheduling needs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_runtime_comparison import stage_stats

WORKLOAD = ["--model", "tiny", "--pp", "2", "--dataset", "random", "--random-input-len", "256",
            "--random-range-ratio", "0.5", "--random-output-len", "32",
            "--max-num-batched-tokens", "256", "--max-model-len", "2048",
            "--num-prompts", "20", "--request-rate", "4"]
PROFILES = ("vllm-0.33", "vllm-0.33-async")
KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "output_throughput", "duration")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="docs/results")
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PROFILES}
    for seed in range(args.seeds):
        for profile in PROFILES:
            result = out / f"cpu-async-{profile}-seed{seed}.json"
            trace = out / f"cpu-async-{profile}-seed{seed}.trace.jsonl"
            subprocess.run([sys.executable, "-m", "flightcheck.cli", "bench", *WORKLOAD,
                            "--profile", profile, "--seed", str(seed), "--trace", str(trace),
                            "--save-result", str(result)], check=True, stdout=subprocess.DEVNULL)
            doc = json.loads(result.read_text())
            summary = {k: float(doc[k]) for k in KEYS}
            summary.update(stage_stats(trace))
            runs[profile].append(summary)
            trace.unlink()                      # large; the statistics are what we keep
            result.unlink()
            loads.append(os.getloadavg()[0])
    elapsed = time.perf_counter() - t0
    print(f"machine: {os.cpu_count()} CPUs; 1-minute load average {min(loads):.1f}-"
          f"{max(loads):.1f} during the runs; {2 * args.seeds} runs in {elapsed:.0f} s")
    print(f"seeds 0-{args.seeds - 1}, medians over seeds [min-max]; ratio = async / sync of "
          f"the medians; paired = median [min-max] of the per-seed async / sync ratios, and "
          f"how many seeds had async lower")
    print("| metric | sync `vllm-0.33` | async `vllm-0.33-async` | async / sync | paired |")
    print("|---|---|---|---|---|")
    keys = list(runs[PROFILES[0]][0])
    medians = {p: {k: statistics.median(r[k] for r in runs[p]) for k in keys} for p in PROFILES}
    for k in keys:
        cells = []
        for p in PROFILES:
            values = [r[k] for r in runs[p]]
            cells.append(f"{medians[p][k]:.2f} [{min(values):.2f}-{max(values):.2f}]")
        sync, async_ = medians[PROFILES[0]][k], medians[PROFILES[1]][k]
        ratio = f"{async_ / sync:.2f}" if sync else "-"
        paired = sorted(b[k] / a[k] for a, b in zip(runs[PROFILES[0]], runs[PROFILES[1]]) if a[k])
        lower = sum(r < 1 for r in paired)
        print(f"| {k} | {cells[0]} | {cells[1]} | {ratio} | {statistics.median(paired):.2f} "
              f"[{paired[0]:.2f}-{paired[-1]:.2f}], {lower}/{len(paired)} lower |")
    (out / f"cpu-async-comparison{args.tag}.json").write_text(json.dumps(
        {"workload": WORKLOAD, "seeds": list(range(args.seeds)), "load_average": loads,
         "elapsed_s": round(elapsed, 1), "per_seed": runs, "medians": medians}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())

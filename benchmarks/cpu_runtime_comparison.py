"""The seed's comparison on the real PyTorch runtime, on this machine's CPU,
with a workload scaled to it: `flightcheck bench` for both policies over the
same seeds, then each run's stage compute and stage-to-stage hop times from
its trace (what explains the change).

    python benchmarks/cpu_runtime_comparison.py [--seeds 3] [--out docs/results]
        [--request-rate 4] [--num-prompts 40] [--tag NAME]

Workload (fixed before the first run): the runtime's seeded "tiny" model,
PP = 2, budget 256 tokens, random prompts of 1024 +- 50 % tokens (1-6 chunks),
16 output tokens, 40 prompts at 4 req/s (Poisson), max-model-len 2048.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOAD = ["--model", "tiny", "--pp", "2", "--dataset", "random", "--random-input-len", "1024",
            "--random-range-ratio", "0.5", "--random-output-len", "16",
            "--max-num-batched-tokens", "256", "--max-model-len", "2048"]
KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
        "mean_itl_ms", "median_itl_ms", "duration")


def stage_stats(trace: Path) -> dict[str, float]:
    """Median per-stage compute of batches, and the hop (stage 0 end -> stage 1 start)."""
    spans: dict[int, dict[int, tuple[float, float]]] = {}
    for line in trace.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("ev") == "stage":
            spans.setdefault(ev["batch"], {})[ev["stage"]] = (ev["t0"], ev["t1"])
    compute = [t1 - t0 for b in spans.values() for t0, t1 in b.values()]
    hops = [b[1][0] - b[0][1] for b in spans.values() if 0 in b and 1 in b]
    busy = [sum(t1 - t0 for b in spans.values() for s, (t0, t1) in b.items() if s == k)
            for k in (0, 1)]
    return {"batches": len(spans), "stage_compute_median_ms": 1e3 * statistics.median(compute),
            "hop_median_ms": 1e3 * statistics.median(hops), "stage0_busy_s": busy[0],
            "stage1_busy_s": busy[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="docs/results")
    parser.add_argument("--request-rate", default="4")
    parser.add_argument("--num-prompts", default="40")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at start")
    results = {}
    for policy in ("one-batch-per-request", "continue-prefill"):
        result = out / f"cpu-{policy}{args.tag}.json"
        trace = out / f"cpu-{policy}{args.tag}.trace.jsonl"
        subprocess.run([sys.executable, "-m", "flightcheck.cli", "bench", *WORKLOAD,
                        "--request-rate", args.request_rate, "--num-prompts", args.num_prompts,
                        "--policy",
                        policy, "--seeds", str(args.seeds), "--trace", str(trace),
                        "--save-result", str(result)], check=True, stdout=subprocess.DEVNULL)
        results[policy] = (json.loads(result.read_text()), stage_stats(trace))
        trace.unlink()                      # large; the stage statistics are what we keep
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    old, new = results["one-batch-per-request"], results["continue-prefill"]
    print(f"rate {args.request_rate} req/s, {args.num_prompts} prompts, seeds 0-{args.seeds - 1}"
          f" (medians; per-seed values in the result files)")
    print("| metric | one-batch-per-request | continue-prefill | change |")
    print("|---|---|---|---|")
    for k in KEYS:
        a, b = old[0][k], new[0][k]
        print(f"| {k} | {a:.2f} | {b:.2f} | {100 * (b - a) / a:+.1f} % |")
    for k in old[1]:
        print(f"| {k} (first seed's trace) | {old[1][k]:.2f} | {new[1][k]:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

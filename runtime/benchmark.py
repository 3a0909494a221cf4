"""Throughput, pipeline bubbles and TTFT of the runtime on this machine.

    python -m flightcheck.runtime.benchmark [--model small] [--json]
    python -m flightcheck.runtime.benchmark --compare-async [--pp 2] [--repeats 3]

PP = 1 (in-process) and PP = 2 (two stage processes over gloo) on a
prefill-heavy and a decode-heavy workload, and TTFT at PP = 2 with
continue_prefill on vs off. `--compare-async`: the decode-heavy workload
under vLLM 0.33's sync and async scheduling (`vllm-0.33` vs
`vllm-0.33-async`, both with sampled-token feedback), alternated `--repeats`
times on one pipeline. Every figure comes from the run's trace: stage
busy time per batch (compute), the gap between stage s's end and stage
s + 1's start for the same batch (transfer plus waiting for the next stage),
and the bubble fraction = idle stage time / (K * window). Not a timed test:
the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time

import torch

from flightcheck.reference import SchedulerConfig

from .generate import GenerationRequest, generate
from .launch import StageSpec, make_executor, set_threads
from .trace import RuntimeTraceWriter, hop_times, pipeline_stats, transfer_times
from .weights import WeightSource
from .workload import mixed_workload

POOL = dict(max_num_seqs=32, max_model_len=1024, block_size=16, num_blocks=512)


def workloads(seed: int) -> dict[str, list[GenerationRequest]]:
    return {
        "prefill-heavy": mixed_workload(seed, 8, prompt_lens=(200, 400), max_tokens=(4, 4),
                                        shared_prefix_fraction=0.0, repeat_fraction=0.0),
        "decode-heavy": mixed_workload(seed, 16, prompt_lens=(16, 32), max_tokens=(48, 48),
                                       shared_prefix_fraction=0.0, repeat_fraction=0.0),
    }


def measure(executor, k: int, workload: list[GenerationRequest], budget: int,
            continue_prefill: bool = True, profile: str = "vllm-0.8.5") -> dict:
    cfg = SchedulerConfig(num_pipeline_stages=k, max_num_batched_tokens=budget,
                          continue_prefill=continue_prefill, enable_prefix_caching=False,
                          profile=profile, **POOL)
    sink = io.StringIO()
    executor.reset()
    result = generate(executor, cfg, workload, trace=RuntimeTraceWriter(sink))
    events = [json.loads(line) for line in sink.getvalue().splitlines()]
    stats = pipeline_stats(events)
    per_stage = [[e["t1"] - e["t0"] for e in events if e["ev"] == "stage" and e["stage"] == s]
                 for s in range(k)]
    arrive = {e["req"]: e["t"] for e in events if e["ev"] == "arrive"}
    first: dict[str, float] = {}
    for e in events:
        if e["ev"] == "complete":
            for req, toks in e["tokens"].items():
                if toks and req not in first:
                    first[req] = e["t"] - arrive[req]
    ttft = sorted(first.values())
    token_times: dict[str, list[float]] = {}
    for e in events:
        if e["ev"] == "complete":
            for req, toks in e["tokens"].items():
                token_times.setdefault(req, []).extend([e["t"]] * len(toks))
    # Time per output token after the first, per request (its decode cadence).
    tpot = sorted((times[-1] - times[0]) / (len(times) - 1)
                  for times in token_times.values() if len(times) > 1)
    out_tokens = sum(len(r.output_token_ids) for r in result.requests)
    in_tokens = sum(r.prompt_len for r in result.requests)
    hops, transfers = hop_times(events), transfer_times(events)
    return {
        "pp": k, "continue_prefill": continue_prefill, "seconds": round(result.seconds, 3),
        "batches": result.num_batches,
        "output_tok_s": round(out_tokens / result.seconds, 1),
        "total_tok_s": round((in_tokens + out_tokens) / result.seconds, 1),
        "bubble_fraction": round(stats["bubble_fraction"], 3),
        "stage_ms_per_batch": [round(1e3 * statistics.mean(x), 2) for x in per_stage],
        "hop_ms_median": round(1e3 * statistics.median(hops), 2) if hops else None,
        "transfer_ms_median": round(1e3 * statistics.median(transfers), 2) if transfers else None,
        "ttft_ms_mean": round(1e3 * statistics.mean(ttft), 1),
        "ttft_ms_p90": round(1e3 * ttft[int(0.9 * (len(ttft) - 1))], 1),
        "tpot_ms_median": round(1e3 * statistics.median(tpot), 1) if tpot else None,
    }


def compare_async(source: WeightSource, args: argparse.Namespace) -> list[dict]:
    """Sync vs async scheduling (vLLM 0.33) on the decode-heavy workload, one
    pipeline, runs alternated so a change of machine load hits both."""
    executor = make_executor(StageSpec(source, args.pp, POOL["num_blocks"], POOL["block_size"],
                                       dtype=args.dtype, feedback=True))
    rows = []
    try:
        measure(executor, args.pp, mixed_workload(99, 2, prompt_lens=(20, 40)), args.budget,
                profile="vllm-0.33")                                             # warm-up
        workload = workloads(args.seed)["decode-heavy"]
        for _ in range(args.repeats):
            for profile in ("vllm-0.33", "vllm-0.33-async"):
                rows.append({"workload": "decode-heavy", "profile": profile,
                             **measure(executor, args.pp, workload, args.budget, profile=profile)})
    finally:
        executor.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="small", help="seeded preset (default small)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=128, help="max_num_batched_tokens")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare-async", action="store_true",
                        help="sync vs async scheduling (vLLM 0.33) on the decode-heavy workload")
    parser.add_argument("--pp", type=int, default=2, help="stages for --compare-async")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each for --compare-async")
    args = parser.parse_args(argv)
    set_threads(1)
    source = WeightSource(preset=args.model, seed=args.seed)
    loads = workloads(args.seed)
    rows = []
    for k in ((1, 2) if not args.compare_async else ()):
        executor = make_executor(StageSpec(source, k, POOL["num_blocks"], POOL["block_size"], dtype=args.dtype))
        try:
            measure(executor, k, mixed_workload(99, 2, prompt_lens=(20, 40)), args.budget)  # warm-up
            for name, workload in loads.items():
                rows.append({"workload": name, **measure(executor, k, workload, args.budget)})
            if k == 2:
                rows.append({"workload": "prefill-heavy",
                             **measure(executor, k, loads["prefill-heavy"], args.budget, False)})
        finally:
            executor.close()
    if args.compare_async:
        rows = compare_async(source, args)
    machine = {"cpus": os.cpu_count(), "torch": torch.__version__, "threads_per_process": 1,
               "load_average": [round(x, 2) for x in os.getloadavg()], "model": args.model,
               "dtype": args.dtype, "budget": args.budget, "when": time.strftime("%Y-%m-%d %H:%M")}
    if args.json:
        print(json.dumps({"machine": machine, "rows": rows}, indent=1))
        return 0
    print(f"machine: {machine}")
    cols = ["workload", *(["profile"] if args.compare_async else []), "pp", "continue_prefill",
            "seconds", "batches", "output_tok_s",
            "total_tok_s", "bubble_fraction", "stage_ms_per_batch", "hop_ms_median", "transfer_ms_median",
            "ttft_ms_mean", "ttft_ms_p90", "tpot_ms_median"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

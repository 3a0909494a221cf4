"""What the reference scheduler costs per engine step.

Each batch is timed as the `schedule()` that built it plus the
`update_from_output()` that consumed it, with two batches in flight (K = 2,
the engine's batch queue), prefix caching on, the heap frozen after setup
(`gc.freeze()`), steady state, median over runs. The model is a stand-in
that returns a token for exactly the entries that sample (not timed).

Workloads (anchor: /work/shared/notes/vllm-scheduler-cost.md, vLLM 0.8.5):
* decode-N: N running requests, all decoding; with K = 2 half of them have
  their token in flight, so each batch holds N/2 decodes while schedule()
  walks all N.
* prefill-N: a closed loop of N requests (each finished one is replaced by a
  new arrival), prompts of 1-3k tokens, half of them starting with one of 8
  shared 1k-token prefixes, 1-32 output tokens, budget 8192 tokens per batch.

Usage: python benchmarks/scheduler_cost.py [--quick] [--runs R] [--batches B]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

try:
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)
except ImportError:  # run from a checkout without installing
    import importlib.util
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location(
        "flightcheck.reference", root / "reference" / "__init__.py",
        submodule_search_locations=[str(root / "reference")])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["flightcheck.reference"] = module
    spec.loader.exec_module(module)
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)

K = 2
BUDGET = 8192
BLOCK_SIZE = 16


class Workload:
    """Builds requests; `replace` says whether a finished one is replaced."""

    def __init__(self, name: str, num_requests: int, seed: int) -> None:
        self.name, self.num_requests = name, num_requests
        self.rng = random.Random(seed)
        self.vocab = [self.rng.randrange(1, 32_000) for _ in range(4096)]  # shared int objects
        self.prefixes = [[self.rng.choice(self.vocab) for _ in range(1024)] for _ in range(8)]
        self.counter = 0
        self.is_decode = name == "decode"

    def new_request(self) -> Request:
        rng = self.rng
        self.counter += 1
        req_id = f"r{self.counter}"
        if self.is_decode:
            n = rng.randint(64, 128)
            return Request(req_id, rng.choices(self.vocab, k=n), SamplingParams(max_tokens=100_000))
        n = rng.randint(1024, 3072)
        prompt = self.prefixes[rng.randrange(8)][:] if rng.random() < 0.5 else []
        prompt += rng.choices(self.vocab, k=n - len(prompt))
        return Request(req_id, prompt, SamplingParams(max_tokens=rng.randint(1, 32)))

    def config(self) -> SchedulerConfig:
        max_len = 16384 if self.is_decode else 3200
        # Room for every request at its longest: no preemption in the steady state.
        per_request = -(-((128 + 2000) if self.is_decode else 3104) // BLOCK_SIZE)
        return SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=self.num_requests,
                               max_model_len=max_len, block_size=BLOCK_SIZE,
                               num_blocks=max(per_request * self.num_requests, max_len // BLOCK_SIZE),
                               num_pipeline_stages=K, enable_prefix_caching=True)


def fake_model(scheduler_output, step: int) -> ModelRunnerOutput:
    """A token for every entry that samples; never a stop token."""
    tokens = {e.req_id: ([1 + (step + i) % 30_000] if e.samples else [])
              for i, e in enumerate(scheduler_output.entries)}
    return ModelRunnerOutput.from_tokens(tokens)


def run_case(name: str, num_requests: int, num_batches: int, seed: int) -> dict:
    workload = Workload(name, num_requests, seed)
    sched = Scheduler(workload.config())
    for _ in range(num_requests):
        sched.add_request(workload.new_request())
    queue: deque = deque()
    step = 0

    def one_step(record: list | None) -> None:
        nonlocal step
        step += 1
        if len(queue) < K:
            t0 = time.perf_counter_ns()
            out = sched.schedule()
            t1 = time.perf_counter_ns()
            if out.total_num_scheduled_tokens:
                queue.append((out, fake_model(out, step), t1 - t0, len(sched.running)))
                return
        out, result, schedule_ns, num_running = queue.popleft()
        t0 = time.perf_counter_ns()
        outputs = sched.update_from_output(out, result)
        t1 = time.perf_counter_ns()
        if not workload.is_decode:
            for o in outputs:
                if o.finish_reason is not None:
                    sched.add_request(workload.new_request())
        if record is not None:
            record.append((schedule_ns, t1 - t0, len(out.entries),
                           out.total_num_scheduled_tokens, num_running))

    # Warm up to the steady state: every decode request prefilled; for the
    # prefill loop, a few thousand batches of turnover.
    if workload.is_decode:
        while any(r.num_output_tokens == 0 for r in sched.running) or sched.waiting:
            one_step(None)
        for _ in range(20):
            one_step(None)
    else:
        for _ in range(min(3000, 40 + num_requests // 2)):
            one_step(None)
    gc.collect()
    gc.freeze()
    records: list = []
    while len(records) < num_batches:
        one_step(records)
    gc.unfreeze()
    sched_us = [r[0] / 1000 for r in records]
    update_us = [r[1] / 1000 for r in records]
    total_us = [(r[0] + r[1]) / 1000 for r in records]
    p50 = statistics.median(total_us)
    running = statistics.mean(r[4] for r in records)
    per_batch = statistics.mean(r[2] for r in records)
    return {
        "case": f"{name}-{num_requests}", "running": running, "reqs_per_batch": per_batch,
        "tokens_per_batch": statistics.mean(r[3] for r in records),
        "schedule_p50": statistics.median(sched_us), "update_p50": statistics.median(update_us),
        "total_p50": p50, "total_p99": sorted(total_us)[int(0.99 * (len(total_us) - 1))],
        "us_per_running": p50 / running, "us_per_scheduled": p50 / per_batch,
    }


def median_of_runs(runs: list[dict]) -> dict:
    keys = [k for k in runs[0] if k != "case"]
    return {"case": runs[0]["case"], **{k: statistics.median(r[k] for r in runs) for k in keys}}


def format_table(rows: list[dict]) -> str:
    header = ("| case | running | requests/batch | tokens/batch | schedule() p50 µs | "
              "update_from_output() p50 µs | per batch p50 µs | per batch p99 µs | "
              "µs per running req | µs per scheduled req |")
    lines = [header, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['running']:,.0f} | {r['reqs_per_batch']:,.0f} | "
            f"{r['tokens_per_batch']:,.0f} | {r['schedule_p50']:,.0f} | {r['update_p50']:,.0f} | "
            f"{r['total_p50']:,.0f} | {r['total_p99']:,.0f} | {r['us_per_running']:.2f} | "
            f"{r['us_per_scheduled']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches, one run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    args = parser.parse_args(argv)
    runs, batches = (1, 60) if args.quick else (args.runs, args.batches)
    rows = []
    for name in ("decode", "prefill"):
        for n in args.sizes:
            rows.append(median_of_runs([run_case(name, n, batches, seed) for seed in range(runs)]))
            print(f"  done {rows[-1]['case']}", file=sys.stderr, flush=True)
    print(f"python {platform.python_version()}, {platform.machine()}, "
          f"{runs} run(s) x {batches} batches, K={K}, budget {BUDGET}, block size {BLOCK_SIZE}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

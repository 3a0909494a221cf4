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
* prefill-N: N running requests with 1-3k-token contexts, decoding, plus a
  stream of arrivals with 1-3k-token prompts (1-8 output tokens; 8 always
  waiting) that fills every batch to the 8192-token budget with
  prefill chunks; half of all prompts start with one of 8 shared 1k-token
  prefixes. Each batch: N/2 decodes plus the prefill chunks.

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
    """Builds the requests of one case.

    decode: N short-prompt requests that decode for the whole run.
    prefill: N long-context requests (1-3k-token prompts) that decode for the
    whole run, plus a stream of short-lived arrivals with 1-3k-token prompts
    (1-8 output tokens, 8 of them always waiting) that keeps every
    batch filled to the token budget with prefill chunks. Half of all
    prompts start with one of 8 shared 1k-token prefixes.
    """

    STREAM_WAITING = 8          # prefill arrivals kept queued at all times
    STREAM_RUNNING = 128        # room for the stream's requests while they decode

    def __init__(self, name: str, num_requests: int, seed: int) -> None:
        self.name, self.num_requests = name, num_requests
        self.rng = random.Random(seed)
        self.vocab = [self.rng.randrange(1, 32_000) for _ in range(4096)]  # shared int objects
        self.prefixes = [[self.rng.choice(self.vocab) for _ in range(1024)] for _ in range(8)]
        self.counter = 0
        self.is_decode = name == "decode"

    def _long_prompt(self) -> list[int]:
        rng = self.rng
        n = rng.randint(1024, 3072)
        prompt = self.prefixes[rng.randrange(8)][:] if rng.random() < 0.5 else []
        return prompt + rng.choices(self.vocab, k=n - len(prompt))

    def long_lived_request(self) -> Request:
        self.counter += 1
        if self.is_decode:
            prompt = self.rng.choices(self.vocab, k=self.rng.randint(64, 128))
        else:
            prompt = self._long_prompt()
        return Request(f"r{self.counter}", prompt, SamplingParams(max_tokens=100_000))

    def stream_request(self) -> Request:
        self.counter += 1
        return Request(f"s{self.counter}", self._long_prompt(),
                       SamplingParams(max_tokens=self.rng.randint(1, 8)))

    def config(self) -> SchedulerConfig:
        max_len = 4096 if self.is_decode else 6144
        stream = 0 if self.is_decode else self.STREAM_RUNNING + self.STREAM_WAITING
        # Room for every request at its longest: no preemption in the steady state.
        per_request = -(-max_len // BLOCK_SIZE)
        return SchedulerConfig(max_num_batched_tokens=BUDGET,
                               max_num_seqs=self.num_requests + stream,
                               max_model_len=max_len, block_size=BLOCK_SIZE,
                               num_blocks=per_request * (self.num_requests + stream),
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
        sched.add_request(workload.long_lived_request())
    if not workload.is_decode:
        for _ in range(workload.STREAM_WAITING):
            sched.add_request(workload.stream_request())
    queue: deque = deque()
    step = 0

    def one_step(record: list | None) -> None:
        nonlocal step
        step += 1
        if len(queue) < K:
            t0 = time.perf_counter_ns()
            out = sched.schedule()
            t1 = time.perf_counter_ns()
            if not workload.is_decode:           # keep the stream's queue topped up
                for _ in range(workload.STREAM_WAITING - len(sched.waiting)):
                    sched.add_request(workload.stream_request())
            if out.total_num_scheduled_tokens:
                queue.append((out, fake_model(out, step), t1 - t0, len(sched.running)))
                return
        out, result, schedule_ns, num_running = queue.popleft()
        t0 = time.perf_counter_ns()
        sched.update_from_output(out, result)
        t1 = time.perf_counter_ns()
        if record is not None:
            record.append((schedule_ns, t1 - t0, len(out.entries),
                           out.total_num_scheduled_tokens, num_running))

    # Warm up to the steady state: every long-lived request prefilled and
    # decoding, then some batches of turnover.
    long_lived = {f"r{i + 1}" for i in range(num_requests)}
    while any(sched.requests[r].num_output_tokens == 0 for r in long_lived):
        one_step(None)
    for _ in range(40):
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

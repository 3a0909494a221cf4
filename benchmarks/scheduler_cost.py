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
           [--sizes N ...] [--cases decode prefill]

Experiments on why the cost per request changes with N (reference/PERF.md):
  --gc-stats                 collections per batch, by generation, and time in
                             the collector
  --experiment working-set   decode at the smallest size alone, with every cache
                             flushed before each timed call, as many schedulers
                             of that size in rotation as make the largest size,
                             and the largest size alone, taking turns
  --experiment gc            decode with the collector on and off, taking turns
  --batches 0                warm up only (the baseline a cachegrind run subtracts)
  --compare DIR              also run every case with the reference/ package in
                             DIR (e.g. `git archive`d from an older commit),
                             alternating seed by seed in this process
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import platform
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path



def import_reference(directory: Path, name: str = "flightcheck.reference"):
    """The reference package in `directory`, imported under `name`."""
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


try:
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)
except ImportError:  # run from a checkout without installing
    import_reference(Path(__file__).resolve().parent.parent / "reference")
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)


def benchmark_with_reference(directory: Path):
    """This module once more, bound to the reference package in `directory`
    (another commit's reference/, to compare against in the same process)."""
    current = sys.modules["flightcheck.reference"]
    try:
        sys.modules["flightcheck.reference"] = import_reference(directory, "compared_reference")
        spec = importlib.util.spec_from_file_location("compared_scheduler_cost", __file__)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.modules["flightcheck.reference"] = current
    return module


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


class EngineLoop:
    """One scheduler, driven as the engine's batch queue drives it: schedule
    while fewer than K batches are in flight, else complete the oldest."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.sched = Scheduler(workload.config())
        for _ in range(workload.num_requests):
            self.sched.add_request(workload.long_lived_request())
        if not workload.is_decode:
            for _ in range(workload.STREAM_WAITING):
                self.sched.add_request(workload.stream_request())
        self.queue: deque = deque()
        self.step = 0

    def warm_up(self) -> None:
        """To the steady state: every long-lived request prefilled and
        decoding, then some batches of turnover."""
        long_lived = [f"r{i + 1}" for i in range(self.workload.num_requests)]
        while any(self.sched.requests[r].num_output_tokens == 0 for r in long_lived):
            self.one_step(None)
        for _ in range(40):
            self.one_step(None)

    def next_batch(self, record: list, before_timed=None) -> None:
        """Run until one more batch has been scheduled and completed (timed)."""
        num_records = len(record)
        while len(record) == num_records:
            self.one_step(record, before_timed)

    def one_step(self, record: list | None, before_timed=None) -> None:
        sched, workload, queue = self.sched, self.workload, self.queue
        self.step += 1
        if len(queue) < K:
            if before_timed is not None:
                before_timed()
            t0 = time.perf_counter_ns()
            out = sched.schedule()
            t1 = time.perf_counter_ns()
            if not workload.is_decode:           # keep the stream's queue topped up
                for _ in range(workload.STREAM_WAITING - len(sched.waiting)):
                    sched.add_request(workload.stream_request())
            if out.total_num_scheduled_tokens:
                queue.append((out, fake_model(out, self.step), t1 - t0, len(sched.running)))
                return
        out, result, schedule_ns, num_running = queue.popleft()
        if before_timed is not None:
            before_timed()
        t0 = time.perf_counter_ns()
        sched.update_from_output(out, result)
        t1 = time.perf_counter_ns()
        if record is not None:
            record.append((schedule_ns, t1 - t0, len(out.entries),
                           out.total_num_scheduled_tokens, num_running))


class CacheFlusher:
    """Writes 64 MiB, more than every cache of the machine, so that the next
    timed call finds every request's data cold."""

    def __init__(self) -> None:
        self.buffer = bytearray(64 << 20)
        self.zeros = bytes(len(range(0, len(self.buffer), 64)))

    def __call__(self) -> None:
        self.buffer[::64] = self.zeros           # one write per 64-byte line


class GcStats:
    """Collections while the measured batches run (the stand-in model's
    allocations count towards them too), by generation, and their time."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.ns = 0
        self._t0 = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._t0
            self.collections[info["generation"]] += 1


def summarize(label: str, records: list, stats: GcStats | None = None) -> dict:
    sched_us = [r[0] / 1000 for r in records]
    update_us = [r[1] / 1000 for r in records]
    total_us = [(r[0] + r[1]) / 1000 for r in records]
    p50 = statistics.median(total_us)
    running = statistics.mean(r[4] for r in records)
    per_batch = statistics.mean(r[2] for r in records)
    row = {
        "case": label, "running": running, "reqs_per_batch": per_batch,
        "tokens_per_batch": statistics.mean(r[3] for r in records),
        "schedule_p50": statistics.median(sched_us), "update_p50": statistics.median(update_us),
        "total_p50": p50, "total_p99": sorted(total_us)[int(0.99 * (len(total_us) - 1))],
        "us_per_running": p50 / running, "us_per_scheduled": p50 / per_batch,
    }
    if stats is not None:
        row.update({f"gen{g}_per_batch": stats.collections[g] / len(records) for g in range(3)},
                   gc_us_per_batch=stats.ns / 1000 / len(records))
    return row


def run_case(name: str, num_requests: int, num_batches: int, seed: int) -> dict | None:
    loop = EngineLoop(Workload(name, num_requests, seed))
    loop.warm_up()
    # vLLM freezes the heap after start-up (the anchor's loop does too).
    gc.collect()
    gc.freeze()
    stats = GcStats()
    gc.callbacks.append(stats)
    records: list = []
    try:
        while len(records) < num_batches:
            loop.next_batch(records)
    finally:
        gc.callbacks.remove(stats)
        gc.unfreeze()
    return summarize(f"{name}-{num_requests}", records, stats) if records else None


def interleaved(variants: dict, rounds: int, batches_per_round: int) -> dict[str, list]:
    """Records of each variant (a function that runs one batch into a record
    list), the variants taking turns in rounds so that they share the
    machine's noise."""
    records: dict[str, list] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, one_batch in variants.items():
            for _ in range(batches_per_round):
                one_batch(records[label])
    return records


def working_set_experiment(small: int, large: int, rounds: int) -> list[dict]:
    """Decode cost per request of: one scheduler of `small` requests; the same
    with every cache flushed before each timed call; large/small schedulers
    of `small` requests in rotation (the working set of `large` requests, every
    data structure the size of `small`'s); one scheduler of `large` requests.
    The collector is off, to separate the caches from garbage collection."""
    alone = EngineLoop(Workload("decode", small, 1))
    many = [EngineLoop(Workload("decode", small, 100 + i)) for i in range(large // small)]
    one_large = EngineLoop(Workload("decode", large, 2))
    for loop in (alone, *many, one_large):
        loop.warm_up()
    flush = CacheFlusher()

    def in_rotation(record: list) -> None:
        for loop in many:
            loop.next_batch(record)

    variants = {
        f"1 x {small}": alone.next_batch,
        f"1 x {small}, caches flushed": lambda record: alone.next_batch(record, flush),
        f"{large // small} x {small} in rotation": in_rotation,
        f"1 x {large}": one_large.next_batch,
    }
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        records = interleaved(variants, rounds, 20)
    finally:
        gc.enable()
        gc.unfreeze()
    return [summarize(label, recs) for label, recs in records.items()]


def gc_experiment(sizes: list[int], rounds: int) -> list[dict]:
    """Decode cost with the collector on (frozen heap, as vLLM) and off, in
    alternating blocks of 50 batches, with collections per batch."""
    rows = []
    for n in sizes:
        loop = EngineLoop(Workload("decode", n, 0))
        loop.warm_up()
        stats = {"on": GcStats(), "off": GcStats()}

        def block(record: list, mode: str) -> None:
            gc.callbacks.append(stats[mode])
            if mode == "off":
                gc.disable()
            try:
                loop.next_batch(record)
            finally:
                gc.enable()
                gc.callbacks.remove(stats[mode])

        gc.collect()
        gc.freeze()
        try:
            records = interleaved({"on": lambda r: block(r, "on"),
                                   "off": lambda r: block(r, "off")}, rounds, 50)
        finally:
            gc.unfreeze()
        rows += [summarize(f"decode-{n}, collector {mode}", records[mode], stats[mode])
                 for mode in ("on", "off")]
    return rows


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


def format_gc_table(rows: list[dict]) -> str:
    lines = ["| case | gen0 per batch | gen1 per batch | gen2 per batch | "
             "collector µs per batch (mean) |", "|" + "---|" * 5]
    for r in rows:
        lines.append(f"| {r['case']} | {r['gen0_per_batch']:.1f} | {r['gen1_per_batch']:.2f} | "
                     f"{r['gen2_per_batch']:.3f} | {r['gc_us_per_batch']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches, one run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--cases", nargs="+", choices=["decode", "prefill"],
                        default=["decode", "prefill"])
    parser.add_argument("--gc-stats", action="store_true",
                        help="also print collections per batch and time in the collector")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="a reference/ directory to run alternately with this checkout's")
    parser.add_argument("--experiment", choices=["working-set", "gc"],
                        help="an interleaved experiment on the cost per request (PERF.md)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of an --experiment")
    args = parser.parse_args(argv)
    if args.experiment == "working-set":
        print(format_table(working_set_experiment(min(args.sizes), max(args.sizes), args.rounds)))
        return 0
    if args.experiment == "gc":
        rows = gc_experiment(args.sizes, args.rounds)
        print(format_table(rows))
        print()
        print(format_gc_table(rows))
        return 0
    runs, batches = (1, 60) if args.quick else (args.runs, args.batches)
    versions = {"this checkout": sys.modules[__name__]}
    if args.compare:
        versions = {str(args.compare): benchmark_with_reference(args.compare.resolve()), **versions}
    rows: dict[str, list[dict]] = {label: [] for label in versions}
    for name in args.cases:
        for n in args.sizes:
            results: dict[str, list] = {label: [] for label in versions}
            for seed in range(runs):
                order = list(versions) if seed % 2 == 0 else list(versions)[::-1]
                for label in order:
                    results[label].append(versions[label].run_case(name, n, batches, seed))
            if batches == 0:
                print(f"  warmed up {name}-{n}", file=sys.stderr, flush=True)
                continue
            for label in versions:
                rows[label].append(median_of_runs(results[label]))
            print(f"  done {name}-{n}", file=sys.stderr, flush=True)
    if batches == 0:
        return 0
    print(f"python {platform.python_version()}, {platform.machine()}, "
          f"{runs} run(s) x {batches} batches, K={K}, budget {BUDGET}, block size {BLOCK_SIZE}")
    for label, table in rows.items():
        if len(rows) > 1:
            print(f"\n{label}:")
        print(format_table(table))
        if args.gc_stats:
            print()
            print(format_gc_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

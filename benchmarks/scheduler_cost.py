"""What the reference scheduler costs per batch, side by side with vLLM 0.8.5's.

By default, every case runs our reference scheduler (in this process) and
vLLM 0.8.5's real `Scheduler` (in a worker process inside the vLLM venv,
`flightcheck/vllm/cost_worker.py`) alternately, in rounds (reference, vLLM,
then vLLM, reference, ...), so that the machine's drifts hit both; both
sides run the same workloads and the same engine loop
(`flightcheck/vllm/cost.py`): a batch queue of depth K = 2, prefix caching
on, the heap frozen (`gc.freeze()`) after the warm-up, collector on. Each
batch is timed as the `schedule()` that built it plus the
`update_from_output()` that consumed it; the stand-in model (a token for
exactly the entries that sample) is not timed. Per case: each side's p50 per
batch and the ratio reference / vLLM.

Cases: decode-256, decode-1024, decode-4096 (N running requests all
decoding, N/2 per batch) and prefill-mix (about 100 running plus a stream of
1-3k-token prompts filling the 8192-token budget; cost.py describes them).

Usage: python benchmarks/scheduler_cost.py [--rounds R] [--batches B]
           [--cases CASE ...] [--json] [--reference-only]

The vLLM venv is built by `scripts/build-vllm-venv.sh 0.8.5` (found where
`flightcheck vllm replay` finds it); without it the benchmark exits 2 and
says so, unless --reference-only.

Reference only, and the experiments on why the cost per request changes
with N (reference/PERF.md), with --sizes N ... and --kinds decode prefill:
  --runs R                   R runs x --batches per case, reference only
  --gc-stats                 collections per batch, by generation, and time in
                             the collector
  --experiment working-set   decode at the smallest size alone, with every cache
                             flushed before each timed call, as many schedulers
                             of that size in rotation as make the largest size,
                             and the largest size alone, taking turns
  --experiment gc            decode with the collector on and off, alternating
  --batches 0                warm up only (the baseline a cachegrind run subtracts)
  --compare DIR              also run every case with the reference/ package in
                             DIR (e.g. `git archive`d from an older commit),
                             alternating seed by seed in this process
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def import_reference(directory: Path, name: str = "flightcheck.reference"):
    """The reference package in `directory`, imported under `name`."""
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


try:
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)
except ImportError:  # run from a checkout without installing (e.g. `python -S` under valgrind)
    # An empty parent package, so that the reference's relative imports resolve.
    parent = sys.modules.setdefault("flightcheck", types.ModuleType("flightcheck"))
    parent.__path__ = []
    import_reference(ROOT / "reference")
    from flightcheck.reference import (ModelRunnerOutput, Request, SamplingParams, Scheduler,
                                       SchedulerConfig)
try:
    from flightcheck.vllm import cost
except ImportError:
    cost = import_file(ROOT / "flightcheck" / "vllm" / "cost.py", "flightcheck_vllm_cost")

K, BUDGET, BLOCK_SIZE = cost.K, cost.BUDGET, cost.BLOCK_SIZE
CASES = cost.CASES
Workload = cost.Workload
VLLM_VERSION = "0.8.5"


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


def make_reference_request(spec) -> Request:
    return Request(spec.req_id, spec.prompt_token_ids, SamplingParams(max_tokens=spec.max_tokens))


def reference_model(scheduler: Scheduler, scheduler_output, step: int) -> tuple[ModelRunnerOutput, int]:
    """A token for every entry that samples; never a stop token."""
    entries = scheduler_output.entries
    tokens = {e.req_id: ([cost.stand_in_token(step, i)] if e.samples else [])
              for i, e in enumerate(entries)}
    return ModelRunnerOutput.from_tokens(tokens), len(entries)


def reference_loop(workload: "cost.Workload") -> "cost.EngineLoop":
    """The shared engine loop around a reference scheduler for `workload`."""
    return cost.EngineLoop(workload, Scheduler(SchedulerConfig(**workload.settings())),
                           make_reference_request, reference_model)


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
    loop = reference_loop(Workload(name, num_requests, seed))
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
    alone = reference_loop(Workload("decode", small, 1))
    many = [reference_loop(Workload("decode", small, 100 + i)) for i in range(large // small)]
    one_large = reference_loop(Workload("decode", large, 2))
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
        loop = reference_loop(Workload("decode", n, 0))
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


class VllmSide:
    """vLLM's own scheduler, driven by the cost worker in the vLLM venv."""

    def __init__(self) -> None:
        from flightcheck.vllm.replay import ReplayWorker
        self.worker = ReplayWorker(VLLM_VERSION, module="flightcheck.vllm.cost_worker")

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        answer = self.worker.call(command)
        if "error" in answer:
            raise RuntimeError(f"the vLLM cost worker failed on {command}: {answer['error']}\n"
                               f"{self.worker.stderr_tail()}")
        return answer

    def close(self) -> None:
        self.worker.close()


def side_summary(records: list) -> dict[str, Any]:
    """One side's figures for a case, in µs. With K = 2 a decode case's
    batches alternate between two groups of requests, often of unequal sizes
    (their prefills were cut by the budget: 170 and 86 at decode-256), so
    the per-batch median sits between the two groups' costs and moves with
    a few slow batches; the median of pairs of consecutive batches (every
    running request scheduled once) does not."""
    per_batch = [(r[0] + r[1]) / 1000 for r in records]
    total_us = sorted(per_batch)
    pairs = [per_batch[i] + per_batch[i + 1] for i in range(0, len(per_batch) - 1, 2)]
    return {
        "batches": len(records),
        "running": statistics.mean(r[4] for r in records),
        "requests_per_batch": statistics.mean(r[2] for r in records),
        "tokens_per_batch": statistics.mean(r[3] for r in records),
        "schedule_p50_us": statistics.median(r[0] / 1000 for r in records),
        "update_p50_us": statistics.median(r[1] / 1000 for r in records),
        "per_batch_p50_us": statistics.median(total_us),
        "per_batch_p99_us": total_us[int(0.99 * (len(total_us) - 1))],
        "per_pair_p50_us": statistics.median(pairs) if pairs else None,
    }


def side_by_side(case: str, rounds: int, batches: int, vllm: VllmSide | None) -> dict[str, Any]:
    """Both schedulers on `case` (the same requests: seed 0), warmed up, then
    taking turns of `batches` batches for `rounds` rounds, the order flipped
    every round. The ratio is reference / vLLM of the per-batch medians."""
    loop = reference_loop(cost.workload_of_case(case, seed=0))
    loop.warm_up()
    if vllm is not None:
        vllm.ask({"start": case, "seed": 0})
    records: dict[str, list] = {"reference": [], "vllm": []}
    # vLLM's engine core freezes the heap after start-up; both sides do here.
    gc.collect()
    gc.freeze()
    try:
        for round_index in range(rounds):
            order = ("reference", "vllm") if round_index % 2 == 0 else ("vllm", "reference")
            for side in order:
                if side == "reference":
                    target = len(records["reference"]) + batches
                    while len(records["reference"]) < target:
                        loop.next_batch(records["reference"])
                elif vllm is not None:
                    records["vllm"] += vllm.ask({"batches": batches})["records"]
    finally:
        gc.unfreeze()
        if vllm is not None:
            vllm.ask({"stop": True})
    del loop
    gc.collect()
    reference = side_summary(records["reference"])
    theirs = side_summary(records["vllm"]) if records["vllm"] else None
    ratio = pair_ratio = None
    if theirs is not None:
        ratio = reference["per_batch_p50_us"] / theirs["per_batch_p50_us"]
        if reference["per_pair_p50_us"] and theirs["per_pair_p50_us"]:
            pair_ratio = reference["per_pair_p50_us"] / theirs["per_pair_p50_us"]
    return {"case": case, "reference": reference, "vllm": theirs, "ratio": ratio,
            "pair_ratio": pair_ratio}


def format_side_by_side(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | running | requests/batch | tokens/batch | reference schedule() p50 µs | "
             "reference update_from_output() p50 µs | reference per batch p50 µs | "
             "vLLM schedule() p50 µs | vLLM update_from_output() p50 µs | vLLM per batch p50 µs | "
             "reference / vLLM | the same, pairs of batches |", "|" + "---|" * 12]
    for row in rows:
        ours, theirs = row["reference"], row["vllm"]
        running = f"{ours['running']:,.0f}"
        if theirs is not None and round(theirs["running"]) != round(ours["running"]):
            running += f" (vLLM {theirs['running']:,.0f})"
        vllm_cells = ("— | — | —" if theirs is None else
                      f"{theirs['schedule_p50_us']:,.0f} | {theirs['update_p50_us']:,.0f} | "
                      f"{theirs['per_batch_p50_us']:,.0f}")
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        ratio += " | " + ("—" if row["pair_ratio"] is None else f"{row['pair_ratio']:.2f}")
        lines.append(f"| {row['case']} | {running} | {ours['requests_per_batch']:,.0f} | "
                     f"{ours['tokens_per_batch']:,.0f} | {ours['schedule_p50_us']:,.0f} | "
                     f"{ours['update_p50_us']:,.0f} | {ours['per_batch_p50_us']:,.0f} | "
                     f"{vllm_cells} | {ratio} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import os
    return {"python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def run_side_by_side(args: argparse.Namespace) -> int:
    cases = args.cases or list(CASES)
    for case in cases:
        try:
            cost.workload_of_case(case, 0)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    rounds = args.rounds if args.rounds is not None else 10
    batches = args.batches if args.batches is not None else 30
    vllm = None
    if not args.reference_only:
        from flightcheck.vllm.replay import missing_venv_message, venv_python
        if not venv_python(VLLM_VERSION).exists():
            print(f"error: {missing_venv_message(VLLM_VERSION)}; or run with --reference-only",
                  file=sys.stderr)
            return 2
        vllm = VllmSide()
    rows = []
    try:
        for case in cases:
            rows.append(side_by_side(case, rounds, batches, vllm))
            print(f"  done {case}", file=sys.stderr, flush=True)
    finally:
        if vllm is not None:
            vllm.close()
    report = {"machine": machine(), "command": " ".join(["python", "benchmarks/scheduler_cost.py",
                                                         *(args.argv or [])]),
              "vllm_version": None if vllm is None else VLLM_VERSION, "batch_queue_depth": K,
              "budget": BUDGET, "block_size": BLOCK_SIZE, "prefix_caching": True,
              "rounds": rounds, "batches_per_round": batches, "cases": rows}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        m = report["machine"]
        print(f"{m['date']}, python {m['python']}, {m['processor']}, {m['cpus']} CPUs; "
              f"{rounds} rounds x {batches} batches per side, K={K}, budget {BUDGET}, "
              f"block size {BLOCK_SIZE}, prefix caching on")
        print(format_side_by_side(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", metavar="CASE",
                        help=f"side-by-side cases: {', '.join(CASES)} (default), or decode-N / prefill-N")
    parser.add_argument("--rounds", type=int, help="turns per side (default 10; --experiment: 5)")
    parser.add_argument("--batches", type=int,
                        help="timed batches per turn (default 30); with --runs: per run (default 300)")
    parser.add_argument("--json", action="store_true", help="print the side-by-side results as JSON")
    parser.add_argument("--reference-only", action="store_true",
                        help="side by side without the vLLM side (no venv needed)")
    parser.add_argument("--quick", action="store_true", help="4 rounds x 15 batches (--runs: 1 x 60)")
    parser.add_argument("--runs", type=int,
                        help="reference only: R runs x --batches per --kinds/--sizes case")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--kinds", nargs="+", choices=["decode", "prefill"],
                        default=["decode", "prefill"])
    parser.add_argument("--gc-stats", action="store_true",
                        help="also print collections per batch and time in the collector (--runs)")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="a reference/ directory to run alternately with this checkout's (--runs)")
    parser.add_argument("--experiment", choices=["working-set", "gc"],
                        help="an interleaved experiment on the cost per request (PERF.md)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.quick and args.runs is None and args.compare is None:
        args.rounds = args.rounds or 4
        args.batches = args.batches or 15
    if args.experiment == "working-set":
        rounds = args.rounds or 5
        print(format_table(working_set_experiment(min(args.sizes), max(args.sizes), rounds)))
        return 0
    if args.experiment == "gc":
        rows = gc_experiment(args.sizes, args.rounds or 5)
        print(format_table(rows))
        print()
        print(format_gc_table(rows))
        return 0
    if args.runs is None and args.compare is None and not args.gc_stats:
        return run_side_by_side(args)
    return reference_runs(args)


def reference_runs(args: argparse.Namespace) -> int:
    """Reference only: each --kinds x --sizes case, --runs seeds, median of
    runs; with --compare, another reference/ alternating seed by seed."""
    if args.quick:
        runs, batches = 1, 60
    else:
        runs = args.runs if args.runs is not None else 3
        batches = args.batches if args.batches is not None else 300
    versions = {"this checkout": sys.modules[__name__]}
    if args.compare:
        versions = {str(args.compare): benchmark_with_reference(args.compare.resolve()), **versions}
    rows: dict[str, list[dict]] = {label: [] for label in versions}
    for name in args.kinds:
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

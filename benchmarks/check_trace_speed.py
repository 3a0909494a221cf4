"""check-trace's speed, against vLLM 0.8.5's own scheduler and on long traces.

Default (the workloads): for each workload of `benchmarks/scheduler_cost.py`
(decode-256, decode-1024, decode-4096, prefill-mix; --cases), the checker's
time on the workload's trace set beside the time vLLM 0.8.5's real
`Scheduler` takes on the same workload, measured in one run:
* the trace: the reference scheduler, traced, through the cost benchmark's
  engine loop and requests (benchmarks/workload_traces.py): its warm-up,
  then --batches completed batches;
* vLLM: the cost benchmark's worker in the vLLM venv (flightcheck/vllm/
  cost_worker.py) runs the same workload to the steady state, then
  --batches timed batches per turn (schedule() plus update_from_output());
* the checker: this tree's default check-trace (the incremental checker
  with the fast path for the steady state, verification/traces/fast.py;
  `--no-fast`: the incremental checker alone), in this process, replays the warm-up untimed, freezes the heap (as both
  schedulers' sides do), then is timed on the events of the --batches
  batches: `feed` per event (the spec's transition, the decision checks and
  the properties). Reading the same lines (JSON and the schema) is timed
  apart (`reading_us_per_batch`) and counted in `with_reading_over_vllm`.
Three turns per workload, the order flipped each turn (vLLM, checker; then
checker, vLLM; ...); `checker_over_vllm` is the median of the turns'
checker / vLLM ratios. `--json` prints the list of workloads' objects.

Long traces (--sizes N ...): for each concurrency N (requests alive at once) it writes a trace of at least
--events events with benchmarks/long_traces.py (the reference scheduler and a
scripted executor; the scheduler's time is its schedule() plus
update_from_output(), trace writing included), then checks it in a fresh
process per checker, so peak memory (ru_maxrss) is the checker's alone:
* `incremental`: this tree's default check-trace;
* `full`: this tree's `check-trace --full`;
* `old`: the checker of another tree (--old DIR: a checkout of the commit
  before the incremental checker, e.g. `git worktree add /tmp/old <commit>`),
  imported from DIR.
A checker that runs past --limit seconds is stopped; its rate is then the
events it got through (it reports progress every 1,000 events) per second.

Usage: python benchmarks/check_trace_speed.py [--json] [--cases CASE ...] [--batches B]
                                              [--turns T]
       python benchmarks/check_trace_speed.py --sizes 100 1000 4000
           [--events 1000000] [--old DIR] [--limit SECONDS] [--checkers incremental full old]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Run in a child process: check the trace at argv[1] with the checker of the
# tree at argv[2] (full replay if argv[3] == "full"), printing progress lines
# "<events> <seconds>" to stderr and one JSON line to stdout.
CHILD = r"""
import json, resource, sys, time
tree, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
import importlib.util, types
# the repository's folders are the package's subpackages (pyproject's package-dir)
root = types.ModuleType("flightcheck"); root.__path__ = [tree + "/flightcheck"]
sys.modules["flightcheck"] = root
for sub in ("spec", "reference", "verification"):
    spec = importlib.util.spec_from_file_location(f"flightcheck.{sub}", f"{tree}/{sub}/__init__.py",
                                                  submodule_search_locations=[f"{tree}/{sub}"])
    module = importlib.util.module_from_spec(spec); sys.modules[f"flightcheck.{sub}"] = module
    setattr(root, sub, module); spec.loader.exec_module(module)
from flightcheck.verification.traces import check
started = time.perf_counter()
events = check.read_events(open(path).read().split("\n"))
parsed = time.perf_counter()
if mode == "full" or "full" not in check.check_events.__code__.co_varnames:
    checker = check.TraceChecker(events)
else:   # the default check-trace: with the fast path where the tree has one
    checker = getattr(check, "FastChecker", check.IncrementalChecker)(events)
check._annotate_finishes(events)
verdict = "legal"
for index, event in enumerate(events[1:], start=1):
    checker.upcoming_finish = event.get("_finishes", {})
    try:
        checker.feed(event)
    except check._Violation as v:
        verdict = f"event {index}: {v.prop}"
        break
    if index % 1000 == 0:
        print(index, time.perf_counter() - parsed, file=sys.stderr, flush=True)
done = time.perf_counter()
print(json.dumps({"tree": check.__file__, "events": index, "check_seconds": done - parsed, "parse_seconds": parsed - started,
                  "verdict": verdict,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_checker(tree: Path, trace: Path, mode: str, limit: float) -> dict:
    """One checker on one trace in a child process; partial figures if it runs past `limit`."""
    progress: list[tuple[int, float]] = []
    with tempfile.TemporaryFile("w+") as err:
        try:
            out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(trace), mode],
                                 stdout=subprocess.PIPE, stderr=err, text=True, timeout=limit).stdout
            return json.loads(out)
        except subprocess.TimeoutExpired:
            err.seek(0)
            for line in err:
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    progress.append((int(parts[0]), float(parts[1])))
    events, seconds = progress[-1] if progress else (0, limit)
    return {"events": events, "check_seconds": seconds, "verdict": f"stopped after {limit:.0f} s",
            "peak_mb": None}


def workload_turn_checker(events: list, trace: "WorkloadTrace", lines: list[str], fast: bool = True) -> dict:
    """One checker turn on a workload trace: the warm-up replayed untimed,
    then the timed batches' events fed one by one and timed; reading the
    timed lines (JSON and schema) timed apart."""
    from flightcheck.verification.traces import check
    checker = (check.FastChecker if fast else check.IncrementalChecker)(events)
    warm = trace.warm_up_events
    for event in events[1:warm]:
        checker.feed(event)
    gc.collect()
    gc.freeze()                           # as both schedulers' sides do after their warm-up
    warm_fast = getattr(checker, "fast_events", 0)
    try:
        started = time.perf_counter()
        for event in events[warm:]:
            checker.feed(event)
        fed = time.perf_counter() - started
        taken = getattr(checker, "fast_events", 0) - warm_fast     # timed events on the fast path
        started = time.perf_counter()
        check.read_events(lines[:1] + lines[warm:])
        read = time.perf_counter() - started
    finally:
        gc.unfreeze()
    del checker
    gc.collect()
    return {"check_s": fed, "read_s": read, "fast_events": taken}


def workload_row(case: str, batches: int, turns: int, vllm, fast: bool = True) -> dict:
    """One workload: its trace, then `turns` turns of vLLM and the checker."""
    from workload_traces import write_workload_trace
    from flightcheck.verification.traces import check
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{case}.jsonl"
        with open(path, "w", buffering=1 << 20) as sink:
            trace = write_workload_trace(case, batches, sink)
        lines = path.read_text().splitlines()
    events = check.read_events(lines)
    check.validate_events(events)
    vllm.ask({"start": case, "seed": 0})
    checker_turns, vllm_turns = [], []
    try:
        for turn in range(turns):
            for side in (("vllm", "checker") if turn % 2 == 0 else ("checker", "vllm")):
                if side == "vllm":
                    records = vllm.ask({"batches": batches})["records"]
                    vllm_turns.append(sum(r[0] + r[1] for r in records) / 1e9)
                else:
                    checker_turns.append(workload_turn_checker(events, trace, lines, fast))
    finally:
        vllm.ask({"stop": True})
    ratios = [c["check_s"] / v for c, v in zip(checker_turns, vllm_turns)]
    with_reading = [(c["check_s"] + c["read_s"]) / v for c, v in zip(checker_turns, vllm_turns)]
    per_batch = 1e6 / batches
    return {"workload": case, "checker_over_vllm": round(statistics.median(ratios), 3),
            "with_reading_over_vllm": round(statistics.median(with_reading), 3),
            "checker_us_per_batch": round(statistics.median(c["check_s"] for c in checker_turns) * per_batch),
            "reading_us_per_batch": round(statistics.median(c["read_s"] for c in checker_turns) * per_batch),
            "vllm_us_per_batch": round(statistics.median(vllm_turns) * per_batch),
            "ratios": [round(r, 3) for r in ratios], "batches": batches, "turns": turns,
            "trace_events": trace.events, "timed_events": trace.events - trace.warm_up_events,
            "checker": "fast" if fast else "incremental",
            "fast_path_events": checker_turns[0]["fast_events"]}


def workloads(args: argparse.Namespace) -> int:
    """The default mode: each workload against vLLM 0.8.5 (module docstring)."""
    from scheduler_cost import VLLM_VERSION, VllmSide
    from flightcheck.vllm.replay import missing_venv_message, venv_python
    if not venv_python(VLLM_VERSION).exists():
        print(f"error: {missing_venv_message(VLLM_VERSION)}", file=sys.stderr)
        return 2
    # decode-4096's pool has 2^20 blocks (the cost benchmark's: room for every
    # request at max_model_len), check-trace's bound (schema.MAX_POOL_BLOCKS);
    # the rows say both (`pool_bound`: equal now; it was raised here when the bound was 2^18)
    from flightcheck.verification.traces import configuration
    bound = configuration.MAX_POOL_BLOCKS
    load_before = os.getloadavg()
    started = time.perf_counter()
    vllm = VllmSide()
    rows = []
    try:
        for case in args.cases:
            rows.append(workload_row(case, args.batches, args.turns, vllm, not args.no_fast))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        vllm.close()
    machine = {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
               "load_after": [round(x, 2) for x in os.getloadavg()],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "seconds": round(time.perf_counter() - started),
               "pool_bound": {"check_trace": bound, "here": configuration.MAX_POOL_BLOCKS}}
    if args.json:
        print(json.dumps([{**row, "machine": machine} for row in rows], indent=1))
        return 0
    print(f"{machine['date']}, {machine['cpus']} CPUs, load {machine['load_before']} -> "
          f"{machine['load_after']}, {machine['seconds']} s; {args.batches} batches x {args.turns} turns")
    print("| workload | checker µs/batch | reading µs/batch | vLLM 0.8.5 µs/batch | checker / vLLM "
          "(median of turns) | with reading |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['checker_us_per_batch']:,} | {r['reading_us_per_batch']:,} | "
              f"{r['vllm_us_per_batch']:,} | {r['checker_over_vllm']} | {r['with_reading_over_vllm']} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="workloads: print a JSON list, one object each")
    parser.add_argument("--cases", nargs="+", default=["decode-256", "decode-1024", "decode-4096",
                                                       "prefill-mix"])
    parser.add_argument("--batches", type=int, default=100, help="workloads: timed batches per turn")
    parser.add_argument("--turns", type=int, default=3, help="workloads: turns per side")
    parser.add_argument("--no-fast", action="store_true",
                        help="workloads: the incremental checker without the fast path (fast.py)")
    parser.add_argument("--sizes", type=int, nargs="+", help="long traces of these concurrencies instead")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--old", type=Path, help="a tree with the checker to compare against")
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds per checker run")
    parser.add_argument("--checkers", nargs="+", default=["incremental", "old"],
                        choices=["incremental", "full", "old"])
    args = parser.parse_args()
    if args.sizes is None:
        return workloads(args)
    long_traces(args)
    return 0


def long_traces(args: argparse.Namespace) -> None:
    """The long-trace mode (--sizes): see the module docstring."""
    from long_traces import write_long_trace

    tree = HERE.parent
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = Path(tmp) / f"long-{size}.jsonl"
            with open(path, "w", buffering=1 << 20) as sink:
                trace = write_long_trace(sink, size, args.events)
            print(f"N={size}: {trace.events} events, {trace.arrivals} arrivals, scheduler "
                  f"{trace.scheduler_seconds:.1f} s ({trace.events / trace.scheduler_seconds:.0f} events/s)",
                  flush=True)
            for name in args.checkers:
                if name == "old" and args.old is None:
                    continue
                where = args.old if name == "old" else tree
                mode = "full" if name == "full" else "default"
                result = run_checker(where, path, mode, args.limit)
                rate = result["events"] / result["check_seconds"] if result["check_seconds"] else 0.0
                ratio = (trace.events / rate) / trace.scheduler_seconds if rate else float("inf")
                row = {"concurrency": size, "checker": name, "trace_events": trace.events, **result,
                       "events_per_s": round(rate, 1), "peak_mb": result["peak_mb"] and round(result["peak_mb"]),
                       "ratio_to_scheduler": round(ratio, 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nmachine: {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'N':>6} {'checker':>12} {'events/s':>10} {'peak MB':>8} {'checker/scheduler':>18}  verdict")
    for row in rows:
        print(f"{row['concurrency']:>6} {row['checker']:>12} {row['events_per_s']:>10} "
              f"{str(row['peak_mb']):>8} {row['ratio_to_scheduler']:>18}  {row['verdict']}")


if __name__ == "__main__":
    sys.exit(main())

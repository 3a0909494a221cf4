"""check-trace on long reference traces: events per second, peak memory, and
the ratio of the checker's time to the time the reference scheduler spent
scheduling the same trace; optionally against an older checker.

For each concurrency N (requests alive at once) it writes a trace of at least
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

Usage: python benchmarks/check_trace_speed.py [--sizes 100 1000 4000]
           [--events 1000000] [--old DIR] [--limit SECONDS] [--checkers incremental full old]
"""

from __future__ import annotations

import argparse
import json
import os
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
else:
    from flightcheck.verification.traces.check import IncrementalChecker
    checker = IncrementalChecker(events)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--old", type=Path, help="a tree with the checker to compare against")
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds per checker run")
    parser.add_argument("--checkers", nargs="+", default=["incremental", "old"],
                        choices=["incremental", "full", "old"])
    args = parser.parse_args()
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
    main()

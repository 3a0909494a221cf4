"""check-trace's peak memory on a long trace: the streaming checker's memory
is bounded by the live state (requests, blocks and batches in flight, plus
one entry per request id seen), not by the number of events.

It writes a trace of at least --events events with benchmarks/long_traces.py
(about --concurrency requests alive at once; the trace goes to --trace, by
default a file under /tmp, and is reused if it is there: never commit it),
then runs `flightcheck check-trace` on it in a child process (reading it from
standard input with --stdin) and prints one JSON object: the events, the
seconds the check took, its peak resident memory (the child's ru_maxrss) and
its exit code. --lines N checks only the first N lines (a prefix, through a
pipe), for a quicker measurement.

Usage: python benchmarks/check_trace_memory.py [--events 1000000] [--concurrency 100]
           [--trace PATH] [--lines N] [--stdin] [--limit SECONDS]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def write_trace(path: Path, events: int, concurrency: int) -> None:
    from long_traces import write_long_trace

    started = time.perf_counter()
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as sink:
        written = write_long_trace(sink, concurrency, events)
    partial.rename(path)
    print(f"wrote {written.events} events ({written.arrivals} arrivals) to {path} in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


def check(path: Path, lines: int | None, stdin: bool, limit: float) -> dict:
    """Run check-trace in a child; its time, peak memory and exit code."""
    command = [sys.executable, "-m", "flightcheck.cli", "check-trace"]
    started = time.perf_counter()
    if lines is not None:
        head = subprocess.Popen(["head", "-n", str(lines), str(path)], stdout=subprocess.PIPE)
        proc = subprocess.run(command + ["-"], stdin=head.stdout, capture_output=True, text=True, timeout=limit)
        head.wait()
    elif stdin:
        with path.open("rb") as source:
            proc = subprocess.run(command + ["-"], stdin=source, capture_output=True, text=True, timeout=limit)
    else:
        proc = subprocess.run(command + [str(path)], capture_output=True, text=True, timeout=limit)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss      # KiB on Linux
    verdict = proc.stdout.splitlines()[0] if proc.stdout else proc.stderr.strip()
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(peak_kib / 1024, 1), "exit": proc.returncode,
            "verdict": verdict[:300]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--lines", type=int, default=None, help="check only the first N lines")
    parser.add_argument("--stdin", action="store_true", help="feed the trace on standard input")
    parser.add_argument("--limit", type=float, default=3600.0, help="stop the check after this many seconds")
    args = parser.parse_args()
    path = args.trace or Path(f"/tmp/flightcheck-memory-{args.events}-{args.concurrency}.jsonl")
    if not path.exists():
        write_trace(path, args.events, args.concurrency)
    with path.open("rb") as f:
        total = sum(1 for _ in f)
    result = {"trace": str(path), "lines": total if args.lines is None else min(total, args.lines),
              "concurrency": args.concurrency, **check(path, args.lines, args.stdin, args.limit)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

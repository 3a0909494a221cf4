"""check-trace's peak memory on a long trace: the streaming checker's memory
is bounded by the live state (requests, blocks and batches in flight, plus
one entry per request id seen), not by the number of events.

It writes a trace of at least --events events with benchmarks/long_traces.py
(about --concurrency requests alive at once; the trace goes to --trace, by
default a file under /tmp, and is reused if it is there: never commit it),
then checks it in a child process with check-trace's streaming checker
(verification/traces/stream.py, from the file as `check-trace FILE` reads
it) and prints one JSON object: the lines, the seconds the check took, its
peak resident memory (the child's ru_maxrss), its exit code and verdict,
and its progress (events, seconds, peak MiB every 100,000 events). A check
that runs past --limit seconds is stopped; `events_checked` says how far it
got. --lines N checks only the first N lines (a prefix, through a pipe).

Usage: python benchmarks/check_trace_memory.py [--events 1000000] [--concurrency 100]
           [--trace PATH] [--lines N] [--limit SECONDS]
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


# The child: check-trace's streaming check (what the command runs) on the
# trace at argv[1] ("-": standard input), with a progress line
# "<events> <seconds> <peak RSS MiB>" on stderr every 10,000 events, and
# the verdict line on stdout.
CHILD = r"""
import resource, sys, time
from flightcheck.verification.traces.stream import check_lines, open_lines
started = time.perf_counter()
def progress(done, live):
    if done % 10000 == 0:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(done, round(time.perf_counter() - started, 1), round(peak, 1), live, file=sys.stderr, flush=True)
with open_lines(sys.argv[1]) as lines:
    for verdict in check_lines(lines, on_progress=progress):
        pass
r = verdict.result
print(verdict.malformed if r is None else f"ok={r.ok} events={r.events} property={r.property} line={r.line}")
sys.exit(verdict.exit_code)
"""


def check(path: Path, lines: int | None, limit: float) -> dict:
    """Check the trace in a child; its time, peak memory, exit code, and how
    far it got (its last progress line) if it ran past `limit`."""
    command = [sys.executable, "-c", CHILD]
    started = time.perf_counter()
    head = None
    if lines is not None:
        head = subprocess.Popen(["head", "-n", str(lines), str(path)], stdout=subprocess.PIPE)
        child = subprocess.Popen(command + ["-"], stdin=head.stdout, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    else:
        child = subprocess.Popen(command + [str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
        stdout = f"stopped after {limit:g} s (--limit)"
    if head is not None:
        head.kill()
        head.wait()
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss      # KiB on Linux
    progress = [line.split() for line in stderr.splitlines() if line[:1].isdigit()]
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(peak_kib / 1024, 1), "exit": child.returncode,
            "verdict": stdout.strip()[:300] or stderr.strip()[-300:],
            "events_checked": int(progress[-1][0]) if progress else None,
            "progress": [[int(p[0]), float(p[1]), float(p[2])] for p in progress[::10]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--lines", type=int, default=None, help="check only the first N lines")
    parser.add_argument("--limit", type=float, default=3600.0, help="stop the check after this many seconds")
    args = parser.parse_args()
    path = args.trace or Path(f"/tmp/flightcheck-memory-{args.events}-{args.concurrency}.jsonl")
    if not path.exists():
        write_trace(path, args.events, args.concurrency)
    with path.open("rb") as f:
        total = sum(1 for _ in f)
    result = {"trace": str(path), "lines": total if args.lines is None else min(total, args.lines),
              "concurrency": args.concurrency, **check(path, args.lines, args.limit)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

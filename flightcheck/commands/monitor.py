"""`flightcheck monitor SINK...`: check running schedulers' traces as they
are written, one stream per sink (flightcheck/vllm/sinks.py, "Streaming the
trace" in flightcheck/vllm/README.md).

    flightcheck monitor unix:/run/fc/engine0.sock unix:/run/fc/engine1.sock
    flightcheck monitor fifo:/tmp/trace.fifo --keep-going
    flightcheck monitor file:/var/log/trace.jsonl --idle 60

Each sink (`file:PATH` followed as `tail -f`, `fifo:PATH`, `unix:PATH`
listened on; a bare path is a file) is checked by its own process, since a
data-parallel deployment runs one scheduler, hence one stream, per engine,
and the streams share nothing. Every verdict is printed as it is found, one
line, prefixed by its sink; one summary follows at the end. The monitor ends
when every stream has ended (its `end` event, its writer closed the FIFO or
socket, or its verdict was given), on SIGINT or SIGTERM (with the verdicts
so far; a second Ctrl-C is the usual one: exit 130), or after `--idle
SECONDS` without a byte on a stream.

Exit codes: 0 every stream legal; 1 a violation on some stream; 2 bad
arguments, or a stream that is not a trace, cannot be read or never had a
writer; 3 an internal error (a bug of ours); 4 no violation, but some
stream's verdict is partial: its recorder dropped events (a `dropped`
marker), and nothing after the marker was judged. Where streams differ,
1 wins over 3, 3 over 2, 2 over 4.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flightcheck.spec.profiles import PROFILES

from .common import bad, internal_error, real

JOIN_SECONDS = 5.0


def add_parser(sub) -> None:
    monitor = sub.add_parser("monitor", help="check running schedulers' trace streams as they are written")
    monitor.add_argument("sinks", nargs="+", metavar="SINK",
                         help="file:PATH (followed), fifo:PATH or unix:PATH (listened on); a bare path is a file")
    monitor.add_argument("--profile", metavar="NAME",
                         help=f"check under this version profile (default: each trace's own; {', '.join(PROFILES)})")
    monitor.add_argument("--keep-going", action="store_true",
                         help="report every violation and carry on from the trace's state")
    monitor.add_argument("--idle", type=real(0, allow_inf=True), metavar="SECONDS",
                         help="end a stream after this many seconds without a byte (default: never)")
    monitor.add_argument("--json", action="store_true",
                         help="print the summary as JSON on stdout (the verdicts as they come go to stderr)")
    monitor.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flightcheck.vllm.sinks import parse_sink

    if args.profile is not None and args.profile not in PROFILES:
        return bad(f"unknown --profile {args.profile!r}; known: {', '.join(PROFILES)}")
    if args.idle is not None and args.idle <= 0:
        return bad(f"--idle: expected a number of seconds above 0, got {args.idle}")
    try:
        addresses = [parse_sink(text) for text in args.sinks]
    except ValueError as err:
        return bad(str(err))
    if len({a.path for a in addresses}) < len(addresses):
        return bad("a sink is named twice: each stream needs its own path")
    try:
        outcomes = _monitor(addresses, args)
    except Exception as err:                  # not a verdict: say it is ours and where to look
        message, code = internal_error(err, "monitor")
        return code
    return _summarise(outcomes, args.json)


def _monitor(addresses: list[Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One process per sink; their lines printed as they come; their outcomes."""
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    messages = context.Queue()
    stop = context.Event()
    options = {"profile": args.profile, "keep_going": args.keep_going, "idle": args.idle}
    workers = [context.Process(target=_worker, args=(address, options, messages, stop), daemon=True)
               for address in addresses]
    with _signals_end_the_streams(stop):
        return _gather(addresses, workers, messages, args.json)


def _gather(addresses: list[Any], workers: list[Any], messages: Any, as_json: bool) -> list[dict[str, Any]]:
    """Start the workers; print their lines as they come; their outcomes, in the sinks' order."""
    try:
        for worker in workers:
            worker.start()
        outcomes: dict[str, dict[str, Any]] = {}
        while len(outcomes) < len(workers):
            try:
                sink, kind, payload = messages.get(timeout=0.2)
            except queue.Empty:
                if not any(w.is_alive() for w in workers) and messages.empty():
                    break
                continue
            if kind == "line":                 # with --json, stdout holds the summary alone
                print(f"{sink}: {payload}", file=sys.stderr if as_json else sys.stdout, flush=True)
            else:
                outcomes[sink] = payload
    finally:
        for worker in workers:
            worker.join(JOIN_SECONDS)
    return [outcomes.get(str(a)) or {"sink": str(a), "status": "internal error",
                                     "message": "its process died without a verdict"} for a in addresses]


@contextmanager
def _signals_end_the_streams(stop: Any) -> Iterator[None]:
    """The first SIGINT or SIGTERM ends every stream with its verdict so far
    (`stop`); a second SIGINT is the command-wide Ctrl-C (interrupts.py: its
    workers killed, one line, exit 130). While this handler is set,
    interrupts.py's watcher leaves the first one to it."""
    def first(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and stop.is_set():  # again: hand it to interrupts.py, as a Ctrl-C
            signal.signal(signal.SIGINT, previous[signal.SIGINT])
            os.kill(os.getpid(), signal.SIGINT)
            return
        stop.set()

    previous = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        stop.set()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _worker(address: Any, options: dict[str, Any], messages: Any, stop: Any) -> None:
    """One stream, in its own process (the parent handles the signals)."""
    from flightcheck.verification.traces.line_reader import Follow

    from .monitor_watch import StreamOutcome, watch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sink = str(address)

    def emit(text: str) -> None:
        messages.put((sink, "line", text))

    try:
        outcome = watch(address, Follow(stop=stop.is_set, idle=options["idle"]), emit,
                        profile=options["profile"], keep_going=options["keep_going"], signalled=stop.is_set)
    except Exception as err:                  # MalformedTrace (a source that cannot be read) or a bug
        from flightcheck.verification.traces.reading import MalformedTrace

        status = "malformed" if isinstance(err, MalformedTrace) else "internal error"
        message = str(err) if status == "malformed" else internal_error(err, "monitor")[0]
        outcome = StreamOutcome(sink, status=status, message=message)
        emit(outcome.describe())
    messages.put((sink, "outcome", outcome.to_json()))


def _summarise(outcomes: list[dict[str, Any]], as_json: bool) -> int:
    from .monitor_watch import EXIT_CODES, PRECEDENCE, StreamOutcome

    statuses = [o["status"] for o in outcomes]
    worst = next(status for status in PRECEDENCE if status in statuses or status == "legal")
    code = EXIT_CODES[worst]
    if as_json:
        print(json.dumps({"ok": code == 0, "exit": code, "streams": outcomes}, indent=1))
        return code
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in reversed(PRECEDENCE) if s in statuses)
    print(f"summary: {len(outcomes)} stream{'s' if len(outcomes) != 1 else ''}: {counts}")
    for outcome in outcomes:
        print(f"  {outcome['sink']}: {StreamOutcome(**outcome).describe()}")
    return code

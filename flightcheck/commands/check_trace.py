"""`flightcheck check-trace FILE`: replay a trace against the spec, as it is read.
(Several files, or a directory: check_trace_many.py, each trace a task.)

The trace is checked under the spec's version profile its config event
selects (`vllm_version`; explicit keys override), or under `--profile NAME`.
FILE is a file, `-` (standard input) or a FIFO; it is read line by line and
each event is checked as it is read (verification/traces/stream.py), so a
violation is reported the moment its event is read. `--follow` watches a
file another process is still writing, as `tail -f`: it ends at the `end`
event, after `--idle SECONDS` without a new line, or on SIGINT/SIGTERM, with
the verdict on what it read so far. `--keep-going` reports every violation
and carries on (stream.py says from which state).

Every position it prints is the line of the file (1-based, blank lines
counted), for a violation as for a malformed line; requests are named by the
trace's own ids.

Exit codes: 0 legal, 1 a violation (the scheduler broke a property), 2 the
file is malformed (one line naming the line, the field and what was expected;
for a last line no newline ends, that the write was cut short; how many events
before the line were checked without a violation; a compressed file by its
format), or names a vLLM version no profile covers and no `--profile` was given,
3 an unexpected exception inside flightcheck: a bug of ours, never a verdict
on the trace, reported in one line with the path of the saved traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from flightcheck.spec.profiles import PROFILES

from flightcheck.verification import executors

from .common import bad, internal_error, positive_int, real


def add_parser(sub) -> None:
    check = sub.add_parser("check-trace", help="replay a trace file (or many) against the spec")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a JSON Lines trace (docs/trace-format.md); - reads standard input; several "
                            "files or a directory (its *.jsonl) are checked as tasks of --executor")
    check.add_argument("--profile", metavar="NAME",
                       help="check under this version profile (default: the one the trace's vllm_version "
                            f"selects; {', '.join(PROFILES)})")
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.add_argument("--full", action="store_true",
                       help="re-check every property of the whole state after every event (slow on "
                            "long traces; the same verdict as the default, which checks what each "
                            "event touches)")
    check.add_argument("--follow", action="store_true",
                       help="wait for more lines at the end of the file, as tail -f; stop at the end "
                            "event, after --idle seconds without a new line, or on SIGINT/SIGTERM")
    check.add_argument("--idle", type=real(0, allow_inf=True), metavar="SECONDS",
                       help="with --follow: stop after this many seconds without a new line")
    check.add_argument("--keep-going", action="store_true",
                       help="report every violation and carry on, instead of stopping at the first")
    check.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, metavar="N",
                       help="processes for several traces with the local executor (default: one per core)")
    executors.add_options(check)
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if len(args.files) > 1 or os.path.isdir(args.files[0]):
            from .check_trace_many import run_many      # the checker loads only when a trace is checked
            return run_many(args)
        args.file = args.files[0]
        if args.executor != "local" or args.ray_address:
            return bad("--executor and --ray-address run several traces: one trace is checked here")
        return _check(args)
    except Exception as err:                  # not a verdict: say it is ours and where to look
        message, code = internal_error(err, "check-trace")
        if args.json:
            print(json.dumps({"ok": False, "internal_error": message}))
        return code


def _check(args: argparse.Namespace) -> int:
    from flightcheck.verification.traces.stream import Follow, MalformedTrace, check_lines, open_lines

    if args.profile is not None and args.profile not in PROFILES:
        return bad(f"unknown --profile {args.profile!r}; known: {', '.join(PROFILES)}")
    if args.idle is not None and (not args.follow or not args.idle >= 0):
        return bad("--idle takes a number of seconds (0 or more), with --follow")
    name = "<stdin>" if args.file == "-" else args.file
    stop = _Stop()
    follow = Follow(stop=stop, idle=args.idle) if args.follow else None
    try:
        lines = open_lines(args.file, follow)
    except MalformedTrace as err:
        return _malformed(args, name, str(err))
    watching = sys.stderr.isatty()                 # a person is watching: show how far it got
    with lines, (stop.on_signals() if args.follow else nullcontext()), \
            (_progress_line() if watching else nullcontext()) as progress:
        for verdict in check_lines(lines, args.profile, keep_going=args.keep_going, full=args.full,
                                   on_progress=progress):
            if verdict.result is None:
                return _malformed(args, name, verdict.malformed_report(), verdict.checked_before)
            stopped = stop.why(verdict.result.events, lines.waited_out) if verdict.final else ""
            _print(args, name, verdict, stopped)
    return verdict.exit_code


def _malformed(args: argparse.Namespace, name: str, message: str, checked_before: int = 0) -> int:
    if args.json:
        print(json.dumps({"ok": False, "malformed": message}
                         | ({"events_checked_before": checked_before} if checked_before else {})))
    return bad(f"{name}: {message}")


def _print(args: argparse.Namespace, name: str, verdict, stopped: str) -> None:
    """A violation (as found, or the final one) or the final verdict."""
    result = verdict.result
    if args.json:
        fields = result.to_json() | ({"violations": verdict.violations} if args.keep_going else {}) \
            | ({"stopped": stopped.strip(" ()")} if stopped else {})
        print(json.dumps(fields) if args.keep_going else json.dumps(fields, indent=1), flush=True)
        return
    if verdict.final and args.keep_going and verdict.violations:
        print(f"{name}: {verdict.violations} violations ({result.events} events, profile {result.profile})"
              f"{stopped}")
    elif result.ok:
        print(f"{name}: legal ({result.events} events, profile {result.profile}){stopped}")
    else:
        print(f"{name}: line {result.line} ({result.event} event) violates {result.property}: "
              f"{result.message}{stopped}")
        print(f"state before line {result.line}: {result.state_before}")
        print(f"profile: {result.profile}")
    if verdict.final:
        for item in result.unchecked:
            print(f"not checked: {item}")
    sys.stdout.flush()


class _Stop:
    """What stops a follower: SIGINT or SIGTERM (noted, not raised, so the
    event being checked is finished and the verdict so far printed)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self) -> bool:
        return self.signal is not None

    @contextmanager
    def on_signals(self) -> Iterator[None]:
        def note(number: int, frame: object) -> None:
            self.signal = signal.Signals(number).name

        old = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    def why(self, events: int, idle: float | None) -> str:
        """Why the check stopped before the end of the trace, if it did."""
        if self.signal is not None:
            return f" (stopped by {self.signal} after {events} events)"
        if idle is not None:
            return f" (stopped after {idle:g} s without a new line, after {events} events)"
        return ""


@contextmanager
def _progress_line() -> Iterator[Callable[[int, int], None]]:
    """One live line on stderr: events checked, events/s, requests alive."""
    import time

    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("checking: {task.completed:,.0f} events, {task.fields[rate]} events/s, "
                             "{task.fields[live]} live requests"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("check", total=None, live=0, rate="?")
        started = time.monotonic()

        def update(done: int, live: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-9)
            bar.update(task, completed=done, live=live, rate=f"{rate:,.0f}")

        yield update

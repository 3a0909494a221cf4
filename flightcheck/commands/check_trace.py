"""`flightcheck check-trace FILE`: replay a trace against the spec.

The trace is checked under the spec's version profile its config event
selects (`vllm_version`; explicit keys override), or under `--profile NAME`.

Every position it prints is the line of the file (1-based, blank lines
counted), for a violation as for a malformed line; requests are named by the
trace's own ids.

Exit codes: 0 legal, 1 a violation (the scheduler broke a property), 2 the
file is malformed (one line naming the line, the field and what was expected),
or names a vLLM version no profile covers and no `--profile` was given,
3 an unexpected exception inside flightcheck: a bug of ours, never a verdict
on the trace, reported in one line with the path of the saved traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flightcheck.spec.profiles import PROFILES

from .common import bad, internal_error


def add_parser(sub) -> None:
    check = sub.add_parser("check-trace", help="replay a trace file against the spec")
    check.add_argument("file", help="a JSON Lines trace (docs/trace-format.md)")
    check.add_argument("--profile", metavar="NAME",
                       help="check under this version profile (default: the one the trace's vllm_version "
                            f"selects; {', '.join(PROFILES)})")
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.add_argument("--full", action="store_true",
                       help="re-check every property of the whole state after every event (slow on "
                            "long traces; the same verdict as the default, which checks what each "
                            "event touches)")
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _check(args)
    except Exception as err:                  # not a verdict: say it is ours and where to look
        message, code = internal_error(err, "check-trace")
        if args.json:
            print(json.dumps({"ok": False, "internal_error": message}))
        return code


def _check(args: argparse.Namespace) -> int:
    from flightcheck.verification.traces.check import MalformedTrace, check_trace

    if args.profile is not None and args.profile not in PROFILES:
        return bad(f"unknown --profile {args.profile!r}; known: {', '.join(PROFILES)}")
    options = {"full": True} if args.full else {}
    try:
        if sys.stderr.isatty():                    # a person is watching: show how far it got
            with _progress_bar() as progress:
                result = check_trace(args.file, args.profile, progress=progress, **options)
        else:
            result = check_trace(args.file, args.profile, **options)
    except MalformedTrace as err:
        if args.json:
            print(json.dumps({"ok": False, "malformed": str(err)}))
        return bad(f"{args.file}: {err}")
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    elif result.ok:
        print(f"{args.file}: legal ({result.events} events, profile {result.profile})")
    else:
        print(f"{args.file}: line {result.line} ({result.event} event) violates {result.property}: "
              f"{result.message}")
        print(f"state before line {result.line}: {result.state_before}")
        print(f"profile: {result.profile}")
    if not args.json:
        for item in result.unchecked:
            print(f"not checked: {item}")
    return 0 if result.ok else 1


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr, fed `(events done, events in all)`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("check", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update

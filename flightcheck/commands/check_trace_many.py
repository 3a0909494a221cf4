"""`flightcheck check-trace FILE FILE ... | DIR`: many traces, each a task on
the executor (`--executor local|ray`, `--jobs N`; verification/executors),
checked by the same streaming checker as one file (verification/traces/many.py).

Each trace's verdict is printed as the one-file check prints it, in the
order the traces were named (a directory's `*.jsonl` by name), whatever
order the tasks finish in; progress goes to stderr as they finish. A file
that is not a trace (or cannot be read) is reported on its line and the
others are still checked.

Exit codes: 0 every trace legal, 1 some trace violates a property, 2 some
file is not a trace (this wins over 1: the campaign did not check all it
was given), 3 a bug of ours.

--json prints one object: `executor`, `tasks`, `retried`, `seconds`, the
counts `legal`, `violated` and `malformed` (lists of files), and `traces`,
one per file in the order named: `file`, `exit`, and either `malformed` or
`result` (the one-file check's JSON) with `violations`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from flightcheck.verification import executors
from flightcheck.verification.traces.many import check_one, trace_files, worst_exit

from .common import bad


def refused(args: argparse.Namespace) -> str | None:
    """Why these options cannot check many traces, in one line; None if they can."""
    if "-" in args.files:
        return "standard input (-) is checked alone: name files or directories to check several"
    if args.follow:
        return "--follow watches one growing file: name one file"
    return executors.configure_from(args)


def run_many(args: argparse.Namespace) -> int:
    problem = refused(args)
    if problem:
        return bad(problem)
    try:
        files = trace_files(args.files)
    except ValueError as err:
        return bad(str(err))
    tasks = [executors.Task((index,), check_one, (path, args.profile, args.full, args.keep_going), path)
             for index, path in enumerate(files)]
    before, started = executors.counts(), time.perf_counter()
    try:
        rows = executors.run_tasks(tasks, min(args.jobs, len(tasks)),
                                   executors.progress_printer("flightcheck check-trace"))
    except (executors.ExecutorUnavailable, executors.TaskLost) as err:
        return bad(str(err))
    report = {**executors.ran_since(before), "seconds": round(time.perf_counter() - started, 3),
              **_tally(rows), "traces": rows}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for row in rows:
            print("\n".join(_lines(row, args.keep_going)))
        print(f"{len(rows)} traces on the {report['executor']} executor in {report['seconds']:.1f} s: "
              f"{report['legal']} legal, {len(report['violated'])} with a violation, "
              f"{len(report['malformed'])} not a trace"
              + (f"; {report['retried']} tasks run again after their worker was lost" if report["retried"] else ""))
    return worst_exit(rows)


def _tally(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"legal": sum(row["exit"] == 0 for row in rows),
            "violated": [row["file"] for row in rows if row["exit"] == 1],
            "malformed": [row["file"] for row in rows if row["exit"] == 2]}


def _lines(row: dict[str, Any], keep_going: bool) -> list[str]:
    """One trace's verdict, worded as the one-file check words it."""
    name = row["file"]
    if "malformed" in row:
        return [f"{name}: not a trace: {row['malformed']}"]
    result = row["result"]
    if keep_going and row["violations"]:
        lines = [f"{name}: {row['violations']} violations ({result['events']} events, profile {result['profile']})"]
    elif result["ok"]:
        lines = [f"{name}: legal ({result['events']} events, profile {result['profile']})"]
    else:
        lines = [f"{name}: line {result['line']} ({result['event']} event) violates {result['property']}: "
                 f"{result['message']}",
                 f"state before line {result['line']}: {result['state_before']}",
                 f"profile: {result['profile']}"]
    return lines + [f"not checked: {item}" for item in result["unchecked"]]

"""Many traces checked as independent tasks: one task per trace file on the
configured executor (verification/executors), for `flightcheck check-trace`
given several files or a directory.

Each task reads its file line by line (stream.py, the same checker as for one
file) and returns the final verdict as plain data, so it crosses a process or
a Ray cluster as it is: the JSON the one-file check prints, the exit code it
would give, how many violations `keep_going` counted, and the one-line reason
when the file is not a trace. A file that cannot be opened is such a reason,
not a failure of the campaign: every other trace is still checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .stream import MalformedTrace, check_lines, open_lines

TRACE_SUFFIX = ".jsonl"


def trace_files(paths: list[str]) -> list[str]:
    """The traces `paths` name, in the order given: a file as it is, a
    directory as its `*.jsonl` files (sorted by name, not recursive). Raises
    ValueError for a directory without one and for a path that is not there."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            inside = sorted(str(p) for p in Path(path).glob(f"*{TRACE_SUFFIX}") if p.is_file())
            if not inside:
                raise ValueError(f"{path}: a directory with no {TRACE_SUFFIX} trace in it")
            found += inside
        elif os.path.exists(path):
            found.append(path)
        else:
            raise ValueError(f"{path}: no such file or directory")
    return found


def check_one(path: str, profile: str | None, full: bool, keep_going: bool) -> dict[str, Any]:
    """The verdict on one trace file, as plain data: `file`, `exit` (0
    legal, 1 a violation, 2 not a trace), and either `malformed` (why it is
    not a trace) or `result` (CheckResult.to_json()) with `violations`."""
    try:
        lines = open_lines(path, None)
    except (MalformedTrace, OSError) as err:
        return {"file": path, "exit": 2, "malformed": str(err)}
    final = None
    with lines:
        for verdict in check_lines(lines, profile, keep_going=keep_going, full=full):
            if verdict.result is None:
                return {"file": path, "exit": 2, "malformed": verdict.malformed_report()}
            final = verdict
    assert final is not None and final.final            # check_lines always ends with the final verdict
    return {"file": path, "exit": final.exit_code, "violations": final.violations,
            "result": final.result.to_json()}


def worst_exit(rows: list[dict[str, Any]]) -> int:
    """The command's exit over many traces: 2 if any is not a trace, else 1
    if any has a violation, else 0."""
    return max((row["exit"] for row in rows), default=0)

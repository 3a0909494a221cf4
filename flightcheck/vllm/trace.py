"""The trace file a recorder writes: the JSON Lines format of docs/trace-format.md.

Standard library only, so that it can be read and tested without vLLM. One
`json` encoding per event, line-buffered: a deployment that dies mid-run
leaves every event before the crash on disk (a trace cut short is itself
evidence, and check-trace reads it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

TRACE_ENV = "FLIGHTCHECK_TRACE"          # where a recorder writes; unset: no trace


def trace_path_from_env() -> str | None:
    """The trace path a deployment set, with `{pid}` replaced, so that several
    engine processes (data parallel) can each write their own file."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return None
    return path.replace("{pid}", str(os.getpid()))


class TraceFile:
    """Writes events; `step` and (when `record_time`) `t` are stamped here."""

    def __init__(self, sink: TextIO, *, record_time: bool = True) -> None:
        self._sink = sink
        self._encode = json.JSONEncoder(separators=(",", ":")).encode
        self._start = time.monotonic()
        self.record_time = record_time

    @classmethod
    def open(cls, path: str, **kwargs: Any) -> "TraceFile":
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        return cls(open(path, "w", buffering=1), **kwargs)

    def write(self, event: dict[str, Any], step: int | None = None) -> None:
        self._sink.write(self._line(event, step))

    def _line(self, event: dict[str, Any], step: int | None) -> str:
        """The event's line, newline included, `step` and `t` stamped."""
        if step is not None:
            event["step"] = step
        if self.record_time:
            event["t"] = round(time.monotonic() - self._start, 6)
        return self._encode(event) + "\n"

    def close(self) -> None:
        self._sink.close()

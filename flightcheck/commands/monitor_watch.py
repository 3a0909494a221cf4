"""One stream of `flightcheck monitor`: a sink's lines through the streaming
checker (verification/traces/stream.py, `check_lines`), each verdict handed
on as it is found, and what became of the stream (`StreamOutcome`).

A recorder's `dropped` marker (docs/trace-format.md) ends the judging: the
checker stops at it (replay.py, `EventsDropped`), and the stream's verdict
is "holds up to the line before the marker", never "legal". The lines after
it are still read, to the stream's end, so the writer is not held up and
the count of events lost is complete.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from flightcheck.verification.traces.check import CheckResult
from flightcheck.verification.traces.line_reader import Follow, LineReader
from flightcheck.verification.traces.stream import Verdict, check_lines
from flightcheck.vllm.sinks import SinkAddress

from .monitor_sources import open_source

# The exit code of each status, and which one wins when several streams differ.
EXIT_CODES = {"legal": 0, "partial": 4, "no writer": 2, "malformed": 2, "internal error": 3, "violation": 1}
PRECEDENCE = ("violation", "internal error", "malformed", "no writer", "partial", "legal")


@dataclass
class StreamOutcome:
    """What `flightcheck monitor` says of one stream in its summary."""

    sink: str
    status: str = "legal"           # one of EXIT_CODES
    events: int = 0                 # events read and judged (up to the verdict)
    lines: int = 0                  # lines read in all
    ended_by: str = "end event"     # end event | writer closed | idle | signal | verdict
    line: int | None = None         # the first violation's line, or the marker's
    property: str | None = None
    message: str | None = None
    violations: int = 0
    dropped: int = 0                # events the recorder dropped (the markers' counts)
    profile: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        """The stream's line in the summary."""
        if self.status == "legal":
            unchecked = "" if self.ended_by == "end event" else "; no end event: liveness not checked"
            return f"legal ({self.events} events, profile {self.profile}; ended by {self.ended_by}{unchecked})"
        if self.status == "violation":
            more = f", {self.violations} in all" if self.violations > 1 else ""
            return f"violation: {self.property} at line {self.line}{more}"
        if self.status == "partial":
            return (f"verdict holds up to line {self.line - 1}; {self.dropped} events dropped after it "
                    f"(ended by {self.ended_by})")
        return f"{self.status}: {self.message}"


class Tap:
    """The source's lines as the checker reads them, counting them and
    noting the `dropped` markers and the `end` event on the way."""

    def __init__(self, reader: LineReader, on_first: Callable[[], None] = lambda: None) -> None:
        self.reader, self.on_first = reader, on_first
        self.number = 0
        self.marker_line: int | None = None      # the first marker's line
        self.dropped = 0
        self.saw_end = False
        self.last_line_at = time.monotonic()     # (or the start)

    def __iter__(self) -> Iterator[str]:
        return self._tapped(self.reader)

    def drain(self) -> Iterator[str]:
        """What a follower reads after the `end` event (line_reader.py)."""
        return self._tapped(self.reader.drain())

    def _tapped(self, lines: Iterator[str] | LineReader) -> Iterator[str]:
        for text in lines:
            self.number += 1
            self.last_line_at = time.monotonic()
            if self.number == 1:
                self.on_first()
            self._note(text)
            yield text

    def _note(self, text: str) -> None:
        if '"dropped"' not in text and '"end"' not in text:      # the cheap test first
            return
        try:
            event = json.loads(text)
        except ValueError:
            return                                  # the checker says what is wrong with it
        if not isinstance(event, dict):
            return
        if event.get("ev") == "dropped" and isinstance(event.get("count"), int):
            self.marker_line = self.marker_line or self.number
            self.dropped += event["count"]
        elif event.get("ev") == "end":
            self.saw_end = True


def watch(address: SinkAddress, follow: Follow, emit: Callable[[str], None], *, profile: str | None = None,
          keep_going: bool = False, signalled: Callable[[], bool] = lambda: False) -> StreamOutcome:
    """Check one stream to its end; `emit(text)` each verdict line as it is found."""
    outcome = StreamOutcome(str(address))
    with open_source(address, follow, ready=lambda what: emit(f"{what}; waiting for the writer")) as reader:
        if reader is None:
            outcome.status, outcome.ended_by = "no writer", "signal" if signalled() else "idle"
            outcome.message = f"no writer came (ended by {outcome.ended_by})"
            return outcome
        tap = Tap(reader, on_first=lambda: emit("the first line came"))
        final: Verdict | None = None
        first: CheckResult | None = None          # the first violation
        for verdict in check_lines(tap, profile, keep_going=keep_going):
            if verdict.result is not None and not verdict.result.ok and (not verdict.final or not keep_going):
                _emit_violation(verdict.result, emit)
                first = first or verdict.result
            final = verdict if verdict.final else final
        assert final is not None
        _judge(outcome, final, tap, first)
        if tap.marker_line is not None and not tap.saw_end:
            for _ in tap:                        # count what is still lost, to the stream's end
                if tap.saw_end:
                    break
            outcome.dropped = tap.dropped
        outcome.lines = tap.number
        outcome.ended_by = _ending(outcome, tap, follow, signalled, keep_going)
        if tap.number == 0:                      # a FIFO or file that no one wrote to
            outcome.status, outcome.message = "no writer", f"nothing was written (ended by {outcome.ended_by})"
    emit(outcome.describe())
    return outcome


def _emit_violation(result: CheckResult, emit: Callable[[str], None]) -> None:
    emit(f"line {result.line} ({result.event} event) violates {result.property}: {result.message}")
    emit(f"state before line {result.line}: {result.state_before}")


def _judge(outcome: StreamOutcome, final: Verdict, tap: Tap, first: CheckResult | None) -> None:
    """The stream's status from the checker's final verdict (and the first
    violation it reported, which a verdict ended by a marker does not carry)."""
    outcome.violations, outcome.dropped = final.violations, tap.dropped
    result = final.result
    if result is None and tap.marker_line is not None and tap.marker_line == tap.number:
        outcome.status, outcome.line = "partial", tap.marker_line     # the checker stopped at the marker
        outcome.events = tap.number
        result = first
    if result is None:
        if outcome.status != "partial":
            outcome.status, outcome.message = "malformed", final.malformed
        return
    outcome.events, outcome.profile = result.events, result.profile
    if not result.ok or final.violations:
        outcome.status = "violation"
        outcome.line, outcome.property, outcome.message = result.line, result.property, result.message


def _ending(outcome: StreamOutcome, tap: Tap, follow: Follow, signalled: Callable[[], bool],
            keep_going: bool) -> str:
    """What ended the stream: its end event, the first violation (the
    checker stops there unless it keeps going), a signal, `idle`, or its
    writer closing the FIFO or socket."""
    if tap.saw_end:
        return "end event"
    if outcome.status == "violation" and not keep_going:
        return "verdict"
    if signalled():
        return "signal"
    if follow.idle is not None and time.monotonic() - tap.last_line_at >= follow.idle:
        return "idle"
    return "writer closed"

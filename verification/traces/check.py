"""Trace validation: replay a JSON Lines trace (docs/trace-format.md) against
the concrete spec and report the first event that is not a legal spec
transition or that breaks a property, with the state before it.

The work is split by idea: reading.py reads and validates the file (the
schema is schema.py), configuration.py builds the spec's configuration from
the config event (the version profile, its overrides, the pool cut to the
trace), replay.py replays the events on the spec (asynchronous.py: the async
profile's empty batches; connector.py: a KV connector's events), incremental.py checks only what each event
touches, and explain.py / named_state.py say in the trace's own names why the
spec schedules what it does and what the state was. This module ties them
together: `check_trace(path)` and `check_events(events)` give a CheckResult.

Every position a result or a message gives is the line of the file (1-based,
blank lines counted), as the format errors' are; `event_index` (0-based,
among the events) stays in the result for programs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flightcheck.spec.profiles import DEFAULT_PROFILE

from .fast import FastPath
from .configuration import ASYNC_PROFILES, UnknownVersion, config_from_event, modelled_pool, select_profile
from .incremental import Incremental
from .reading import (MalformedTrace, NumberedEvents, line_of, parse_line, read_events, read_trace_file,
                      validate_events)
from .replay import REASONS, TraceChecker, _Violation
from .step_inputs import another_input_follows, next_not_finish

# What callers import from here (the parts' names included, so that a caller
# needs one module): the entry points, the result, the errors, the parts.
__all__ = ["ASYNC_PROFILES", "CheckResult", "FastChecker", "IncrementalChecker", "MalformedTrace", "NumberedEvents",
           "PROGRESS_EVERY", "REASONS", "TraceChecker", "UnknownVersion", "check_events", "check_trace",
           "config_from_event", "modelled_pool", "parse_line", "read_events", "read_trace_file",
           "select_profile", "validate_events"]


@dataclass
class CheckResult:
    ok: bool
    events: int
    event_index: int | None = None       # 0-based index, among the events, of the first illegal one
    property: str | None = None
    message: str | None = None
    state_before: str | None = None
    unchecked: list[str] = field(default_factory=list)
    profile: str = DEFAULT_PROFILE       # the spec's version profile the trace was checked under
    line: int | None = None              # the 1-based line of the file it is on (blank lines counted)
    event: str | None = None             # its kind (`ev`)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "event_index": self.event_index,
                "property": self.property, "message": self.message,
                "state_before": self.state_before, "unchecked": self.unchecked,
                "profile": self.profile, "line": self.line, "event": self.event}


class IncrementalChecker(Incremental, TraceChecker):
    """The default checker: the full replay's verdict, checking only what each
    event touches (incremental.py)."""


class FastChecker(FastPath, IncrementalChecker):
    """The incremental checker with the fast path for the steady state of
    decoding (fast.py): the same verdicts, differential-tested."""


PROGRESS_EVERY = 1000


def check_events(events: list[dict[str, Any]], profile: str | None = None, full: bool = False,
                 progress: Callable[[int, int], None] | None = None, fast: bool = False) -> CheckResult:
    """Validate the events (MalformedTrace), then replay them on the spec under
    `profile` (None: the one the trace selects).

    By default only what each event touches is checked (incremental.py),
    with the same verdict; `full` re-checks every property of the whole state
    after every event, the definition the incremental checker is tested against;
    `fast` (not with `full`) adds fast.py's path for the steady state.
    `progress(done, total)` is called every PROGRESS_EVERY events. Lines are
    those `read_events` numbered, or event i on line i + 1 for a plain list."""
    validate_events(events)
    kind = TraceChecker if full else FastChecker if fast else IncrementalChecker
    checker = kind(events, profile)
    fast = isinstance(checker, FastPath)
    _annotate_finishes(events)
    for index, event in enumerate(events[1:], start=1):
        # states are immutable: describe it only if needed (the fast path's: the one it handed over)
        before = None if fast else checker.state
        checker.upcoming_finish = event.get("_finishes", {})
        checker.input_follows_in_step = another_input_follows(event, next_not_finish(events, index + 1))
        if progress is not None and index % PROGRESS_EVERY == 0:
            progress(index, len(events))
        try:
            checker.feed(event)
            checker.watch_lasso(event, line_of(events, index))     # L4 (lasso.py): every event, fast ones too
        except _Violation as v:
            return _rejected(events, index, v, checker, checker.last_before if fast else before)
    if checker.finished_now:
        r, status = next(iter(checker.finished_now.items()))
        missing = _Violation("missing_finish", f"{checker._name(r)} finished ({status.value}) but the trace "
                             "has no finish event")
        return _rejected(events, len(events) - 1, missing, checker, checker.state)
    if not checker.ended:
        checker.unchecked.add("liveness at the end (the trace has no end event)")
    checker._engine_steps_at_end()
    return CheckResult(True, len(events), unchecked=sorted(checker.unchecked), profile=checker.cfg.profile)


def _rejected(events: list[dict[str, Any]], index: int, violation: _Violation, checker: TraceChecker,
              before: Any) -> CheckResult:
    """The result for a violation at event `index`, with the state before it
    in the trace's request names."""
    return CheckResult(False, len(events), index, violation.prop, violation.message, checker.describe(before),
                       sorted(checker.unchecked), checker.cfg.profile, line=line_of(events, index),
                       event=events[index]["ev"])


def _annotate_finishes(events: list[dict[str, Any]]) -> None:
    """Give each complete event the finish reasons that follow it, for writers
    that name no stop tokens."""
    for i, event in enumerate(events):
        if event["ev"] != "complete":
            continue
        finishes = {}
        for later in events[i + 1:]:
            if later["ev"] != "finish":
                break
            finishes[later.get("req")] = later.get("reason")
        event["_finishes"] = finishes


def check_trace(path: str | Path, profile: str | None = None, full: bool = False,
                progress: Callable[[int, int], None] | None = None) -> CheckResult:
    """Check a trace file under `profile` (None: the one its config event
    selects), incrementally unless `full` (check_events). Raises MalformedTrace
    for a file not in the format, or naming a vLLM version no profile covers
    when `profile` is None."""
    return check_events(read_trace_file(path), profile, full=full, progress=progress)

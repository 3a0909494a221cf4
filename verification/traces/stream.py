"""The streaming trace checker: each line is read, validated and checked
before the next is read, so a violation is reported the moment its event is
read (with the state before it), a trace that never ends can be watched as it
is written, and memory is bounded by the live state, not by the trace.

`check_lines(lines, profile)` yields a `Verdict` per violation as it is found
(under `keep_going`), and a final one; `open_lines(path)` reads a file,
standard input (`-`), a FIFO or a growing file (`follow`) line by line
(line_reader.py). check.py's whole-trace `check_events` is the reference:
the verdict, property, line, event kind and message are the same on every
trace (tests/test_check_trace_stream.py runs every trace of the suite through both).

What the whole-trace checker computes by looking at the whole trace first,
this one computes as it goes:

* the request slots and the pool the spec state needs (`_num_slots`,
  `modelled_pool`): grown at the arrivals that need them (growth.py);
* the finish reasons that follow a complete event (`_annotate_finishes`),
  read by the checker only for requests whose trace names no stop token:
  a bounded lookahead. A complete event is held back only while a request of
  a batch in flight has no known stop tokens, and only until the first event
  after it that is not a finish, at most MAX_FINISH_LOOKAHEAD finishes (a
  legal trace has at most one per request of the completed batch).

What it keeps: the spec state (requests alive or in flight, their blocks,
the batches in flight), one entry per request id seen (id reuse is
detected by it) and a line counter. Not kept: the events, their line
numbers, the labels of prompts given without their token ids (a counter
numbers them), the content of prompt labels no block caches and no request
holds (`_CountedLabels`).

Where the streaming verdict can differ from the whole-trace one:
* `state_before` lists the free queue of the pool cut to the arrivals read
  so far (growth.py);
* a violation is reported even if a later line is malformed (the whole-trace
  reader refuses the file first), and `events` counts the events read up to
  the verdict;
* a pool too large to model is refused at the arrival that makes it so,
  not at line 1.

Keep going (`keep_going`): each violation is reported and the check carries
on from the trace's state where the spec could take the event (a property
broken by an enabled transition: the transition stays applied); where it
could not (a decision the spec would not make), the event is skipped and
the spec's state stays the one before it, so later events are judged
against that state (one divergence can be reported several times over). A
finish the trace did not write is taken as written. Input that is not a
trace (exit 2) still ends the check.

Bounds (exit 2, one line, instead of a check that would explode): a line
over MAX_LINE_BYTES, more than MAX_BLANK_RUN blank lines in a row
(line_reader.py), an arrival whose prompt has more than MAX_PROMPT_BLOCKS
full blocks (prompt_len // block_size: the labels, hits and allocations of
one request are that long), a pool beyond schema.MAX_POOL_BLOCKS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .check import CheckResult, IncrementalChecker, TraceChecker
from .fast import FastPath
from .growth import Growing
from .lasso import LIVELOCK
from .line_reader import MAX_BLANK_RUN, Follow, LineReader, open_lines
from .reading import MalformedTrace, parse_line, validate_numbered
from .replay import _Violation
from .step_inputs import DEFERRABLE, another_input_follows

# What callers import from here: the check, its verdicts, the reader.
__all__ = ["Follow", "LineReader", "MAX_FINISH_LOOKAHEAD", "MAX_PROMPT_BLOCKS", "Verdict", "check_lines",
           "open_lines"]

MAX_FINISH_LOOKAHEAD = 4096
MAX_PROMPT_BLOCKS = 1 << 17          # full blocks of one prompt: 131,072 (128 Ki tokens at block size 1)
PROGRESS_EVERY = 1000
PRUNE_LABELS_FROM = 4096           # stored prompt labels before the first prune

Progress = Callable[[int, int], None]   # (events checked, requests alive now)


@dataclass(frozen=True)
class Verdict:
    """A violation as it is found (`final` False, under keep_going) or the
    verdict on the whole input read (`final` True). `result` is None when
    the input is not a trace (`malformed` says why: exit 2)."""

    final: bool
    result: CheckResult | None
    malformed: str | None = None
    violations: int = 0              # violations reported before and with this verdict
    read_before: int = 0             # malformed: the events read before the malformed line
    checked_before: int = 0          # ... of which the checker took (the rest wait for the finishes after them)
    cut_short: bool = False          # malformed: the input's last line, with no newline after it

    def malformed_report(self) -> str:
        """`malformed` with what it would otherwise hide: that the line is
        a write cut short (a recorder stopped mid-line), and how far the
        check got before it (a verdict on those events, not on the trace)."""
        report = self.malformed or ""
        if self.cut_short:
            report += "; it is the last line and no newline ends it: a write cut short"
        if self.violations:
            report += f"; {self.violations} violations reported in the events before it"
        elif self.checked_before:
            held = self.read_before - self.checked_before
            events = f"{self.checked_before} event{'s' if self.checked_before != 1 else ''}"
            report += (f"; the {events} before it break no property checked so far"
                       f"{f' ({held} more read, not yet checked)' if held else ''}")
        return report

    @property
    def exit_code(self) -> int:
        """check-trace's exit code: 0 legal, 1 a violation, 2 not a trace."""
        if self.result is None:
            return 2
        return 0 if self.result.ok and not self.violations else 1


class _CountedLabels(dict):
    """The checker's prompt labels (replay.py: content -> label, a new label
    numbered `len + 1`), in memory bounded by the live state: `len` counts
    every label ever made, so numbers are never reused; labels of prompts
    given without token ids are counted, not stored; and `prune` forgets the
    content of labels no block caches and no request slot holds. Such a
    label can never be compared again (the spec compares prompt labels only
    with the pool's and with a request's own), so content that comes back
    gets a new label that behaves as the old one would have: a miss."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0
        self.kept_after_prune = 0

    def __len__(self) -> int:
        return self.made

    def __setitem__(self, key: Any, value: int) -> None:
        self.made += 1
        if not (isinstance(key, tuple) and key and key[0] == "fresh"):
            super().__setitem__(key, value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return default

    def prune_if_grown(self, checker: Any) -> None:
        """Forget dead labels once the stored ones have doubled since the last
        prune (the checker's state is read only then: the fast path's mirror stays)."""
        if dict.__len__(self) <= max(PRUNE_LABELS_FROM, 2 * self.kept_after_prune):
            return
        state = checker.state
        live = {label for label in state.pool.labels if label is not None}
        for q in state.requests:
            live.update(q.prompt_labels)
        for key in [key for key, label in self.items() if label not in live]:
            del self[key]
        self.kept_after_prune = dict.__len__(self)


class StreamingIncremental(Growing, IncrementalChecker):
    """The default checker (check.IncrementalChecker), built from the config alone."""


class StreamingFast(Growing, FastPath, IncrementalChecker):
    """The default checker with fast.py's path for the steady state of decoding."""


class StreamingFull(Growing, TraceChecker):
    """The full replay (`--full`), built from the config alone."""


def check_lines(lines: Iterable[str], profile: str | None = None, *, keep_going: bool = False,
                full: bool = False, on_progress: Progress | None = None, fast: bool = True) -> Iterator[Verdict]:
    """Check the trace whose lines (without newlines) `lines` gives, as they
    come: a Verdict per violation under `keep_going`, then a final one (the
    only one without). `profile`: as check.check_events (None: the trace's).
    `on_progress(events, live requests)` every PROGRESS_EVERY events. If
    `lines` has `drain()` (line_reader.LineReader following a file), the lines
    after the `end` event are read from it without waiting. `fast` (the
    default; not with `full`): the incremental checker with fast.py's path
    for the steady state, else the incremental checker alone."""
    run = _Run(profile, full, keep_going, on_progress, fast)
    try:
        yield from run.check(lines)
    except MalformedTrace as err:
        try:
            for verdict in run.flush():          # what was held for the line after it is judged first
                yield verdict
                if verdict.final:
                    return
        except MalformedTrace:
            pass                                 # (a held arrival refused: the first error is the one told)
        cut_short = getattr(lines, "cut_short", None)
        yield Verdict(True, None, malformed=str(err), violations=run.violations, read_before=run.read_before,
                      checked_before=run.read_before - len(run.held) - (run.held_input is not None),
                      cut_short=cut_short == run.line and not run.line_parsed)


class _Run:
    def __init__(self, profile: str | None, full: bool, keep_going: bool, on_progress: Progress | None,
                 fast: bool = True) -> None:
        self.profile, self.full, self.keep_going, self.on_progress = profile, full, keep_going, on_progress
        self.fast = fast
        self.checker: Any = None
        self.count = 0                        # events read
        self.line, self.read_before = 0, 0    # the line being read, and the events read before it
        self.line_parsed = False              # whether that line is JSON
        self.violations = 0
        self.first: CheckResult | None = None
        self.stopped = False
        self.last: tuple[int, int, str] = (1, 0, "config")   # line, index, kind of the last event fed
        self.held: list[tuple[int, int, dict[str, Any]]] = []   # a complete event and the finishes after it
        self.held_input: tuple[int, int, dict[str, Any]] | None = None   # an input or KV report, until the next line

    def check(self, lines: Iterable[str]) -> Iterator[Verdict]:
        for line, event in self._events(lines):
            index, self.count = self.count, self.count + 1
            if index == 0:
                self._start(event)
                continue
            if self.held_input is not None:
                yield from self._release_input(event)
                if self.stopped:
                    return
            if self.held:
                if event["ev"] == "finish" and len(self.held) <= MAX_FINISH_LOOKAHEAD:
                    self.held.append((line, index, event))
                    continue
                yield from self._release(event)
            if event["ev"] == "complete" and not self.stopped and (self._stops_unknown() or "step" in event):
                self.held.append((line, index, event))      # (its L2 may wait for an input after its finishes)
                continue
            if event["ev"] in DEFERRABLE and "step" in event and not self.stopped:
                self.held_input = (line, index, event)    # L2 may wait for the next input of its step
                continue
            if not self.stopped:
                yield from self._feed(line, index, event)
            if self.stopped:
                return
        yield from self._release_input(None)
        yield from self._release(None)
        if not self.stopped:
            yield from self._at_end()

    def _events(self, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, validated event) for each event; MalformedTrace."""
        config, number, blank_run = None, 0, 0
        source: Iterator[str] = iter(lines)
        while True:
            for text in source:
                number += 1
                self.line, self.read_before, self.line_parsed = number, self.count, False
                if not text.strip():
                    blank_run += 1
                    if blank_run > MAX_BLANK_RUN:
                        raise MalformedTrace(f"line {number}: more than {MAX_BLANK_RUN} blank lines in a row "
                                             "(a trace has one event per line)")
                    continue
                blank_run = 0
                event = parse_line(text, number)
                self.line_parsed = True               # JSON: no write cut it short
                validate_numbered(event, config, number)
                config = config or event
                yield number, event
                if self.checker is not None and self.checker.ended and hasattr(lines, "drain"):
                    break
            else:
                break
            source = lines.drain()                  # type: ignore[attr-defined]
            lines = source
        if config is None:
            raise MalformedTrace("the trace is empty (the first event must be 'config')")

    def _start(self, config: dict[str, Any]) -> None:
        kind = StreamingFull if self.full else StreamingFast if self.fast else StreamingIncremental
        checker = kind([config], self.profile)
        checker.labels = _CountedLabels()
        cfg = checker.cfg                         # modelled_pool cuts the pool unless the reorder reads it whole
        whole = cfg.cache_aware_admission_window and cfg.rules.cache_aware_admission
        checker.start_growing(config.get("usable_blocks", config["num_blocks"]), cut=not whole)
        self.checker = checker

    def _stops_unknown(self) -> bool:
        """Whether a request of a batch in flight names no stop token (its
        stop is read from the finish events after the complete)."""
        c = self.checker
        slots = c.in_flight_slots() if isinstance(c, FastPath) else [e.req for b in c.state.in_flight for e in b]
        return any(not c.stops[r][1] for r in slots if r in c.stops)

    def flush(self) -> Iterator[Verdict]:
        """Feed what is held (an input or report, a complete and its
        finishes) as if nothing followed: before a malformed line, the
        events read before it are judged as they would have been one by one."""
        yield from self._release_input(None)
        if not self.stopped:
            yield from self._release(None)

    def _release_input(self, following: dict[str, Any] | None) -> Iterator[Verdict]:
        """Feed the held input, told whether `following` (the next event,
        None at the end) is another input of its step (step_inputs.py)."""
        held, self.held_input = self.held_input, None
        if held is not None and not self.stopped:
            line, index, event = held
            yield from self._feed(line, index, event, follows=another_input_follows(event, following))

    def _release(self, following: dict[str, Any] | None) -> Iterator[Verdict]:
        """Feed the held complete event, with the finish reasons after it,
        then those finishes, each told whether `following` (the event after
        them, None at the end) is an input of their step (step_inputs.py)."""
        held, self.held = self.held, []
        if not held:
            return
        line, index, complete = held[0]
        upcoming = {e.get("req"): e.get("reason") for _, _, e in held[1:]}
        yield from self._feed(line, index, complete, upcoming, follows=another_input_follows(complete, following))
        for line, index, event in held[1:]:
            if self.stopped:
                return
            yield from self._feed(line, index, event, follows=another_input_follows(event, following))

    def _feed(self, line: int, index: int, event: dict[str, Any],
              upcoming: dict[str, Any] | None = None, follows: bool = False) -> Iterator[Verdict]:
        c = self.checker
        if event["ev"] == "arrive":
            _refuse_huge_prompt(event, c.cfg.block_size, line)
            c.grow_pool_for(event, line)
        elif event["ev"] == "reset" and event.get("running"):
            c.grow_pool_for(event, line)              # each request may take its table again
        fast = isinstance(c, FastPath)
        before = None if fast else c.state            # the fast path's: the state it handed over
        c.upcoming_finish = upcoming or {}
        c.input_follows_in_step = follows
        self.last = (line, index, event["ev"])
        try:
            c.feed(event)
            c.watch_lasso(event, line)                 # L4 (lasso.py): every event, fast ones too
        except _Violation as v:
            if v.prop != LIVELOCK:
                c.forget_lasso()                       # (keep going: a skipped event is no quiet one)
            yield from self._violated(v, c.describe(c.last_before if fast else before), line, index, event["ev"])
        if event["ev"] == "arrive":
            c.labels.prune_if_grown(c)
        if self.on_progress is not None and index % PROGRESS_EVERY == 0:
            self.on_progress(index, c.num_live() if fast else len(c.state.waiting) + len(c.state.running))

    def _violated(self, v: _Violation, state_before: str, line: int, index: int, kind: str) -> Iterator[Verdict]:
        c = self.checker
        self.violations += 1
        result = CheckResult(False, self.count, index, v.prop, v.message, state_before, sorted(c.unchecked),
                             c.cfg.profile, line=line, event=kind)
        self.first = self.first or result
        if not self.keep_going:
            self.stopped = True
            yield Verdict(True, result, violations=self.violations)
            return
        if v.prop == "missing_finish":
            c.finished_now.clear()           # carry on as if the trace had written it
        c.scheduled = None
        yield Verdict(False, result, violations=self.violations)

    def _at_end(self) -> Iterator[Verdict]:
        """The end of the input (or of following it): what check_events checks after the last event."""
        c = self.checker
        if c.finished_now:
            r, status = next(iter(c.finished_now.items()))
            missing = _Violation("missing_finish", f"{c._name(r)} finished ({status.value}) but the trace "
                                 "has no finish event")
            line, index, kind = self.last
            yield from self._violated(missing, c.describe(c.state), line, index, kind)
            if self.stopped:
                return
        if not c.ended:
            c.unchecked.add("liveness at the end (the trace has no end event)")
        c._engine_steps_at_end()
        unchecked = sorted(c.unchecked)
        if self.first is None:
            yield Verdict(True, CheckResult(True, self.count, unchecked=unchecked, profile=c.cfg.profile))
            return
        first = self.first
        yield Verdict(True, CheckResult(False, self.count, first.event_index, first.property, first.message,
                                        first.state_before, unchecked, first.profile, first.line, first.event),
                      violations=self.violations)


def _refuse_huge_prompt(event: dict[str, Any], block_size: int, line: int) -> None:
    """An arrival whose prompt has more full blocks than the checker builds
    labels, hits and tables for in seconds (MAX_PROMPT_BLOCKS)."""
    blocks = event["prompt_len"] // block_size
    if blocks > MAX_PROMPT_BLOCKS:
        raise MalformedTrace(f"line {line}: arrive event: prompt_len: {event['prompt_len']} tokens make "
                             f"{blocks} full blocks of {block_size}; the checker models prompts of at most "
                             f"{MAX_PROMPT_BLOCKS} full blocks (prompt_len // block_size)")

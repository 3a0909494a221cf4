"""Asynchronous scheduling in a trace (profile vllm-0.33-async): the empty
schedule() calls a trace need not write, and the rules only async scheduling
has (the decode stagger S6', placeholders IA1/IA2).

Under async scheduling every schedule() call counts for the decode stagger,
the empty ones included, and an empty batch takes a queue slot. Before each
batch the checker replays the calls the trace does not show as the spec's
empty batches (how many: `_catch_up_empty_calls`; a call the trace notes on
another event, before that event: `_note_empty_batches`), and completes an
empty batch whenever a queue slot or a completion needs it.
docs/trace-format.md, "Asynchronous scheduling".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from flightcheck.spec import Action, CompleteOldest, Config, Schedule, State, Status, schedule
from flightcheck.spec.actions import complete_oldest
from flightcheck.spec.launch import count_down
from flightcheck.spec.schedule import Scheduled, _idle, is_empty_step

EMPTY_BATCH = object()     # the batch id of an empty batch the checker queued


class AsyncScheduling:
    """The async part of check.py's TraceChecker (a mixin: it reads the
    checker's state, config and queue of batch ids, and raises violations
    through `self._violation`)."""

    state: State
    cfg: Config
    batch_ids: list[Any]
    slot: dict[str, int]
    unchecked: set[str]
    scheduled: Scheduled | None
    last_call_step: int | None
    writes_empty_batches: bool
    pending_empty_calls: int
    pending_empty_completions: int
    finished_unflushed: bool
    finished_now: dict[int, Status]
    _apply: Callable[[Action, State | None, str], None]
    _newly_finished: Callable[[State, State], list[int]]
    _violation: Callable[[str, str], Exception]

    def _catch_up_empty_calls(self, event: dict) -> None:
        """The schedule() calls between the previous one the trace shows and
        this batch queued empty batches the trace need not write; each moves
        every request's stagger countdown. How many: the empty batches the
        event notes (`empty_batches_before`), else the engine-step gap to the
        previous call when both carry `step` (every engine step with a
        request unfinished calls schedule() once), else as many as the spec
        would make before it forms a batch (at most the stagger: past it no
        countdown moves). Each is queued as the spec's empty batch and
        completed whenever a queue slot or a completion needs it."""
        step = event.get("step")
        if self.writes_empty_batches:
            count, exact = self.pending_empty_calls, True
            self.pending_empty_calls = 0
        elif step is not None:
            # no call before the first one the trace shows moves a countdown: none is set yet
            count = 0 if self.last_call_step is None else max(0, step - self.last_call_step - 1)
            exact = True
            if count:
                self.unchecked.add("whether the schedule() calls between batches that the trace does not "
                                   "write (engine steps) formed nothing: they count for the decode stagger")
        else:
            count, exact = self.cfg.stagger, False
            self.unchecked.add("the empty schedule() calls between batches (the trace writes neither empty "
                               "batches nor engine steps): the decode stagger is checked as if the engine "
                               "called schedule() only until the spec forms a batch")
        if step is not None:
            self.last_call_step = step
        self._replay_empty_calls(count, exact)

    def _replay_empty_calls(self, count: int, exact: bool, make_room: bool = True) -> int:
        """Queue `count` schedule() calls as the spec's empty batches (each
        counts every countdown down); when the count is not `exact`, only
        while the spec's own call would form nothing. Returns how many of
        the first `stagger` calls found no queue slot (or no request).
        `make_room` (a schedule event's catch-up): then leave a slot for the
        event's batch; else (calls noted on another event) see
        `_drain_unnoted_empty_batches`."""
        left = min(count, self.cfg.stagger)
        while left:
            if not exact and not is_empty_step(schedule(self._with_queue_slot(), self.cfg)):
                break
            self._drain_empty_batches(keep_room=True)
            idle = self._empty_call(exact)
            if idle is None:
                break
            left -= 1
            self.scheduled = idle
            self._apply(Schedule(), idle.state, "schedule")
            self.batch_ids.append(EMPTY_BATCH)
            if self.pending_empty_completions and len(self.state.in_flight) == 1:
                self.pending_empty_completions -= 1        # its completion was noted already (grammar.py)
                self._drain_noted_empty_batch()
        self.pending_empty_completions = 0          # (noted completions of batches still in flight here)
        if make_room:
            self._drain_empty_batches(keep_room=True)
        elif self.state.in_flight and len(self.state.in_flight) >= self.cfg.queue_depth:
            self._drain_unnoted_empty_batches()
        self.unchecked.add("queue slots of empty batches (the checker completes an empty batch whenever a "
                           "slot or a completion needs it)")
        return left

    def _empty_call(self, exact: bool) -> Scheduled | None:
        """The spec's empty batch for a call the trace shows (`exact`), or
        None where it finds no queue slot or vLLM would not call. vLLM 0.33
        and 0.34 `Scheduler.has_requests` is also true while
        `has_finished_requests`: `_free_request` adds every finished id to
        `finished_req_ids`, and only the next `schedule()` clears it; the
        spec leaves that set out (spec/engine.py), so a shown call after a
        finish event with no call since (say under PAUSED_NEW, where the
        queued requests count for nothing) queues an empty batch even where
        the spec's `_idle` sees no request."""
        if len(self.state.in_flight) >= self.cfg.queue_depth:
            return None
        idle = _idle(self.state, self.cfg)
        if idle is not None or not (exact and self.finished_unflushed and self.cfg.rules.empty_batches):
            return idle
        counted = count_down(self.state, self.cfg)
        return Scheduled(replace(counted, in_flight=counted.in_flight + ((),)), (), (), ())

    def _drain_unnoted_empty_batches(self) -> None:
        """Make room after calls noted on an event that is no schedule: the
        empty batches completed here are the checker's slack, not an update
        the trace noted, so they finish no failed grammar; the next noted
        completion does. vLLM's step pops the oldest batch and waits for its
        output, and an abort arriving in that wait (0.34's `_wait_for_output`)
        comes before that update finishes the request by FINISHED_ERROR."""
        recorded = self.state.grammar_errors
        self.state = replace(self.state, grammar_errors=frozenset())
        self._drain_empty_batches(keep_room=True)
        self.state = replace(self.state, grammar_errors=self.state.grammar_errors | recorded)

    def _drain_noted_empty_batch(self) -> None:
        """Complete the empty batch queued for a call whose completion the
        trace noted earlier: its update ran then, and finished the failed
        grammars recorded before it (`finish_grammar_errors_at_empty_completion`);
        a grammar error recorded since (by a later empty call) waits for a
        later update, so this late replay of the completion leaves it."""
        recorded_since = self.state.grammar_errors
        self.state = replace(self.state, grammar_errors=frozenset())
        self._drain_empty_batches(oldest_only=True)
        self.state = replace(self.state, grammar_errors=self.state.grammar_errors | recorded_since)

    def _diagnose_async(self, entries: list[dict]) -> None:
        """A batch the spec does not form, under async scheduling: name the
        rule it breaks when a request in it is one the running loop holds
        back -- within its decode stagger (S6') or with placeholders that
        already reach max_tokens (IA2)."""
        if not self.cfg.rules.output_placeholders:
            return
        state = self._with_queue_slot()
        for x in entries:
            r = self.slot.get(x["req"])
            if r is None or state.requests[r].status is not Status.RUNNING:
                continue
            q = state.requests[r]
            if q.decode_countdown > 1:            # schedule() would count it down to > 0 first
                raise self._violation("S6p_async_decode_gating", f"{x['req']} is scheduled {self.cfg.stagger - q.decode_countdown + 1} "
                                 f"schedule() call(s) after its last sampling entry; the stagger is {self.cfg.stagger}")
            if q.placeholders > 0 and q.num_computed + 2 - q.placeholders >= q.prompt_len + q.max_tokens:
                raise self._violation("IA2_placeholders_within_max_tokens",
                                 f"{x['req']} is scheduled with {q.num_output} outputs and {q.placeholders} "
                                 f"placeholders in flight, which already reach max_tokens {q.max_tokens}")

    def _note_empty_batches(self, event: dict) -> None:
        """The empty schedule() calls a writer notes on any event
        (`empty_batches_before`, the vLLM 0.33 recorder's annotation): once a
        trace notes one, it is taken to note them all. Those noted on a
        schedule event are replayed by its catch-up; those noted on any
        other event, here, before it."""
        noted = event.get("empty_batches_before")
        if not isinstance(noted, list):
            self.finished_unflushed |= event["ev"] == "finish"
            return
        self.writes_empty_batches = True
        self.pending_empty_calls += sum(1 for x in noted if isinstance(x, dict) and x.get("ev") == "schedule")
        if event["ev"] != "schedule":
            # the calls ran before this event: vLLM 0.34's `EngineCore.step_with_batch_queue`
            # calls schedule() and queues its batch before it pops the oldest for
            # `update_from_output`, so a call noted on a completion precedes it, and one
            # noted on an input ran in an engine step before it; replayed later, the
            # spec's call would read a state vLLM's call never saw (PR3 would judge it)
            # (a call that finds no slot here waits for the next batch's catch-up, as before)
            self.pending_empty_calls = self._replay_empty_calls(self.pending_empty_calls, exact=True,
                                                                make_room=False)
        self.finished_unflushed |= event["ev"] == "finish"        # (after the calls noted before it)

    def _with_queue_slot(self) -> State:
        """The state with leading empty batches completed while the queue is full."""
        state = self.state
        while len(state.in_flight) >= self.cfg.queue_depth and state.in_flight and not state.in_flight[0]:
            state = replace(state, in_flight=state.in_flight[1:])
        return state

    def _drain_empty_batches(self, keep_room: bool = False, oldest_only: bool = False) -> None:
        """Complete leading empty batches (they change no request): all of
        them, or with `keep_room` only while the queue is full."""
        while self.state.in_flight and not self.state.in_flight[0] and (
                not keep_room or len(self.state.in_flight) >= self.cfg.queue_depth):
            self.batch_ids.pop(0)
            before = self.state
            self._apply(CompleteOldest(()), complete_oldest(self.state, self.cfg, ()), "complete")
            # its update finishes the failed grammars recorded (spec/grammar.py): their finish events follow
            for r in self._newly_finished(before, self.state):
                self.finished_now[r] = self.state.requests[r].status
            if oldest_only:
                return

    def _check_placeholders(self, scheduled: Scheduled, entries: list[dict]) -> None:
        """An entry's `placeholders` (async writers): the request's
        num_output_placeholders after the batch, against the spec's."""
        if not self.cfg.rules.output_placeholders:
            return
        if any("placeholders" not in x for x in entries):
            self.unchecked.add("the writer's output placeholders (schedule entries carry no placeholders)")
        for e, x in zip(scheduled.entries, entries):
            if "placeholders" in x and x["placeholders"] != scheduled.state.requests[e.req].placeholders:
                raise self._violation("IA1_placeholders", f"{x['req']} has {x['placeholders']} output placeholders "
                                 f"in the trace, {scheduled.state.requests[e.req].placeholders} in the spec")


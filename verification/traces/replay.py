"""The trace checker's replay: each event of a validated trace as a spec
transition, the scheduler's decisions compared with the spec's, every
property checked after every event.

What the checker takes from the trace, as the environment's choices:
arrivals (prompt length, max_tokens, prompt content when given), aborts, the
tokens each batch returned (how many drafts were accepted, whether a stop
token was sampled), and the drafts proposed for each request's next step.
What it checks, as the scheduler's decisions: every batch (which requests,
start, n, cached, drafts, samples, in order), every preemption, FIFO
completion, which outputs were applied or dropped, every finish and its
reason, and every invariant after every event. With `block_ids` it also
checks block identity (up to a consistent renaming of block ids), so KV
ownership and every allocation decision are checked; without them it says so.

After an `end` event (the writer's run is over and no input is left): no
batch may be left in flight and every request must have finished. One left
unfinished is stuck: either the writer's scheduler stalled where the spec
would go on (L2), or the spec itself cannot move it (L1).

The spec numbers requests by slot; every message names them by the trace's
own ids (`describe` and `explain.py` too).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightcheck.spec import (
    invariants_for,
    transition_properties_for,
    Abort,
    Action,
    Arrive,
    CompleteOldest,
    Prompt,
    Sample,
    Schedule,
    State,
    Status,
    initial_state,
    sampling_entries,
    schedule,
    step,
)
from flightcheck.spec import cadence
from flightcheck.spec.actions import complete_oldest, max_next_drafts
from flightcheck.spec.admission_order import reorder_waiting
from flightcheck.spec.schedule import Scheduled, is_empty_step

from .asynchronous import EMPTY_BATCH, AsyncScheduling
from .connector import ConnectorEvents, prompt_offer
from .grammar import GrammarEvents
from .incarnations import IncarnationOutputs
from .lasso import LassoWatch
from .drafts import DraftHandOff
from .configuration import config_from_event, modelled_pool
from .engine_steps import EngineSteps
from .explain import why_left_out, why_nothing_scheduled
from .named_state import describe_named, quoted
from .reading import MalformedTrace
from .reset_pause import ResetPauseEvents
from .schema import one_line, show
from .sessions import SessionEvents
from .skip_drafts import SkipDrafts
from .step_inputs import L2, StepInputs
from .unwritten import UnwrittenKv

REASONS = {"stop": Status.FINISHED_STOPPED, "length": Status.FINISHED_LENGTH,
           "abort": Status.FINISHED_ABORTED, "error": Status.FINISHED_ERROR}


class _Violation(Exception):
    def __init__(self, prop: str, message: str) -> None:
        message = one_line(message)          # request ids are quoted already; this guards the rest
        super().__init__(message)
        self.prop, self.message = prop, message


class EventsDropped(MalformedTrace):
    """A streaming recorder's `dropped` marker (docs/trace-format.md): events
    are missing from here on, so the checker judges nothing past it; every
    event before it was checked (exit 2, the message says so)."""


class TraceChecker(AsyncScheduling, EngineSteps, DraftHandOff, ConnectorEvents, ResetPauseEvents, GrammarEvents,
                   SessionEvents, IncarnationOutputs, SkipDrafts, LassoWatch, UnwrittenKv, StepInputs):
    """Replays events one by one on the spec; `feed` raises _Violation."""

    def __init__(self, events: list[dict[str, Any]], profile: str | None = None) -> None:
        self.cfg = modelled_pool(config_from_event(events[0], profile), events)
        self.eos = events[0].get("eos_token_id")
        self.state: State = initial_state(self._num_slots(events), self.cfg.num_blocks)
        self.slot: dict[str, int] = {}            # request name -> its current incarnation's slot
        self.names: list[str] = []
        self.stops: dict[int, tuple[set[int], bool]] = {}   # slot -> (stop ids, ignore_eos)
        self.batch_ids: list[Any] = []            # trace batch id of each in-flight batch
        self.block_map: dict[int, int] = {}       # trace block id -> spec block id
        self.labels: dict[tuple, int] = {}
        self.unchecked: set[str] = set()
        self.finished_now: dict[int, Status] = {}  # finishes the spec made, awaiting their event
        self.just_aborted: int | None = None      # the slot the previous event aborted
        self.ended = False
        self.scheduled: Scheduled | None = None   # the record of the schedule step being applied
        # async scheduling: the engine step of the last schedule() call the
        # trace shows (a batch, or an empty batch it notes), if it gives steps
        self.last_call_step: int | None = None
        # the writer notes empty batches (`empty_batches_before`): said up front
        # by the config key `notes_empty_batches`, else learnt at the first note
        self.writes_empty_batches = bool(events[0].get("notes_empty_batches", False))
        self.pending_empty_calls = 0              # empty schedule() calls noted since the last batch
        self.pending_empty_completions = 0        # of those, completions noted before the checker queued them
        self.finished_unflushed = False           # a finish event since the last schedule() call (asynchronous.py)
        # vLLM 0.34's cache-aware admission order can change `waiting` in an empty schedule() call
        self.reorders_admission = bool(self.cfg.rules.cache_aware_admission and self.cfg.prefix_caching
                                       and self.cfg.cache_aware_admission_window)
        # and the prefill cadence's capacity-bound flag (spec/cadence.py)
        self.cadenced = cadence.is_on(self.cfg)
        self._start_engine_steps()                # the engine's choices (engine_steps.py)
        self._start_connector()                   # the KV connector's events (connector.py)

    def _num_slots(self, events: list[dict[str, Any]]) -> int:
        """Request slots in the spec state: one per arrival, never reused."""
        return sum(1 for e in events if e["ev"] == "arrive")

    def _new_slot(self) -> int:
        """The slot of the next arrival's incarnation."""
        return len(self.names)

    # -- helpers ------------------------------------------------------------

    @staticmethod
    def _violation(prop: str, message: str) -> Exception:
        return _Violation(prop, message)

    def _name(self, r: int) -> str:
        return self.names[r]

    def _quoted_name(self, r: int) -> str:
        """Slot r's request id as messages print it; `(earlier)` for an older
        incarnation of an id a later arrival reused."""
        name = self.names[r]
        return quoted(name) + ("" if self.slot.get(name) == r else "(earlier)")

    def _arrival_order(self) -> list[int]:
        """Every slot that has had an arrival, in arrival order."""
        return list(range(len(self.names)))

    def describe(self, state: State) -> str:
        """`state` in one line, in the trace's request names (named_state.py)."""
        return describe_named(state, self._arrival_order(), self._quoted_name)

    def _req(self, event: dict) -> int:
        name = event["req"]
        if name not in self.slot:
            raise _Violation("unknown_request", f"{event['ev']} of request {show(name)} that never arrived")
        return self.slot[name]

    def _labels(self, event: dict) -> tuple[int, ...]:
        bs = self.cfg.block_size
        if "prompt_block_labels" in event:
            return tuple(int(x) for x in event["prompt_block_labels"])
        if event["prompt_len"] >= self.cfg.max_model_len:
            return ()                      # the spec refuses this arrival whatever its labels
        tokens = event.get("prompt_token_ids")
        if tokens is None:
            if self.cfg.prefix_caching:
                self.unchecked.add("prefix-cache hits across requests (arrivals carry no prompt content)")
            return tuple(self._fresh_label() for _ in range(event["prompt_len"] // bs))
        labels, parent, lora = [], None, event.get("lora", 0)
        for i in range(len(tokens) // bs):
            key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))     # (vLLM keys a LoRA's blocks by it too)
            key = key + (lora,) if lora else key
            parent = self.labels.setdefault(key, len(self.labels) + 1)
            labels.append(parent)
        return tuple(labels)

    def _fresh_label(self) -> int:
        self.labels[("fresh", len(self.labels))] = label = len(self.labels) + 1
        return label

    def _check_properties(self, before: State, after: State, action: Action) -> None:
        for inv in invariants_for(self.cfg, auxiliary=False):
            if not (inv.name == L2 and self._l2_judged_later()) and not inv.holds(after, self.cfg):
                raise _Violation(inv.name, inv.statement)
        for prop in transition_properties_for(self.cfg):
            if not prop.holds(before, after, action, self.cfg):
                raise _Violation(prop.name, prop.statement)

    def _apply(self, action: Action, new_state: State | None, what: str) -> None:
        if new_state is None:
            raise _Violation("illegal_transition", f"{what}: not enabled in the spec")
        before, self.state = self.state, new_state
        self._check_properties(before, new_state, action)
        if isinstance(action, Schedule):
            self.finished_unflushed = False       # schedule() hands the finished ids to the workers

    # -- events -------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> None:
        if event["ev"] == "dropped":        # first: a lost finish must not read as a missing one
            raise EventsDropped(f"a dropped marker: {event['count']} events lost here by the recorder; "
                                f"every event before it is legal, nothing after it is judged")
        if self.ended:
            raise _Violation("event_after_end", f"{event['ev']} after the end event")
        if event["ev"] == "raised":          # before the prelude: nothing pending outranks it
            self._on_raised(event)
        if self.finished_now and event["ev"] != "finish" and not self._error_finish_may_wait(event):
            r, status = next(iter(self.finished_now.items()))
            raise _Violation("missing_finish", f"{self._name(r)} finished ({status.value}) in the spec "
                             "but the trace wrote no finish event for it")
        if self.reorders_admission or self.cadenced or self.cfg.structured_output:
            self._reorder_at_empty_calls(event)      # (an empty call may meet a failed grammar)
        if self.cfg.kv_connector is not None:
            self._promote_at_empty_calls(event)      # connector.py
        self._engine_step_before(event)
        if self.cfg.rules.output_placeholders:
            self._note_empty_batches(event)
        just_aborted, self.just_aborted = self.just_aborted, None
        if just_aborted is not None and self._reports_abort(event, just_aborted):
            self._check_held(just_aborted, event)     # held for a send: never, for an abort
            return
        getattr(self, f"_on_{event['ev']}")(event)
        self._settle_owed_l2()                       # step_inputs.py

    def _reorder_at_empty_calls(self, event: dict) -> None:
        """vLLM 0.34's cache-aware reorder runs in every schedule() call, empty
        ones too, and its order stays: each empty call the trace notes before
        this event (`empty_batches_before`) reorders `waiting` as the spec's
        schedule step at this state does, when that call was made (the
        checker's own empty batches come later, under async scheduling, or
        not at all). Synchronous: that step must form nothing too. Async:
        the stagger's countdowns are caught up after these notes are read
        (`_note_empty_batches`), so the reorder alone is taken (it reads no countdown)."""
        if not self.writes_empty_batches and self.reorders_admission:
            self.unchecked.add("the admission order after empty schedule() calls (the trace notes none; "
                               "vLLM 0.34's cache-aware reorder runs in them)")
        if not self.writes_empty_batches and self.cadenced:
            self.unchecked.add("the prefill cadence's capacity bound after empty schedule() calls (the trace "
                               "notes none; their waiting loop records it)")
        for note in event.get("empty_batches_before") or ():
            if isinstance(note, dict) and note.get("ev") == "complete":
                self.complete_noted_empty_batch()                   # grammar.py
            if not isinstance(note, dict) or note.get("ev") != "schedule":
                continue
            if self.cfg.rules.output_placeholders:
                self.note_grammar_errors_at_async_empty_call()       # grammar.py
                self._cadence_at_empty_call()
                self.state = reorder_waiting(self.state, self.cfg)
                continue
            scheduled = schedule(self.state, self.cfg)
            if scheduled is None:
                continue
            self.note_grammar_errors(scheduled)                  # structured output (grammar.py)
            if not is_empty_step(scheduled):
                want = self._fmt([(self._name(e.req), e.start, e.n, e.cached, e.drafts) for e in scheduled.entries])
                raise _Violation("schedule_decision", f"the trace notes an empty schedule() call where the "
                                 f"spec schedules {want or 'a preemption'}")
            self.state = replace(self.state, waiting=reordered_waiting(self.state.waiting, scheduled.state.waiting))
            if self.cadenced:
                self.state = cadence.carry_empty_call(self.state, scheduled.state)

    def _cadence_at_empty_call(self) -> None:
        """Async: an empty call's waiting loop records the capacity bound (the
        stagger's countdowns, caught up after the notes are read, do not reach
        the waiting loop of a call that scheduled nothing)."""
        scheduled = schedule(self.state, self.cfg) if self.cadenced else None
        if scheduled is not None:
            self.state = cadence.carry_empty_call(self.state, scheduled.state)

    def _reports_abort(self, event: dict, r: int) -> bool:
        """vLLM reports an aborted request as finished with reason abort
        (`finish_requests`), right after the abort: that event restates the
        abort and changes nothing."""
        return (event["ev"] == "finish" and event["reason"] == "abort"
                and self.slot.get(event["req"]) == r)

    def _on_config(self, event: dict) -> None:
        raise MalformedTrace("a second config event")

    def _on_stage(self, event: dict) -> None:
        self.unchecked.add("stage timing (stage events are not checked against the spec)")

    def _on_arrive(self, event: dict) -> None:
        name = event["req"]
        if name in self.slot and self.state.requests[self.slot[name]].status.is_active:
            raise _Violation("request_id_reused", f"{show(name)} arrives again while still active")
        r = self._new_slot()                       # a new incarnation gets a new slot
        if r == len(self.names):
            self.names.append(name)
        else:
            self.names[r] = name
        self.slot[name] = r
        prompt = Prompt(event["prompt_len"], event["max_tokens"], self._labels(event), **prompt_offer(event),
                        priority=event.get("priority", 0),
                        structured=event.get("structured", False),
                        lora=event.get("lora", 0), prompt_logprobs=event.get("prompt_logprobs", False))
        stop_ids = set(event.get("stop_token_ids") or ())
        eos = event.get("eos_token_id", self.eos)
        if not event.get("ignore_eos", False) and eos is not None:
            stop_ids.add(eos)
        self.stops[r] = (stop_ids, eos is not None or bool(stop_ids))
        self._apply(Arrive(r, prompt), step(self.state, self.cfg, Arrive(r, prompt)), "arrive")
        self._open_session(r, event)

    def _on_schedule(self, event: dict) -> None:
        entries = event["entries"]
        self._backfill_drafts(entries)
        self._hand_over_scheduled_drafts(entries)
        self._hand_over_to_preempted(event)
        if self.cfg.rules.output_placeholders:
            self._catch_up_empty_calls(event)
        scheduled = schedule(self.state, self.cfg)
        self._check_invalid_kv(scheduled, entries)
        self._check_unwritten_kv(scheduled, entries)
        parked = [r for r, _ in scheduled.kv_loads] if scheduled is not None else []
        if is_empty_step(scheduled) and not parked:
            # vLLM 0.33 queues an empty batch here; a trace notes those apart
            # (`empty_batch`, `empty_batches_before`) and this event scheduled something
            why = why_nothing_scheduled(self.state, self.cfg, self._quoted_name)
            self._diagnose_async(entries)
            self._diagnose_kv_entries((), entries, [])
            if not entries and event.get("kv_loads"):
                self._check_kv_loads(self.state, None, event)
            raise _Violation("illegal_schedule", f"a batch was scheduled but {why}")
        want = [(self._name(e.req), e.start, e.n, e.cached, e.drafts, e.samples, e.external)
                for e in scheduled.entries]
        got = []
        for i, x in enumerate(entries):
            samples = x.get("samples")
            if samples is None:                    # optional: a writer may leave it to the spec
                samples = want[i][5] if i < len(want) else False
            got.append((x["req"], x["start"], x["n"], x.get("cached", 0),
                        x.get("drafts", 0), bool(samples), x.get("external", 0)))
        if got != want:
            self._diagnose_async(entries)
            self._diagnose_kv_entries(scheduled.entries, entries, parked)
            raise _Violation("schedule_decision", f"the spec schedules {self._fmt(want)}, the trace {self._fmt(got)}"
                             + self._why_left_out(scheduled, entries))
        want_pre = [self._name(r) for r in scheduled.preempted]
        if list(event.get("preempted", [])) != want_pre:
            raise _Violation("preemption_decision",
                             f"the spec preempts {want_pre}, the trace {event.get('preempted', [])}")
        self._check_block_ids(scheduled.entries, entries)
        self._check_placeholders(scheduled, entries)
        self._check_skip_drafts(event, scheduled.entries)
        if self.cfg.kv_connector is not None:
            self._check_kv_loads(self.state, scheduled, event)
            self._settle_rollbacks([e.req for e in scheduled.entries] + parked)
        self.scheduled = scheduled
        self._apply(Schedule(), scheduled.state, "schedule")
        if scheduled.entries:
            self.batch_ids.append(event.get("batch"))
        elif self.cfg.rules.output_placeholders:
            self.batch_ids.append(EMPTY_BATCH)     # async: it counts for the stagger, kept in the queue
        elif self.state.in_flight and not self.state.in_flight[-1]:
            # vLLM 0.33 queued a step that only preempted as an empty batch;
            # the checker does not model empty batches' queue slots, so it
            # completes it at once (which changes no request)
            self.state = replace(self.state, in_flight=self.state.in_flight[:-1])

    def _why_left_out(self, scheduled: Scheduled, entries: list[dict]) -> str:
        """For each request the trace schedules and the spec leaves out (and
        that is known and unique in the trace's batch): why the spec does."""
        spec_requests = {e.req for e in scheduled.entries}
        names = [x["req"] for x in entries]
        left_out = [self.slot[n] for n in dict.fromkeys(names) if n in self.slot and names.count(n) == 1
                    and self.slot[n] not in spec_requests]
        reasons = [why_left_out(self.state, self.cfg, scheduled, r, self._quoted_name) for r in left_out]
        return "".join(f"; {reason}" for reason in reasons)

    @staticmethod
    def _fmt(entries) -> str:
        """A batch as messages print it: `"id"@start+n`, with cached and drafts when nonzero."""
        return "[" + ", ".join(f"{quoted(e[0])}@{e[1]}+{e[2]}" + (f" cached={e[3]}" if e[3] else "")
                               + (f" drafts={e[4]}" if e[4] else "")
                               + (f" external={e[6]}" if len(e) > 6 and e[6] else "") for e in entries) + "]"

    def _backfill_drafts(self, entries: list[dict]) -> None:
        """Drafts are proposed at completion; writers that do not say how many
        (no `next_drafts`) show them here, in the batch that schedules them."""
        for x in entries:
            name, drafts = x.get("req"), x.get("drafts", 0)
            r = self.slot.get(name)
            if r is None or not drafts:
                continue
            q = self.state.requests[r]
            if q.status is Status.RUNNING and q.num_drafts == 0 and not self.state.entries_of(r):
                if drafts > self.cfg.num_spec_tokens:
                    raise _Violation("S8_spec_accounting", f"{name} schedules {drafts} drafts, k = "
                                     f"{self.cfg.num_spec_tokens}")
                self.state = self.state.with_request(r, num_drafts=drafts)

    def _check_block_ids(self, spec_entries, trace_entries: list[dict]) -> None:
        if any("block_ids" not in x for x in trace_entries):
            self.unchecked.add("block identity (schedule entries carry no block_ids)")
            return
        for e, x in zip(spec_entries, trace_entries):
            # a promoted KV load is admitted with its whole table, the load's blocks first
            # (a session's next turn too, its table kept from the turn before; a session's
            # first turn promoted from its load is the load's table, once)
            ours = (self._parked_table(e.req) or self._session_table(e.req)) + tuple(e.block_ids)
            self._match_blocks(x["req"], list(x["block_ids"]), ours)

    def _match_blocks(self, name: str, theirs: list, ours: tuple[int, ...]) -> None:
        """The trace's block ids are the spec's, up to a consistent renaming."""
        if len(theirs) != len(ours):
            raise _Violation("S9_kv_ownership", f"{name} gets {len(theirs)} blocks in the trace, "
                             f"{len(ours)} in the spec")
        for t, b in zip(theirs, ours):
            if self.block_map.setdefault(t, b) != b:
                self._diagnose_block_under_transfer(name, t, self.block_map[t])
                raise _Violation("S9_kv_ownership", f"{name} gets block {t} in the trace; the spec "
                                 f"allocates the block the trace calls {self._trace_id(b)}")

    def _trace_id(self, spec_block: int) -> Any:
        return next((t for t, b in self.block_map.items() if b == spec_block), f"spec#{spec_block}")

    def _on_complete(self, event: dict) -> None:
        if self.cfg.rules.output_placeholders:
            self._drain_empty_batches()
        if not self.state.in_flight:
            raise _Violation("L3_drain", "a batch completed while none is in flight")
        oldest = self.batch_ids[0]
        if event.get("batch") is not None and oldest is not None and event["batch"] != oldest:
            raise _Violation("S7_fifo_completion", f"batch {event['batch']} completed before the oldest, {oldest}")
        tokens = event.get("tokens", {})
        dropped = set(event.get("dropped", []))
        stale = set(event.get("stale", []))          # the vLLM recorder's key: counted against a stale share
        next_drafts = event.get("next_drafts", {})
        batch = self.state.in_flight[0]
        sampling = {e.req for e in sampling_entries(self.state, self.cfg)}
        samples, dropped_orphans = [], set()
        for e in batch:
            name, returned = self._name(e.req), tokens.get(self._name(e.req), [])
            if e.req in sampling:
                if name in dropped:
                    if e.fate.value != "orphaned":
                        raise _Violation("S5_one_sample_per_prefill", f"{name}'s sampled token was dropped")
                    dropped_orphans.add(e.req)          # 0.8.5 drops these: wasteful but safe
                if not returned:
                    raise _Violation("S5_one_sample_per_prefill",
                                     f"{name}'s batch reaches its known tokens but returned no token")
                samples.append(self._sample(e, returned, self._drafts_after_completion(next_drafts.get(name, 0))))
            elif returned and name not in dropped:
                what = "a partial prefill chunk" if e.fate.value == "live" else "a superseded entry"
                raise _Violation("S5_one_sample_per_prefill" if e.fate.value == "live" else "S7_output_binding",
                                 f"tokens of {what} of {name} were applied")
            else:                                      # incarnations.py
                self._check_older_incarnation(e, bool(returned), name in dropped, name in stale)
        before = self.state
        after = complete_oldest(self.state, self.cfg, tuple(samples), dropped=frozenset(dropped_orphans))
        if after is None:
            raise _Violation("illegal_transition", f"complete: the returned tokens are not a legal outcome "
                             f"({tokens})")
        self.batch_ids.pop(0)
        self._apply(CompleteOldest(tuple(samples)), after, "complete")
        for r in self._newly_finished(before, after):
            self.finished_now[r] = after.requests[r].status

    def _newly_finished(self, before: State, after: State) -> list[int]:
        """The requests a completion finished, in arrival order."""
        return [r for r, (b, a) in enumerate(zip(before.requests, after.requests))
                if a.status.is_finished and not b.status.is_finished]

    def _active_slots(self) -> list[int]:
        """The unfinished requests, in arrival order."""
        return [r for r, q in enumerate(self.state.requests) if q.status.is_active]

    def _sample(self, e, returned: list[int], next_drafts: int) -> Sample:
        accepted = len(returned) - 1
        if accepted > e.drafts:
            raise _Violation("S8_spec_accounting", f"{self._name(e.req)} returned {len(returned)} tokens "
                             f"for {e.drafts} drafts")
        stop_ids, known = self.stops[e.req]
        stop_at = next((i for i, t in enumerate(returned) if t in stop_ids), None)
        if not known:
            self.unchecked.add("stop tokens (no eos_token_id or stop_token_ids in the trace)")
            stop_at = self._stop_from_finish(e.req, len(returned))
        # (where drafts do not come with the output, vLLM 0.33 async, the
        # trace's `next_drafts` are the placeholders held, which the spec gives)
        return Sample(accepted, stop_at, min(next_drafts, max_next_drafts(self.cfg)))

    def _stop_from_finish(self, r: int, n: int) -> int | None:
        upcoming = getattr(self, "upcoming_finish", {})
        return n - 1 if upcoming.get(self._name(r)) == "stop" else None

    def _on_finish(self, event: dict) -> None:
        self.catch_up_grammar_error(event)                 # grammar.py
        r = self._req(event)
        reason = event["reason"]
        status = self.finished_now.pop(r, None)
        if status is None:
            actual = self.state.requests[r].status
            raise _Violation("finish_decision", f"{show(event['req'])} finishes ({reason}) in the trace, but is "
                             f"{actual.value} in the spec")
        if status is not REASONS[reason]:
            raise _Violation("finish_decision", f"{show(event['req'])} finishes by {reason} in the trace, "
                             f"{status.value} in the spec")
        self._check_held(r, event)

    def _on_abort(self, event: dict) -> None:
        name = event["req"]
        r = self.slot.get(name)
        if r is None or not self.state.requests[r].status.is_active:
            return                                   # unknown or finished: a no-op, as in vLLM
        self._apply(Abort(r), step(self.state, self.cfg, Abort(r)), "abort")
        self.just_aborted = r

    def _on_raised(self, event: dict) -> None:
        """The scheduler raised inside a call of its engine's (the writer's
        last event, docs/trace-format.md, `raised`). Every input before it
        was checked legal, and every decision it made: a scheduler that
        raises on legal input is wrong (vLLM's engine core dies of it)."""
        at = f" ({event['at']})" if event.get("at") else ""
        raise _Violation("scheduler_raised", f"the scheduler raised in {event['in']}(): {event['error']}{at}; "
                         f"every event before it is legal, so it raised on legal input")

    def _on_end(self, event: dict) -> None:
        self.ended = True
        if self.cfg.rules.output_placeholders:
            self._drain_empty_batches()
        if self.state.in_flight:
            raise _Violation("L3_drain", f"{len(self.state.in_flight)} batches still in flight at the end")
        self._transfers_at_end()
        active = self._active_slots()
        if not active or self._left_to_clients(active):
            return
        names = ", ".join(self._name(r) for r in active)
        nxt = schedule(self.state, self.cfg)
        if is_empty_step(nxt):
            raise _Violation("L1_running_request_unblocked", f"{names} can never make progress")
        would = self._fmt([(self._name(e.req), e.start, e.n, e.cached, e.drafts) for e in nxt.entries])
        raise _Violation("L2_no_deadlock", f"the run ended with {names} unfinished, but the spec "
                         f"would schedule {would if nxt.entries else 'a preemption'}: "
                         "the scheduler stalled")



def reordered_waiting(waiting: tuple[int, ...], scheduled: tuple[int, ...]) -> tuple[int, ...]:
    """`waiting` in the order an empty schedule() call left it (`scheduled`),
    its own members only: a landed load that call promoted out of kv_holding
    is `_promote_at_empty_calls`' (connector.py) to take, not a second copy
    beside its kv_holding place (seed 409 index 108, 0.33.0: a false S10)."""
    members = set(waiting)
    order = tuple(r for r in scheduled if r in members)
    return order + tuple(r for r in waiting if r not in set(order))

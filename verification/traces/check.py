"""Trace validation: replay a JSON Lines trace (DESIGN.md's format) against
the concrete spec and report the first event that is not a legal spec
transition or that breaks a property, with the state before it.

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

The trace picks the spec's version profile (spec/profiles.py) from its
config event: `vllm_version` selects that version's profile, explicit keys
(`policy`, `num_preallocate_tokens`, `release_order`, `cache_duplicate_blocks`)
override its constants, no version means the default profile; a version no
profile covers is refused (MalformedTrace, exit 2) unless the caller names
the profile (`--profile`). docs/trace-format.md, "How a trace picks its profile".

After an `end` event (the writer's run is over and no input is left): no
batch may be left in flight and every request must have finished. One left
unfinished is stuck: either the writer's scheduler stalled where the spec
would go on (L2), or the spec itself cannot move it (L1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from flightcheck.spec import (
    invariants_for,
    transition_properties_for,
    Abort,
    Action,
    Arrive,
    CompleteOldest,
    Config,
    Prompt,
    Sample,
    Schedule,
    State,
    Status,
    describe,
    initial_state,
    sampling_entries,
    schedule,
    step,
)
from flightcheck.spec.actions import complete_oldest
from flightcheck.spec.schedule import Scheduled, _idle, is_empty_step
from flightcheck.spec.blocks import cdiv
from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES, profile_for_version

from .incremental import Incremental
from .schema import EVENTS, MAX_POOL_BLOCKS, SchemaError, validate_event

EVENT_KINDS = set(EVENTS)
EMPTY_BATCH = object()     # async: the batch id of an empty batch the checker queued
REASONS = {"stop": Status.FINISHED_STOPPED, "length": Status.FINISHED_LENGTH,
           "abort": Status.FINISHED_ABORTED}


class MalformedTrace(ValueError):
    """The file is not a trace in the format (exit code 2)."""


class UnknownVersion(MalformedTrace):
    """The trace names a vLLM version no profile covers, and no profile was
    given (exit code 2, like a malformed file: no verdict is possible)."""


@dataclass
class CheckResult:
    ok: bool
    events: int
    event_index: int | None = None       # 0-based line of the first illegal event
    property: str | None = None
    message: str | None = None
    state_before: str | None = None
    unchecked: list[str] = field(default_factory=list)
    profile: str = DEFAULT_PROFILE       # the spec's version profile the trace was checked under

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "event_index": self.event_index,
                "property": self.property, "message": self.message,
                "state_before": self.state_before, "unchecked": self.unchecked,
                "profile": self.profile}


class _Violation(Exception):
    def __init__(self, prop: str, message: str) -> None:
        super().__init__(message)
        self.prop, self.message = prop, message


def parse_line(line: str, number: int) -> Any:
    """One line's JSON value; MalformedTrace naming the line if it is not JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise MalformedTrace(f"line {number}: not JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise MalformedTrace(f"line {number}: not JSON this checker reads (nested too deeply)") from None
    except ValueError as err:                 # e.g. an integer of more digits than Python converts
        raise MalformedTrace(f"line {number}: not JSON this checker reads ({err})") from None


def validate_events(events: list[Any], line_numbers: list[int] | None = None) -> None:
    """Check every event against the schema (schema.py) before the spec sees
    any; MalformedTrace names the line, the field and what was expected."""
    if not events:
        raise MalformedTrace("the trace is empty (the first event must be 'config')")
    config: dict[str, Any] | None = None
    for index, event in enumerate(events):
        try:
            validate_event(event, config)
        except SchemaError as err:
            where = f"line {line_numbers[index]}" if line_numbers else f"event {index}"
            kind = event.get("ev") if isinstance(event, dict) and isinstance(event.get("ev"), str) else None
            what = f" {kind} event:" if kind in EVENT_KINDS else ""
            raise MalformedTrace(f"{where}:{what} {err.message}") from None
        if index == 0:
            config = event


def read_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse and validate JSON Lines; blank lines are skipped."""
    events, line_numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        events.append(parse_line(line, number))
        line_numbers.append(number)
    validate_events(events, line_numbers)
    return events


def select_profile(event: dict, override: str | None = None) -> str:
    """The profile a config event asks for: `override` (the caller's
    `--profile`) if given, else the `profile` it names (flightcheck's own
    writers), else its `vllm_version`'s, else the default. UnknownVersion for
    a version or a named profile no profile covers; ValueError for an
    unknown `override`."""
    if override is not None:
        if override not in PROFILES:
            raise ValueError(f"unknown profile {override!r}; known: {', '.join(PROFILES)}")
        return override
    named = event.get("profile")
    if named is not None:
        if named not in PROFILES:
            raise UnknownVersion(f"line 1: config event: profile: no profile is named {named!r} "
                                 f"(profiles: {', '.join(PROFILES)}); name one with --profile")
        return named
    version = event.get("vllm_version")
    asynchronous = event.get("async_scheduling", False)
    if version is None and not asynchronous:
        return DEFAULT_PROFILE
    chosen = None if version is None else profile_for_version(version)
    if chosen is None:
        raise UnknownVersion(f"line 1: config event: vllm_version: no profile covers vLLM {version!r} "
                             f"(profiles: {', '.join(PROFILES)}); name one with --profile")
    if asynchronous:
        name = ASYNC_PROFILES.get(chosen.name)
        if name is None:
            raise UnknownVersion(f"line 1: config event: async_scheduling: no profile models asynchronous "
                                 f"scheduling for vLLM {version!r} (profiles: {', '.join(PROFILES)}); "
                                 "name one with --profile")
        return name
    return chosen.name


# A sync profile -> the profile of the same version with asynchronous
# scheduling, selected by a config event's `async_scheduling: true`.
ASYNC_PROFILES: dict[str, str] = {"vllm-0.33": "vllm-0.33-async"}


# Config keys a trace may give to override its profile's constants.
_POLICIES = {"continue-prefill": True, "one-batch-per-request": False}


def config_from_event(event: dict, profile: str | None = None) -> Config:
    """The spec's Config from a validated config event, under `profile` (by
    default the one the event selects); explicit keys override the profile."""
    overrides: dict[str, Any] = {}
    if "policy" in event:
        overrides["continue_prefill"] = _POLICIES[event["policy"]]
    for key in ("num_preallocate_tokens", "release_order", "cache_duplicate_blocks", "batch_queue_depth",
                "decode_stagger"):
        if key in event:
            overrides[key] = event[key]
    return Config(
        profile=select_profile(event, profile), **overrides,
        num_stages=event["num_stages"],
        max_num_batched_tokens=event["max_num_batched_tokens"],
        max_num_seqs=event.get("max_num_seqs", 256), block_size=event["block_size"],
        num_blocks=event.get("usable_blocks", event["num_blocks"]),
        max_model_len=event["max_model_len"],
        long_prefill_token_threshold=event.get("long_prefill_token_threshold", 0),
        num_spec_tokens=event.get("num_spec_tokens", 0),
        prefix_caching=event.get("prefix_caching", False))


def modelled_pool(cfg: Config, events: list[dict[str, Any]]) -> Config:
    """The config with the pool cut to the blocks this trace can ever take.

    The spec's pool is materialised (one entry per block, copied on every
    change), so a 10**7-block pool would cost seconds per event. The cut is
    exact: fresh blocks are popped from the head of the free queue, which
    starts as 0, 1, 2, ... and to whose tail freed blocks return; while no
    more blocks are popped over the whole run than the cut pool holds, no
    allocation fails in either pool (so neither preempts), the same blocks
    are popped in the same order, and no freed block is popped again (so the
    same prefix-cache labels survive). A request pops at most the blocks of
    the tokens it can ever hold: its prompt, max_tokens outputs and, in
    flight, up to num_spec_tokens drafts beyond them (twice, for margin), and
    never more than max_model_len tokens. With preallocation (vLLM 0.8.4) a
    request may also take blocks ahead of need, up to max_model_len's blocks
    per request: the bound counts those too, so the cap "no more than the free
    blocks" never binds in the cut pool unless it binds in the whole one.
    Only `state_before` differs: it lists the cut pool's free queue."""
    k, bs = cfg.num_spec_tokens, cfg.block_size
    ahead = cfg.max_blocks_per_request if cfg.num_preallocate_tokens > 0 else 0
    most = 1 + sum(max(cdiv(min(cfg.max_model_len, e["prompt_len"] + e["max_tokens"] + 2 * k + 1), bs),
                       ahead) + 1
                   for e in events if e["ev"] == "arrive")
    num_blocks = min(cfg.num_blocks, most)
    if num_blocks > MAX_POOL_BLOCKS:
        raise MalformedTrace(f"line 1: config event: num_blocks: this trace's arrivals can take up to "
                             f"{num_blocks} blocks of the pool; the checker models pools of at most "
                             f"{MAX_POOL_BLOCKS} blocks")
    return replace(cfg, num_blocks=num_blocks)


class TraceChecker:
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

    def _req(self, event: dict) -> int:
        name = event["req"]
        if name not in self.slot:
            raise _Violation("unknown_request", f"{event['ev']} of request {name!r} that never arrived")
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
        labels, parent = [], None
        for i in range(len(tokens) // bs):
            key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
            parent = self.labels.setdefault(key, len(self.labels) + 1)
            labels.append(parent)
        return tuple(labels)

    def _fresh_label(self) -> int:
        self.labels[("fresh", len(self.labels))] = label = len(self.labels) + 1
        return label

    def _check_properties(self, before: State, after: State, action: Action) -> None:
        for inv in invariants_for(self.cfg):
            if not inv.holds(after, self.cfg):
                raise _Violation(inv.name, inv.statement)
        for prop in transition_properties_for(self.cfg):
            if not prop.holds(before, after, action, self.cfg):
                raise _Violation(prop.name, prop.statement)

    def _apply(self, action: Action, new_state: State | None, what: str) -> None:
        if new_state is None:
            raise _Violation("illegal_transition", f"{what}: not enabled in the spec")
        before, self.state = self.state, new_state
        self._check_properties(before, new_state, action)

    # -- events -------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> None:
        if self.ended:
            raise _Violation("event_after_end", f"{event['ev']} after the end event")
        if self.finished_now and event["ev"] != "finish":
            r, status = next(iter(self.finished_now.items()))
            raise _Violation("missing_finish", f"{self._name(r)} finished ({status.value}) in the spec "
                             "but the trace wrote no finish event for it")
        if self.cfg.rules.output_placeholders:
            self._note_empty_batches(event)
        just_aborted, self.just_aborted = self.just_aborted, None
        if just_aborted is not None and self._reports_abort(event, just_aborted):
            return
        getattr(self, f"_on_{event['ev']}")(event)

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
            raise _Violation("request_id_reused", f"{name!r} arrives again while still active")
        r = self._new_slot()                       # a new incarnation gets a new slot
        if r == len(self.names):
            self.names.append(name)
        else:
            self.names[r] = name
        self.slot[name] = r
        prompt = Prompt(event["prompt_len"], event["max_tokens"], self._labels(event))
        stop_ids = set(event.get("stop_token_ids") or ())
        eos = event.get("eos_token_id", self.eos)
        if not event.get("ignore_eos", False) and eos is not None:
            stop_ids.add(eos)
        self.stops[r] = (stop_ids, eos is not None or bool(stop_ids))
        self._apply(Arrive(r, prompt), step(self.state, self.cfg, Arrive(r, prompt)), "arrive")

    def _on_schedule(self, event: dict) -> None:
        entries = event["entries"]
        self._backfill_drafts(entries)
        if self.cfg.rules.output_placeholders:
            self._catch_up_empty_calls(event)
        scheduled = schedule(self.state, self.cfg)
        if is_empty_step(scheduled):
            # vLLM 0.33 queues an empty batch here; a trace notes those apart
            # (`empty_batch`, `empty_batches_before`) and this event scheduled something
            why = ("the pipeline is full" if len(self.state.in_flight) >= self.cfg.queue_depth
                   else "the spec schedules nothing here")
            self._diagnose_async(entries)
            raise _Violation("illegal_schedule", f"a batch was scheduled but {why}")
        want = [(self._name(e.req), e.start, e.n, e.cached, e.drafts, e.samples) for e in scheduled.entries]
        got = []
        for i, x in enumerate(entries):
            samples = x.get("samples")
            if samples is None:                    # optional: a writer may leave it to the spec
                samples = want[i][5] if i < len(want) else False
            got.append((x["req"], x["start"], x["n"], x.get("cached", 0),
                        x.get("drafts", 0), bool(samples)))
        if got != want:
            self._diagnose_async(entries)
            raise _Violation("schedule_decision", f"the spec schedules {self._fmt(want)}, the trace {self._fmt(got)}")
        want_pre = [self._name(r) for r in scheduled.preempted]
        if list(event.get("preempted", [])) != want_pre:
            raise _Violation("preemption_decision",
                             f"the spec preempts {want_pre}, the trace {event.get('preempted', [])}")
        self._check_block_ids(scheduled.entries, entries)
        self._check_placeholders(scheduled, entries)
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

    # -- asynchronous scheduling (profile vllm-0.33-async) -------------------------

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
        for _ in range(min(count, self.cfg.stagger)):
            if not exact and not is_empty_step(schedule(self._with_queue_slot(), self.cfg)):
                break
            self._drain_empty_batches(keep_room=True)
            idle = _idle(self.state, self.cfg) if len(self.state.in_flight) < self.cfg.queue_depth else None
            if idle is None:
                break
            self.scheduled = idle
            self._apply(Schedule(), idle.state, "schedule")
            self.batch_ids.append(EMPTY_BATCH)
        self._drain_empty_batches(keep_room=True)
        self.unchecked.add("queue slots of empty batches (the checker completes an empty batch whenever a "
                           "slot or a completion needs it)")

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
                raise _Violation("S6p_async_decode_gating", f"{x['req']} is scheduled {self.cfg.stagger - q.decode_countdown + 1} "
                                 f"schedule() call(s) after its last sampling entry; the stagger is {self.cfg.stagger}")
            if q.placeholders > 0 and q.num_computed + 2 - q.placeholders >= q.prompt_len + q.max_tokens:
                raise _Violation("IA2_placeholders_within_max_tokens",
                                 f"{x['req']} is scheduled with {q.num_output} outputs and {q.placeholders} "
                                 f"placeholders in flight, which already reach max_tokens {q.max_tokens}")

    def _note_empty_batches(self, event: dict) -> None:
        """The empty schedule() calls a writer notes on any event
        (`empty_batches_before`, the vLLM 0.33 recorder's annotation): once a
        trace notes one, it is taken to note them all."""
        noted = event.get("empty_batches_before")
        if not isinstance(noted, list):
            return
        self.writes_empty_batches = True
        self.pending_empty_calls += sum(1 for x in noted if isinstance(x, dict) and x.get("ev") == "schedule")

    def _with_queue_slot(self) -> State:
        """The state with leading empty batches completed while the queue is full."""
        state = self.state
        while len(state.in_flight) >= self.cfg.queue_depth and state.in_flight and not state.in_flight[0]:
            state = replace(state, in_flight=state.in_flight[1:])
        return state

    def _drain_empty_batches(self, keep_room: bool = False) -> None:
        """Complete leading empty batches (they change no request): all of
        them, or with `keep_room` only while the queue is full."""
        while self.state.in_flight and not self.state.in_flight[0] and (
                not keep_room or len(self.state.in_flight) >= self.cfg.queue_depth):
            self.batch_ids.pop(0)
            self._apply(CompleteOldest(()), complete_oldest(self.state, self.cfg, ()), "complete")

    def _check_placeholders(self, scheduled: Scheduled, entries: list[dict]) -> None:
        """An entry's `placeholders` (async writers): the request's
        num_output_placeholders after the batch, against the spec's."""
        if not self.cfg.rules.output_placeholders:
            return
        if any("placeholders" not in x for x in entries):
            self.unchecked.add("the writer's output placeholders (schedule entries carry no placeholders)")
        for e, x in zip(scheduled.entries, entries):
            if "placeholders" in x and x["placeholders"] != scheduled.state.requests[e.req].placeholders:
                raise _Violation("IA1_placeholders", f"{x['req']} has {x['placeholders']} output placeholders "
                                 f"in the trace, {scheduled.state.requests[e.req].placeholders} in the spec")

    @staticmethod
    def _fmt(entries) -> str:
        return "[" + ", ".join(f"{e[0]}@{e[1]}+{e[2]}" + (f" cached={e[3]}" if e[3] else "")
                               + (f" drafts={e[4]}" if e[4] else "") for e in entries) + "]"

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
            theirs = list(x["block_ids"])
            if len(theirs) != len(e.block_ids):
                raise _Violation("S9_kv_ownership", f"{x['req']} gets {len(theirs)} blocks in the trace, "
                                 f"{len(e.block_ids)} in the spec")
            for t, b in zip(theirs, e.block_ids):
                if self.block_map.setdefault(t, b) != b:
                    raise _Violation("S9_kv_ownership", f"{x['req']} gets block {t} in the trace; the spec "
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
                samples.append(self._sample(e, returned, next_drafts.get(name, 0)))
            elif returned and name not in dropped:
                what = "a partial prefill chunk" if e.fate.value == "live" else "a superseded entry"
                raise _Violation("S5_one_sample_per_prefill" if e.fate.value == "live" else "S7_output_binding",
                                 f"tokens of {what} of {name} were applied")
            elif not returned and name not in dropped and self._name_held_by_another(e.req):
                # vLLM 0.33 looks the output up by name: the newer incarnation's
                # in-flight counter drops by tokens none of its own batches
                # carried (the id-reuse bug, with no token to show for it). A
                # scheduler that dropped the output says so in `dropped`.
                holder = self.slot[name]
                raise _Violation("IF1_in_flight_counter",
                                 f"an older {name}'s batch ({e.n} tokens, no token sampled) completes "
                                 f"while a newer {name} holds the name: looked up by name, the newer "
                                 f"one's in-flight counter drops to "
                                 f"{self.state.requests[holder].num_in_flight - e.n}, which its own "
                                 f"batches in flight do not account for (not listed in `dropped`)")
        before = self.state
        after = complete_oldest(self.state, self.cfg, tuple(samples), dropped=frozenset(dropped_orphans))
        if after is None:
            raise _Violation("illegal_transition", f"complete: the returned tokens are not a legal outcome "
                             f"({tokens})")
        self.batch_ids.pop(0)
        self._apply(CompleteOldest(tuple(samples)), after, "complete")
        for r in self._newly_finished(before, after):
            self.finished_now[r] = after.requests[r].status

    def _name_held_by_another(self, r: int) -> bool:
        """Whether r's name is held now by another, unfinished incarnation
        (the name was reused while r's batches were in flight), under a
        profile that looks outputs up by name (vLLM 0.33): that request is
        where vLLM binds r's output, counters included."""
        if not self.cfg.rules.stale_output_counters:
            return False
        holder = self.slot.get(self._name(r))
        return holder is not None and holder != r and self.state.requests[holder].status.is_active

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
        return Sample(accepted, stop_at, min(next_drafts, self.cfg.num_spec_tokens))

    def _stop_from_finish(self, r: int, n: int) -> int | None:
        upcoming = getattr(self, "upcoming_finish", {})
        return n - 1 if upcoming.get(self._name(r)) == "stop" else None

    def _on_finish(self, event: dict) -> None:
        r = self._req(event)
        reason = event["reason"]
        status = self.finished_now.pop(r, None)
        if status is None:
            actual = self.state.requests[r].status
            raise _Violation("finish_decision", f"{event['req']} finishes ({reason}) in the trace, but is "
                             f"{actual.value} in the spec")
        if status is not REASONS[reason]:
            raise _Violation("finish_decision", f"{event['req']} finishes by {reason} in the trace, "
                             f"{status.value} in the spec")

    def _on_abort(self, event: dict) -> None:
        name = event["req"]
        r = self.slot.get(name)
        if r is None or not self.state.requests[r].status.is_active:
            return                                   # unknown or finished: a no-op, as in vLLM
        self._apply(Abort(r), step(self.state, self.cfg, Abort(r)), "abort")
        self.just_aborted = r

    def _on_end(self, event: dict) -> None:
        self.ended = True
        if self.cfg.rules.output_placeholders:
            self._drain_empty_batches()
        if self.state.in_flight:
            raise _Violation("L3_drain", f"{len(self.state.in_flight)} batches still in flight at the end")
        active = self._active_slots()
        if not active:
            return
        names = ", ".join(self._name(r) for r in active)
        nxt = schedule(self.state, self.cfg)
        if is_empty_step(nxt):
            raise _Violation("L1_running_request_unblocked", f"{names} can never make progress")
        would = self._fmt([(self._name(e.req), e.start, e.n, e.cached, e.drafts) for e in nxt.entries])
        raise _Violation("L2_no_deadlock", f"the run ended with {names} unfinished, but the spec "
                         f"would schedule {would if nxt.entries else 'a preemption'}: "
                         "the scheduler stalled")


class IncrementalChecker(Incremental, TraceChecker):
    """The default checker: the full replay's verdict, checking only what each
    event touches (incremental.py)."""


PROGRESS_EVERY = 1000


def check_events(events: list[dict[str, Any]], profile: str | None = None, full: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> CheckResult:
    """Validate the events (MalformedTrace), then replay them on the spec under
    `profile` (None: the one the trace selects).

    By default only what each event touches is checked (incremental.py),
    with the same verdict; `full` re-checks every property of the whole state
    after every event, the definition the incremental checker is tested against.
    `progress(done, total)` is called every PROGRESS_EVERY events."""
    validate_events(events)
    checker = TraceChecker(events, profile) if full else IncrementalChecker(events, profile)
    name = checker.cfg.profile
    _annotate_finishes(events)
    for index, event in enumerate(events[1:], start=1):
        before = checker.state             # states are immutable: describe it only if needed
        checker.upcoming_finish = event.get("_finishes", {})
        if progress is not None and index % PROGRESS_EVERY == 0:
            progress(index, len(events))
        try:
            checker.feed(event)
        except _Violation as v:
            return CheckResult(False, len(events), index, v.prop, v.message, describe(before),
                               sorted(checker.unchecked), name)
    if checker.finished_now:
        r, status = next(iter(checker.finished_now.items()))
        return CheckResult(False, len(events), len(events) - 1, "missing_finish",
                           f"{checker._name(r)} finished ({status.value}) but the trace has no finish event",
                           describe(checker.state), sorted(checker.unchecked), name)
    if not checker.ended:
        checker.unchecked.add("liveness at the end (the trace has no end event)")
    return CheckResult(True, len(events), unchecked=sorted(checker.unchecked), profile=name)


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
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise MalformedTrace(f"cannot read it: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise MalformedTrace(f"line {line}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    # split on newlines only: str.splitlines would also split inside strings at
    # U+2028 and other separators a writer need not escape
    return check_events(read_events(text.split("\n")), profile, full=full, progress=progress)

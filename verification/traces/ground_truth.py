"""What a correct check-trace verdict is on a replayed vLLM trace, decided by
vLLM's own ground truth (flightcheck/vllm/README.md, "Ground truth from
vLLM's own state"), independently of the checker.

* a stale token, a token sampled for a partial chunk, or one a failed
  load's rollback superseded (`kv_superseded_tokens`): rejected at the
  `complete` event of the batch that applies it;
* a request missing from 0.8.4's in-flight set while its batch is in flight
  (a stale completion cleared it): rejected at the first `schedule` that
  schedules it again or, finding no block for it, preempts it: the
  schedule the missing id allows; an extra id
  (0.8.4's counter drift) holds the engine back and shows at `end` only if
  the run sticks;
* speculative decoding: drafts vLLM 0.8.x kept (past an entry that
  scheduled none of them, or through a preemption) scheduled, or the request
  preempted trying to, and an entry that samples a request while another of
  its sampling entries is in flight (a position sampled twice; not one a
  failed load's rollback superseded, whose token is the bug), an entry
  of fewer than 0 tokens, or one reaching past max_model_len (0.8.4, which
  does not clip drafts to it): rejected at that `schedule` event (the spec drops such drafts, as vLLM 0.33 does);
* a batch computing on KV a failed load left invalid, or a prefix hit on
  KV no batch wrote (`kv_computed_on_invalid_kv`, `hits_on_unwritten_kv`):
  rejected at that `schedule` event (KV7, KV8);
* a livelock the ground truth names (`admission_livelocks`: a request
  preempted again from a state that came back with only the scheduler's
  own work between, flightcheck/vllm/livelock_recording.py): rejected at
  or after the first `schedule` that preempts a request of the loop, where
  check-trace's L4 closes the lasso;
* a counter vLLM let go negative or out of step with the batches in flight
  (`negative_counters`, `in_flight_counter_mismatches`), or any other state
  gone wrong (`STATE_GONE_WRONG`: output placeholders, blocks, queues), or
  a stall an input ended (the replay's `stalls`): rejected somewhere, the
  ground truth's step being where vLLM shows it, not where it began (so
  beside a finding placed exactly, anywhere up to that one's event);
* with several of these, at the first of them, not before;
* a trace numbering engine steps (`engine_step`): the first event after
  the engine waited for input with batches in flight (E-a), and the
  completion 0.8.4's stale `scheduled_req_ids` forced where vLLM's own
  `schedule()` forms a batch without the stale ids (E-b). Not where that
  `schedule()` forms nothing but preempts (the replay's `would_preempt`,
  engine_truth.py): 0.8.4 allows it (`Scheduler.schedule`: a running
  request with no batch in flight finds no block, preempts from the tail
  of `running` down to itself, and the waiting loop does not run after a
  preemption) only where a mark names a request in no queue: the gate
  counts unmarked running and waiting requests less such marks, so without
  one a closed gate leaves no running request to try (a running request's
  mark is its batch's in flight: flightcheck/vllm/README.md, the extra
  ids of 920 runs never on a running request), and the waiting loop never
  preempts. Such a mark is a request preempted with its batch in
  flight (`update_from_output` unmarks `running` only) and aborted before
  it is admitted again (`finish_requests` unmarks a RUNNING request only).
  It breaks no property: with the gate open
  `EngineCore.step_with_batch_queue` would call `schedule()`, form no batch
  and complete the oldest batch in the same step, so the closed gate
  delays no batch there (E-b, spec/engine.py `may_complete`: completing is
  correct when nothing with tokens can be scheduled). What differs is the
  state the next `schedule()` starts from (those requests still running,
  their blocks held): a different choice of whom to preempt and when, not
  a lost token, a block owned twice or a stall; a run it leaves `stuck`
  is a finding by its end;
* a run that ends stuck (the counter drift) or blocked with batches in
  flight, with an `end` event: rejected at `end`; not a stuck end that
  waits on the clients of sessions parked for input (the replay's
  `left_to_clients`, flightcheck/vllm/run_endings.py: every unfinished
  request is such a session, or nothing runs and what they hold keeps the
  rest from admission; check-trace's L2 reads the same rule);
* an exception inside vLLM with none of the above before it: rejected at or
  before the trace's last event (the trace stops where vLLM raised: with the
  recorder's `raised` event where vLLM raised in a scheduler call);
* none of these: legal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .check import CheckResult


@dataclass(frozen=True)
class Expected:
    kind: str                 # legal | bug | stuck | blocked_in_flight | exception
    earliest: int | None      # the first event index a rejection may name
    latest: int | None        # the last

    def agrees(self, verdict: CheckResult) -> bool:
        if self.kind == "legal":
            return verdict.ok
        got = verdict.event_index
        return (not verdict.ok and got is not None and (self.earliest is None or got >= self.earliest)
                and self.latest is not None and got <= self.latest)


# What vLLM's state shows gone wrong at the step it is seen, not where it
# began (flightcheck/vllm/replay.py `findings`): counters, output
# placeholders (a failed load's rollback included, vLLM #49250), a sharer's
# base, blocks freed under a transfer or leaked, a heap out of order, a
# session's lost input or overcounted seats, a grammar error bound by id.
STATE_GONE_WRONG = ("negative_counters", "in_flight_counter_mismatches", "placeholder_mismatches",
                    "kv_rollback_placeholders", "kv_holder_base_counts_later_batches",
                    "kv_blocks_freed_under_transfer", "kv_blocks_leaked_at_end", "priority_heaps_out_of_order",
                    "session_inputs_lost", "session_seats_overcounted", "grammar_errors_bound_by_id")


def expected_verdict(result: dict[str, Any], events: list[dict[str, Any]]) -> Expected:
    """Where the checker must reject the trace of `result` (a replay result), if at all."""
    truth = result["ground_truth"]
    completes = {e.get("batch"): i for i, e in enumerate(events) if e["ev"] == "complete"}
    exact: list[int] = []
    for record in truth["stale_tokens"] + truth["partial_chunk_tokens"] + truth.get("kv_superseded_tokens", []):
        if record.get("batch") in completes:
            exact.append(completes[record["batch"]])
    for record in truth["in_flight_set_mismatches"]:
        # Only a request missing from the set while its batch is in flight (a
        # stale completion cleared it) lets the scheduler misbehave: at the
        # first schedule that schedules it again, or tries to and preempts it
        # (0.8.4 `Scheduler.schedule`: no block for it; seed 425 index 47). An
        # extra id (the counter drift) only holds the engine back, which shows
        # at `end` if it sticks.
        missing = set(record.get("missing", []))
        step = record.get("step", 0)
        again = [i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("step", -1) >= step
                 and missing & ({x["req"] for x in e["entries"]} | set(e.get("preempted", [])))]
        if again:
            exact.append(again[0])
    schedules = {e.get("step"): i for i, e in enumerate(events) if e["ev"] == "schedule"}
    for record in (truth.get("leftover_drafts", []) + _double_samples(truth, events)
                   + truth.get("negative_schedules", []) + truth.get("beyond_max_model_len", [])
                   + truth.get("kv_computed_on_invalid_kv", []) + truth.get("hits_on_unwritten_kv", [])):
        if record.get("step") in schedules:
            exact.append(schedules[record["step"]])
    exact.extend(_engine_choices(result, events))
    last = len(events) - 1
    counters = any(truth.get(key) for key in STATE_GONE_WRONG)
    if exact:      # at the event of the first bug, not before it; a counter gone wrong began before vLLM shows it
        return Expected("bug", None if counters else min([min(exact)] + _double_sample_attempts(truth, events)),
                        min(exact))
    looping = {loop["req"] for loop in truth.get("admission_livelocks", [])}
    if looping:                                           # L4 closes the lasso after a first round
        first = next((i for i, e in enumerate(events) if e["ev"] == "schedule"
                      and looping & set(e.get("preempted", []))), 0)
        return Expected("bug", first, last)
    if counters:
        return Expected("bug", None, last)                # a counter gone wrong: the checker's IF rules
    if result.get("stalls"):                              # a stall an input ended (run_endings.py): L2
        return Expected("stuck", None, last)
    if result["ending"] == "exception":
        return Expected("exception", None, last)          # the trace stops where vLLM raised
    if result["ending"] == "stuck" and result.get("left_to_clients"):
        return Expected("legal", None, None)              # parked sessions' clients' wait (run_endings.py)
    if result["ending"] in ("stuck", "blocked_in_flight") and events[-1]["ev"] == "end":
        return Expected(result["ending"], last, last)
    return Expected("legal", None, None)


def _double_sample_attempts(truth: dict[str, Any], events: list[dict[str, Any]]) -> list[int]:
    """Where each attempted double sample shows: the first event of its
    step (its schedule, or the event that carries the empty call). The drafts
    handed over at submission that tried it already made vLLM form another
    batch than without them (seed 425 index 64: nothing, where r2's last
    prompt tokens were due), so with a bug found a rejection may begin
    there; an attempt alone is no finding (the batch may be the same)."""
    return [next(i for i, e in enumerate(events) if e.get("step", -1) >= attempt["step"])
            for attempt in truth.get("double_sample_attempts", [])
            if any(e.get("step", -1) >= attempt["step"] for e in events)]


def _double_samples(truth: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The double samples but those whose entry in flight a failed load's
    rollback superseded before the new entry was scheduled: that entry's
    token is to be dropped (0.34.0 `Scheduler._update_requests_with_invalid_blocks`
    rolls the request back), so the new sampling entry samples no position
    twice, and the bug shows where the token is applied all the same
    (`kv_superseded_tokens`; seed 428 index 170). A rollback after the new
    entry leaves it a double sample (seed 425 index 137)."""
    superseded = {(late.get("batch"), late.get("req")) for late in truth.get("kv_superseded_tokens", [])}
    return [double for double in truth.get("double_samples", [])
            if (double.get("in_flight"), double.get("req")) not in superseded or not _rolled_back_between(double, events)]


def _rolled_back_between(double: dict[str, Any], events: list[dict[str, Any]]) -> bool:
    """A `kv_failed` of the request (or naming it a holder) between the
    schedule of the batch in flight and the schedule of the double sample."""
    carried = next((i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("batch") == double.get("in_flight")), None)
    again = next((i for i, e in enumerate(events) if e["ev"] == "schedule" and e.get("step") == double.get("step")), None)
    if carried is None or again is None:
        return False
    return any(e["ev"] == "kv_failed" and double.get("req") in {e["req"], *(h["req"] for h in e.get("holders", []))}
               for e in events[carried:again])


def _engine_choices(result: dict[str, Any], events: list[dict[str, Any]]) -> list[int]:
    """Where a trace numbering engine steps breaks E-a or E-b by the engine's
    own record (flightcheck/vllm/engine.py): the first event after a wait
    for input with batches in flight (steps missing from the trace), and the
    completion of a step whose gate a stale `scheduled_req_ids` closed where
    vLLM's own `schedule()`, without the stale ids, forms a batch."""
    numbered = [(i, e["engine_step"]) for i, e in enumerate(events) if "engine_step" in e]
    if not numbered:
        return []
    found = []
    for wait in result.get("waits_in_flight", []):
        after = [i for i, step in numbered if step >= wait["until"]]
        if after:
            found.append(after[0])
    for gated in result.get("gated_completions", []):
        if gated.get("would_schedule"):
            at = [i for i, step in numbered if step == gated["step"] and events[i]["ev"] == "complete"]
            if at:
                found.append(at[0])
    return found

"""What vLLM's own state shows about conformance, read by the recorder
(`RecordingMixin`, recording.py) around each call and kept, for the replay, in
`Observations`: ground truth that needs no checker.

* a token appended to a request whose incarnation changed since its batch
  was scheduled, or for a chunk that did not reach the request's known
  tokens when it was scheduled (written by `update_from_output`);
* (vLLM 0.8.4) `scheduled_req_ids` disagreeing with the batches actually in
  flight (`_fc_check_in_flight_set`);
* (0.33) a negative `num_in_flight_tokens` or `num_stale_output_tokens`, and
  `num_in_flight_tokens` disagreeing with the tokens of that request's
  batches actually in flight (`_fc_check_counters`);
* (0.33 `AsyncScheduler`) output placeholders breaching their invariants
  (`_fc_check_placeholders`);
* (speculative decoding) drafts left over, positions sampled twice, entries
  of fewer than 0 tokens or past `max_model_len`, and drafts held when slots
  are allocated (`_fc_watch_allocations`, `_fc_watch_drafts`);
* (0.33, 0.34, the priority policy) a `PriorityRequestQueue` left out of
  heap order by a streaming session's input (`_fc_check_priority_heaps`).

`GroundTruthMixin` holds those checks; it only reads vLLM's state (the one
method it wraps, `KVCacheManager.allocate_slots`, is called with the same
arguments and its result returned). `EntrySnapshot` and `BatchRecord` are
the batches in flight as the recorder saw them when they were scheduled:
what the checks compare vLLM's state against.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

from . import compat, grammar_recording
from .livelock_recording import LIVELOCK_REPEATS, LivelockWatch


@dataclass
class EntrySnapshot:
    """One request's share of a batch, as it was when the batch was scheduled."""
    req_id: str
    request: Any                 # the vLLM Request object scheduled (its identity matters)
    incarnation: int             # how many times that object had been admitted by then
    start: int
    n: int
    samples: bool


@dataclass
class BatchRecord:
    batch_id: int
    output: Any                  # the SchedulerOutput, kept so its id() stays unique
    entries: list[EntrySnapshot]


@dataclass
class Observations:
    """Ground truth read from vLLM's state, independent of any checker."""
    stale_tokens: list[dict[str, Any]] = field(default_factory=list)
    partial_chunk_tokens: list[dict[str, Any]] = field(default_factory=list)
    in_flight_set_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # vLLM >= 0.33 (requests with num_in_flight_tokens): its per-request counters.
    counts_in_flight: bool = False
    negative_counters: list[dict[str, Any]] = field(default_factory=list)
    in_flight_counter_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # vLLM 0.33's AsyncScheduler (a recorder with records_async_scheduling):
    # its output placeholders against the invariants they should keep.
    counts_placeholders: bool = False
    placeholder_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # Speculative decoding (num_spec_tokens > 0): drafts vLLM kept past an
    # entry that scheduled none of them or through a preemption, then
    # scheduled (or preempted the request trying to); and an entry that
    # samples a request while another sampling entry of the same request is
    # in flight (that position is sampled twice).
    spec_decoding: bool = False
    leftover_drafts: list[dict[str, Any]] = field(default_factory=list)
    double_samples: list[dict[str, Any]] = field(default_factory=list)
    # ... and a call that tried to (a running request with a sampling entry in
    # flight whose allocation, reaching into its drafts, found no room): no
    # entry, but the call formed another batch than without those drafts. Not
    # a finding alone; only where a rejection may begin (ground_truth.py
    # `expected_verdict`; seed 425 index 64).
    double_sample_attempts: list[dict[str, Any]] = field(default_factory=list)
    # ... and an entry of fewer than 0 tokens (num_computed_tokens past the
    # known tokens and drafts: 0.8.x's `num_new_tokens == 0` skip misses it).
    negative_schedules: list[dict[str, Any]] = field(default_factory=list)
    # ... and an entry reaching past max_model_len (vLLM 0.8.4 does not clip
    # the running loop to it; 0.8.5 does, "necessary when using spec decoding").
    beyond_max_model_len: list[dict[str, Any]] = field(default_factory=list)
    # ... and a request admitted (resumed) while holding drafts kept through a
    # preemption: 0.8.x's KVCacheManager.allocate_slots leaves
    # `len(spec_token_ids)` tokens out of the blocks it caches and lowers its
    # `num_cached_block` to that; a later allocation caches a block that has
    # a hash already (`assert blk.block_hash is None` in
    # BlockPool.cache_full_blocks) or a later prefix hit is smaller. Nothing
    # in the trace shows it before that.
    drafts_held_at_admission: list[dict[str, Any]] = field(default_factory=list)
    # ... and any allocation of slots while the request holds more drafts than
    # the entry schedules (the same under-caching, for a running request too).
    drafts_held_at_allocation: list[dict[str, Any]] = field(default_factory=list)
    # With a KV connector (kv_recording.py): a block that a request parked
    # for a load, or held for a transfer after it finished, still references
    # was back in the free pool (KV1); and blocks or requests not returned
    # once the run is over and every transfer reported (KV4).
    kv_connector: bool = False
    kv_blocks_freed_under_transfer: list[dict[str, Any]] = field(default_factory=list)
    kv_blocks_leaked_at_end: list[dict[str, Any]] = field(default_factory=list)
    # ... and, under async scheduling and the recompute policy, a rollback of
    # a failed load that keeps output placeholders (vLLM #49250: the
    # recompute is scheduled past the request's tokens, or an output of a
    # batch scheduled on the invalid KV is applied).
    kv_rollback_placeholders: list[dict[str, Any]] = field(default_factory=list)
    # ... and a token of a batch in flight at the rollback appended to the
    # request (the failing batch's own output is skipped, later ones not).
    kv_superseded_tokens: list[dict[str, Any]] = field(default_factory=list)
    # ... and a request sharing the invalid blocks whose rollback counts its
    # batches still in flight as computed (the base of one batch in flight).
    kv_holder_base_counts_later_batches: list[dict[str, Any]] = field(default_factory=list)
    # ... and an entry scheduled on a block a load reported invalid (recompute
    # policy) before any batch recomputed it (kv_invalid_recording.py; vLLM
    # #37827, the sharers of #49250).
    kv_computed_on_invalid_kv: list[dict[str, Any]] = field(default_factory=list)
    # With prefix caching: an admission whose prefix hit takes a block no
    # batch or load has wholly written (vLLM 0.8.x caching through a negative
    # full-block count), and each block cached while its writing fell short
    # of it (no finding by itself: the cause of such a hit); unwritten_kv_recording.py.
    hits_on_unwritten_kv: list[dict[str, Any]] = field(default_factory=list)
    blocks_cached_unwritten: list[dict[str, Any]] = field(default_factory=list)
    # Under the priority policy, a waiting queue whose heap a streaming
    # session's input left out of order (`_update_request_as_session` sets
    # the parked session's arrival_time where it sits in the heap).
    priority_heaps_out_of_order: list[dict[str, Any]] = field(default_factory=list)
    # A streaming session's input that `add_request` queued onto the session's
    # finished request, kept in `requests` while the KV connector holds its
    # blocks: nothing ever takes it (docs/vllm-kv-connector-findings.md, finding 5).
    session_inputs_lost: list[dict[str, Any]] = field(default_factory=list)
    # With streaming sessions (vLLM 0.33, 0.34), running requests plus sessions
    # waiting for input (`num_waiting_for_streaming_input`, which the waiting
    # loop counts as holding model-runner slots) above max_num_seqs: a session
    # a deliver-mode stale output stopped while PREEMPTED is parked and counted
    # though its slot went with the preemption (docs/request-states.md, "a
    # session stopped while preempted counts a seat it gave up"; SS4).
    session_seats_overcounted: list[dict[str, Any]] = field(default_factory=list)
    # vLLM 0.33, 0.34: a grammar failure is kept by id (`grammar_compile_error_reqs`,
    # filled in schedule()) and finished by id after the next update's outputs
    # (`finish_requests(..., FINISHED_ERROR)`): a request re-added under the id
    # of an aborted one whose grammar failed is finished with that error.
    grammar_errors_bound_by_id: list[dict[str, Any]] = field(default_factory=list)
    # A request preempted LIVELOCK_REPEATS times in a row from the same state
    # of every request (ids, tokens, statuses: no token appended, no input,
    # no arrival or finish between), of the batches in flight, the queues and
    # the free blocks: vLLM's scheduler is deterministic, so it
    # admits, prefills and preempts it for ever (`_fc_check_livelock`).
    admission_livelocks: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "stale_tokens": self.stale_tokens, "partial_chunk_tokens": self.partial_chunk_tokens,
            "in_flight_set_mismatches": self.in_flight_set_mismatches}
        if self.counts_in_flight:
            found.update(negative_counters=self.negative_counters,
                         in_flight_counter_mismatches=self.in_flight_counter_mismatches)
        if self.counts_placeholders:
            found.update(placeholder_mismatches=self.placeholder_mismatches)
        if self.spec_decoding:
            found.update(leftover_drafts=self.leftover_drafts, double_samples=self.double_samples,
                         double_sample_attempts=self.double_sample_attempts,
                         negative_schedules=self.negative_schedules,
                         beyond_max_model_len=self.beyond_max_model_len,
                         drafts_held_at_admission=self.drafts_held_at_admission,
                         drafts_held_at_allocation=self.drafts_held_at_allocation)
        if self.kv_connector:
            found.update(kv_blocks_freed_under_transfer=self.kv_blocks_freed_under_transfer,
                         kv_blocks_leaked_at_end=self.kv_blocks_leaked_at_end,
                         kv_rollback_placeholders=self.kv_rollback_placeholders,
                         kv_superseded_tokens=self.kv_superseded_tokens,
                         kv_holder_base_counts_later_batches=self.kv_holder_base_counts_later_batches)
        if self.kv_computed_on_invalid_kv:
            found.update(kv_computed_on_invalid_kv=self.kv_computed_on_invalid_kv)
        if self.hits_on_unwritten_kv or self.blocks_cached_unwritten:
            found.update(hits_on_unwritten_kv=self.hits_on_unwritten_kv,
                         blocks_cached_unwritten=self.blocks_cached_unwritten)
        if self.priority_heaps_out_of_order:
            found.update(priority_heaps_out_of_order=self.priority_heaps_out_of_order)
        if self.session_inputs_lost:
            found.update(session_inputs_lost=self.session_inputs_lost)
        if self.session_seats_overcounted:
            found.update(session_seats_overcounted=self.session_seats_overcounted)
        if self.grammar_errors_bound_by_id:
            found.update(grammar_errors_bound_by_id=self.grammar_errors_bound_by_id)
        if self.admission_livelocks:
            found.update(admission_livelocks=self.admission_livelocks)
        return found


# vLLM 0.33's per-request counters (`Request.__init__`), checked for sign.
COUNTERS = ("num_in_flight_tokens", "num_stale_output_tokens")


def status_name(request: Any) -> str:
    """A vLLM request's status by its enum name (RUNNING, PREEMPTED, FINISHED_...)."""
    return request.status.name


class GroundTruthMixin(LivelockWatch):
    """The recorder's checks of vLLM's state (see the module's docstring).
    Mixed into `RecordingMixin`, which calls them and owns the trace."""

    # Set by RecordingMixin (the recorder's state these checks read).
    flightcheck_step: int
    flightcheck_observations: Observations
    records_async_scheduling: bool
    _fc_in_flight: dict[int, BatchRecord]

    def _fc_start_ground_truth(self, spec_decoding: bool) -> None:
        """The checks' own state; with drafts, the allocation watch installed."""
        self.flightcheck_observations = Observations(spec_decoding=spec_decoding)
        self.flightcheck_observations.counts_placeholders = self.records_async_scheduling
        # ids of the requests whose allocate_slots found no room in the current
        # schedule() call (spec decoding only: the call is passed through).
        self._fc_failed_allocations: set[int] = set()
        if spec_decoding:
            self._fc_watch_allocations()
        self._fc_negative_seen: set[tuple[int, str]] = set()
        self._fc_placeholder_seen: set[tuple[int, str]] = set()
        self._fc_mismatch_seen: dict[int, int] = {}
        # id(Request) -> why the drafts it holds are left over (not proposed by
        # its latest completion): see Observations.leftover_drafts.
        self._fc_leftover_drafts: dict[int, str] = {}
        self._fc_seats_over = False      # running + parked sessions above max_num_seqs now
        self._fc_start_livelock_watch()

    def _fc_check_state(self, bound: Iterable[Any] = (), preempted: Iterable[str] = ()) -> None:
        """After every schedule() and update_from_output: vLLM's sets and
        counters against the batches in flight, and its seats. `bound`: the
        requests an output was applied to (looked up by id), whose counters
        are read even where vLLM finished and dropped them in the same update
        (a reused id's new request, failed by its grammar there); `preempted`:
        the ids schedule() just preempted."""
        self._fc_check_in_flight_set()
        self._fc_check_counters(bound)
        self._fc_check_placeholders()
        self._fc_check_session_seats()
        for req_id in preempted:
            self._fc_check_livelock(req_id)

    def _fc_check_grammar_errors(self) -> None:
        """Before an update: the grammar errors vLLM will finish by id at its
        end (`Scheduler.update_from_output`: `grammar_compile_error_reqs` ->
        `finish_requests(..., FINISHED_ERROR)`) whose id now names a live
        request that is not the one whose grammar failed (a reused id)."""
        for req_id in getattr(self, "grammar_compile_error_reqs", None) or {}:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished() \
                    and not grammar_recording.own_grammar_failed(request):
                self.flightcheck_observations.grammar_errors_bound_by_id.append(
                    {"step": self.flightcheck_step, "req": req_id})

    def _fc_check_session_seats(self) -> None:
        """Running requests plus sessions waiting for input within
        `max_num_running_reqs` (max_num_seqs); each time they go above it,
        recorded once (Observations.session_seats_overcounted)."""
        parked = getattr(self, "num_waiting_for_streaming_input", 0) or 0
        seats = getattr(self, "max_num_running_reqs", None)
        over = seats is not None and len(self.running) + parked > seats
        if over and not self._fc_seats_over:
            self.flightcheck_observations.session_seats_overcounted.append(
                {"step": self.flightcheck_step, "running": len(self.running), "parked": parked,
                 "max_num_seqs": seats})
        self._fc_seats_over = over

    def _fc_check_priority_heaps(self, req_id: str) -> None:
        """After a streaming session's input: every `PriorityRequestQueue`
        (`_heap`) still a heap by `Request.__lt__` (no child before its parent)."""
        for name in ("waiting", "kv_holding_waiting"):
            heap = getattr(getattr(self, name, None), "_heap", None)
            if isinstance(heap, list) and any(heap[i] < heap[(i - 1) // 2] for i in range(1, len(heap))):
                self.flightcheck_observations.priority_heaps_out_of_order.append(
                    {"step": self.flightcheck_step, "req": req_id, "queue": name,
                     "order": [r.request_id for r in heap]})

    def _fc_check_input_reaches_session(self, request: Any) -> None:
        """Before a streaming session's input: a real input (resumable) that
        `add_request` will queue onto a finished request (`existing` is still
        in `requests`, its blocks held for the KV connector) is lost."""
        existing = self.requests.get(request.request_id)     # type: ignore[attr-defined]
        if getattr(request, "resumable", False) and existing is not None and existing.is_finished():
            self.flightcheck_observations.session_inputs_lost.append(
                {"step": self.flightcheck_step, "req": request.request_id, "status": status_name(existing)})

    # -- speculative decoding ---------------------------------------------------------

    def _fc_watch_allocations(self) -> None:
        """Note each request whose `KVCacheManager.allocate_slots` returns
        None (no room: vLLM then preempts from the tail of `running`) for
        slots that reach into its drafts, calling
        vLLM's method with the same arguments and returning its result."""
        manager = self.kv_cache_manager
        allocate = manager.allocate_slots

        def allocate_slots(request: Any, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
            # Only a failure the drafts held caused counts: the known tokens
            # alone would have fit in the table and the free blocks.
            block_size = self.cache_config.block_size
            end = request.num_computed_tokens + num_tokens
            known_end = min(end, request.num_tokens)
            # (0.8.x's manager keeps `req_to_blocks`; a version without it is
            # not judged here: any failure reaching into drafts counts.)
            tables = getattr(manager, "req_to_blocks", None)
            held = len(tables.get(request.request_id, ())) if tables is not None else 0
            known_fits = tables is None or (-(-known_end // block_size) - held
                                            <= manager.block_pool.get_num_free_blocks())
            held_drafts = len(getattr(request, "spec_token_ids", ()) or ())
            if tables is not None and held_drafts > end - known_end:       # 0.8.x's manager
                # 0.8.x leaves every held draft out of the blocks it caches.
                self.flightcheck_observations.drafts_held_at_allocation.append({
                    "step": self.flightcheck_step + 1, "req": request.request_id,
                    "held": held_drafts, "scheduled": end - known_end})
            blocks = allocate(request, num_tokens, *args, **kwargs)
            if blocks is None and end > known_end and known_fits:
                self._fc_failed_allocations.add(id(request))
            return blocks

        manager.allocate_slots = allocate_slots

    def _fc_watch_drafts(self, batch_id: int | None, entries: list[tuple[EntrySnapshot, dict[str, Any]]],
                         running_before: list[Any], drafts_before: dict[int, bool]) -> None:
        """Speculative decoding's ground truth for one schedule() call (see
        Observations): vLLM 0.8.x keeps `spec_token_ids` when an entry
        schedules none of them (Scheduler.schedule trims only when
        `num_scheduled_spec_tokens > 0`) and through a preemption (which resets
        only the status and num_computed_tokens); 0.33 clears them in both."""
        observations = self.flightcheck_observations
        step = self.flightcheck_step
        was_running = {id(r) for r in running_before}
        for entry, written in entries:
            request = entry.request
            if id(request) not in was_running and request.spec_token_ids and not self.records_async_scheduling:
                observations.drafts_held_at_admission.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                              "drafts": len(request.spec_token_ids)})
            if entry.n < 0:
                observations.negative_schedules.append({"step": step, "req": entry.req_id, "n": entry.n})
            if entry.start + entry.n > self.max_model_len:
                observations.beyond_max_model_len.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                          "end": entry.start + entry.n})
            why = self._fc_leftover_drafts.get(id(request))
            if why is not None and written["drafts"]:
                observations.leftover_drafts.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                     "drafts": written["drafts"], "why": why})
            if entry.samples and not self.records_async_scheduling:
                # (AsyncScheduler schedules a decode on the placeholders of the
                # one in flight by design: no double sample there)
                earlier = next((b.batch_id for b in self._fc_in_flight.values() for e in b.entries
                                if e.request is request and e.incarnation == entry.incarnation and e.samples),
                               None)
                if earlier is not None:
                    observations.double_samples.append({"step": step, "batch": batch_id, "req": entry.req_id,
                                                        "in_flight": earlier})
            if id(request) in drafts_before and not written["drafts"] and request.spec_token_ids \
                    and not self.records_async_scheduling:
                # (AsyncScheduler's drafts after schedule() are fresh placeholders,
                # `_update_after_schedule`, never left over)
                self._fc_leftover_drafts.setdefault(id(request), f"left over by batch {batch_id}, which "
                                                                 f"scheduled none")
        failed, self._fc_failed_allocations = self._fc_failed_allocations, set()
        self._fc_watch_double_sample_attempts(batch_id, entries, running_before, failed)
        for request in running_before:
            if status_name(request) != "PREEMPTED":
                continue
            why = self._fc_leftover_drafts.get(id(request))
            # It preempted itself: its own allocation, its leftover drafts
            # counted in, found no room (read from allocate_slots' results).
            if why is not None and id(request) in drafts_before and id(request) in failed:
                observations.leftover_drafts.append({"step": step, "batch": batch_id, "req": request.request_id,
                                                     "drafts": len(request.spec_token_ids),
                                                     "why": why + "; preempted scheduling them"})
            if request.spec_token_ids and not self.records_async_scheduling:
                self._fc_leftover_drafts.setdefault(id(request), "proposed before its preemption")

    def _fc_watch_double_sample_attempts(self, batch_id: int | None, entries: list[tuple[EntrySnapshot, Any]],
                                         running_before: list[Any], failed: set[int]) -> None:
        """A running request this call left out because its allocation, its
        drafts counted in, found no room, while a sampling entry of it is in
        flight: sync engines hand a batch's drafts over at its submission
        (the `drafts_handed_over_at_submission` deviation), and 0.34.0
        `Scheduler.schedule` then tries the drafts first; when no block is
        free and the request behind cannot be preempted
        (`_request_blocks_can_be_freed`: in flight, the connector defers
        frees) the running loop breaks, and the call forms less than without
        those drafts (seed 425 index 64: nothing)."""
        if self.records_async_scheduling:
            return
        scheduled = {id(entry.request) for entry, _ in entries}
        for request in running_before:
            if id(request) in scheduled or id(request) not in failed or not request.spec_token_ids:
                continue
            admitted = self._fc_admitted(request)  # type: ignore[attr-defined]
            earlier = next((b.batch_id for b in self._fc_in_flight.values() for e in b.entries
                            if e.request is request and e.incarnation == admitted and e.samples), None)
            if earlier is not None:
                self.flightcheck_observations.double_sample_attempts.append({
                    "step": self.flightcheck_step, "batch": batch_id, "req": request.request_id,
                    "in_flight": earlier, "drafts": len(request.spec_token_ids)})

    def _fc_drafts_after(self, targets: dict[str, Any], dropped: list[str], model_runner_output: Any) -> dict[str, int]:
        """The drafts vLLM now holds for each request this output was applied
        to and that goes on (0.8.x: `update_from_output` sets `spec_token_ids`
        from the model's output), read from vLLM's requests, not the output;
        drafts just proposed replace any left over."""
        next_drafts = {req_id: len(target.spec_token_ids) for req_id, target in targets.items()
                       if target is not None and req_id not in dropped and not target.is_finished()
                       and getattr(target, "spec_token_ids", None)}
        if getattr(model_runner_output, "spec_token_ids", None) is not None:
            for req_id, target in targets.items():
                if target is not None and req_id not in dropped:
                    self._fc_leftover_drafts.pop(id(target), None)
        return next_drafts

    # -- vLLM's counters and sets against the batches in flight ---------------------

    def _fc_check_in_flight_set(self) -> None:
        """vLLM <= 0.8.4 keeps `scheduled_req_ids`, documented as the requests
        being executed; compare it with the unfinished requests that really have
        an entry in a batch in flight."""
        recorded = getattr(self, "scheduled_req_ids", None)
        if recorded is None:
            return
        truth = {e.req_id for batch in self._fc_in_flight.values() for e in batch.entries
                 if e.req_id in self.requests and self.requests[e.req_id] is e.request}
        if set(recorded) != truth:
            mismatches = self.flightcheck_observations.in_flight_set_mismatches
            if not mismatches or mismatches[-1]["extra"] != sorted(set(recorded) - truth) \
                    or mismatches[-1]["missing"] != sorted(truth - set(recorded)):
                mismatches.append({"step": self.flightcheck_step,
                                   "extra": sorted(set(recorded) - truth),
                                   "missing": sorted(truth - set(recorded))})

    def _fc_check_counters(self, bound: Iterable[Any] = ()) -> None:
        """vLLM 0.33 keeps, per request, `num_in_flight_tokens` (the tokens of
        its batches scheduled and not yet processed; += in
        `Scheduler._update_after_schedule`, -= in `update_from_output`, looked
        up by id) and `num_stale_output_tokens` (`_preempt_request`). Record
        each counter that goes negative, and the in-flight counter disagreeing
        with the tokens of this very Request object's batches in flight (it
        fails when an id is reused while the old request's batch is in flight).
        `also`: the requests an update just applied output to, which vLLM may
        have finished and dropped from `requests` in that update (a reused
        id's new request finished with an error: its counter went below 0
        all the same)."""
        observations = self.flightcheck_observations
        live = {id(request): request for request in self.requests.values()}
        dropped = [request for request in bound if request is not None and id(request) not in live]
        for request in [*live.values(), *dropped]:
            if not compat.counts_in_flight(request):
                return
            observations.counts_in_flight = True
            for name in COUNTERS:
                value = getattr(request, name, 0)
                if value < 0 and (id(request), name) not in self._fc_negative_seen:
                    self._fc_negative_seen.add((id(request), name))
                    observations.negative_counters.append({
                        "step": self.flightcheck_step, "req": request.request_id, "counter": name, "value": value})
            if request.is_finished():
                continue
            truth = sum(e.n for batch in self._fc_in_flight.values() for e in batch.entries
                        if e.request is request)
            if request.num_in_flight_tokens != truth and id(request) not in self._fc_mismatch_seen:
                self._fc_mismatch_seen[id(request)] = self.flightcheck_step
                observations.in_flight_counter_mismatches.append({
                    "step": self.flightcheck_step, "req": request.request_id,
                    "num_in_flight_tokens": request.num_in_flight_tokens, "in_flight": truth})

    def _fc_check_placeholders(self) -> None:
        """vLLM 0.33's AsyncScheduler: for every RUNNING request, its output
        placeholders (`num_output_placeholders`) should equal the tokens of
        its sampling entries in flight (one each, and one per draft scheduled
        with it), its counter should be `num_tokens + placeholders - 1` past
        a prefill chunk (`is_prefill_chunk` false, counter moved), and, without
        drafts (which may be rejected), its outputs plus placeholders should
        not pass `max_tokens`. Each first breach per
        request and rule is recorded (read-only; nothing is changed)."""
        if not self.records_async_scheduling:
            return
        in_flight: dict[int, int] = {}
        # a streaming session's entries of an ended turn (its stale share, oldest first) hold no placeholder
        stale_left = {id(r): r.num_stale_output_tokens for r in self.running if getattr(r, "resumable", False)}
        for batch in self._fc_in_flight.values():
            drafts = batch.output.scheduled_spec_decode_tokens
            for entry in batch.entries:
                if stale_left.get(id(entry.request), 0) > 0:
                    stale_left[id(entry.request)] -= entry.n
                    continue
                # the sampled token's placeholder and its drafts', for the
                # incarnation running now (a request reset in drop mode runs
                # again while its old entries are still in flight)
                if entry.samples and entry.incarnation == self._fc_admitted(entry.request):  # type: ignore[attr-defined]
                    in_flight[id(entry.request)] = (in_flight.get(id(entry.request), 0)
                                                    + 1 + len(drafts.get(entry.req_id, ())))
        spec = bool(getattr(self, "num_spec_tokens", 0))
        for request in list(self.running):
            if status_name(request) != "RUNNING":
                continue
            placeholders = int(request.num_output_placeholders)
            breaches = {
                "placeholders = sampling entries in flight": placeholders != in_flight.get(id(request), 0),
                "num_computed = num_tokens + placeholders - 1": (
                    not request.is_prefill_chunk and request.num_computed_tokens > 0
                    and request.num_computed_tokens != request.num_tokens + placeholders - 1),
                # (with drafts the placeholders count drafts that may be rejected)
                "outputs + placeholders <= max_tokens": (
                    not spec and request.num_output_tokens + placeholders > request.max_tokens),
            }
            for rule, broken in breaches.items():
                if broken and (id(request), rule) not in self._fc_placeholder_seen:
                    self._fc_placeholder_seen.add((id(request), rule))
                    self.flightcheck_observations.placeholder_mismatches.append({
                        "step": self.flightcheck_step, "req": request.request_id, "rule": rule,
                        "placeholders": placeholders, "num_computed_tokens": request.num_computed_tokens,
                        "num_tokens": request.num_tokens, "max_tokens": request.max_tokens})

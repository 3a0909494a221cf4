"""vLLM V1's scheduler with several batches in flight (v0.8.5 semantics, with
the later fixes for requests preempted, aborted or finished while in flight).

* `schedule()` forms one batch: running requests first, in order, each
  skipped when `num_new_tokens == 0` (its known tokens are all in flight, or
  it waits for its sampled token); the last running request is preempted when
  blocks run out; then, only if nothing was preempted, FCFS admission with
  prefix-cache hits. Each scheduled request's entry records its pre-batch
  counts (batch.py); once the batch is formed every `num_computed_tokens` is
  advanced, so the next prefill chunk of a request can go into the very next
  batch.
* `update_from_output()` (update.py) walks the entries of the completed
  batch (not `running`) and binds each output to the incarnation it was
  scheduled for: live (appended, spec-decode rejections subtracted),
  orphaned (preempted since, not rescheduled: appended, counter untouched)
  or superseded (dropped) (completion.py).

Where vLLM versions differ, the step reads a named constant of the version
profile (profiles.py), copied once by `__init__`, each at one step: under
`vllm-0.33` the threshold only with company (`_threshold_in_force`), the
sampled token's slot in the clip (`_clip`), the full-sequence admission gate
and the deferred resumption (`_schedule_waiting`), vLLM's own counters per
request (`num_in_flight_tokens`, `num_stale_output_tokens`,
`drop_stale_output`: `_count_in_flight`, `_mark_stale`, and
`update_from_output` looks each output up by id and judges it by them,
`_fate_by_counters`); with `enable_chunked_prefill` off, 0.33 and 0.34 stop
the waiting loop at a prompt that would need a chunk (`_stops_unchunked`),
0.34 drops the threshold then (`_threshold_in_force`), and 0.34 may reorder
`waiting` by cached prefix first (admission_order.py). With `SchedulerConfig.as_released` the reference's
later fixes (its named deviations) are switched off where a vLLM release
lacks them, each by a constant of its own (profiles.py `RELEASED`: the vLLM
differential's conforming run).

Under `vllm-0.33-async` (vLLM 0.33.0's `AsyncScheduler`, profiles.py
`async_scheduling`) every entry that is not a prefill chunk adds `1 + drafts`
output placeholders (`_add_placeholders`), the running loop counts them in a
request's new tokens, so a decode goes out before its previous token is back,
and skips a request past its max_tokens or inside its decode stagger
(`_is_async_skipped`); one `_num_new_tokens_running` serves sync and async
(placeholders are 0 without async); a live output settles them
(`_settle_placeholders`), preemption resets them.

With a KV connector (`config.kv_connector`) the connector's steps are
kv_transfer.py's and the waiting loop kv_waiting.py's (without one,
waiting.py's). The policy is
written as small named steps, and nothing else: it writes no trace (`TracingScheduler` in trace.py observes the public calls) and knows
no mutant (the verification's mutants are small edits of these named steps,
compiled and swapped in from outside: verification/mutants/reference.py).

Deliberate deviations from vLLM are listed in reference/README.md.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from collections.abc import Iterable, Sequence

from .batch import Batch, new_request_data
from .block_pool import KVCacheBlock
from .completion import Fate
from .config import SchedulerConfig
from .kv_cache_manager import KVCacheManager
from .outputs import CachedRequestData, RequestData, SchedulerOutput
from .request import Request, RequestStatus
from .drafts import DraftSources
from .kv_transfer import KvTransfers
from .kv_waiting import KvWaiting
from .priority import PriorityPolicy
from .sessions import StreamingSessions
from .reset_pause import ResetPause
from .update import OutputUpdate
from .grammar import Grammars
from .waiting import WaitingLoop
from .cadence import PrefillCadence
from .lora import LoraCap

__all__ = ["Fate", "Scheduler"]


class Scheduler(OutputUpdate, DraftSources, KvTransfers, KvWaiting, WaitingLoop, StreamingSessions,
                PriorityPolicy, ResetPause, Grammars, PrefillCadence, LoraCap):
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        # The version's rules (profiles.py), read once: the steps test these
        # named constants, never the version; each is tested at one step.
        profile = config.version_profile
        self.kv_cache_manager = KVCacheManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching,
            release_order=config.release_order,
            num_preallocate_tokens=config.num_preallocate_tokens,
            max_model_len=config.max_model_len,
            unhashed_blocks_to_head=profile.unhashed_blocks_to_head,
            caches_through_a_negative_count=profile.caches_through_a_negative_count)   # _cache_full_blocks
        self._threshold_needs_company = profile.threshold_needs_company   # _threshold_in_force
        self._sampled_token_slot = profile.sampled_token_slot             # _clip
        self._full_sequence_admission = profile.full_sequence_admission   # _schedule_waiting
        self._stale_output_counters = profile.stale_output_counters       # schedule, update
        self._stop_tokens_first = profile.stop_tokens_before_length       # _apply_sampled
        self._flush_finished_every_schedule = profile.flush_finished_every_schedule  # _make_output
        self._async = profile.async_scheduling                            # schedule, update
        self._read_draft_rules(profile)                                   # drafts.py
        # Chunked prefill off (_stops_unchunked) and 0.34's admission order
        # (_schedule_waiting); both in force only where the configuration asks.
        self._stops_unchunked_prefill = (profile.unchunked_prefill_stops_admission
                                         and not config.enable_chunked_prefill)
        self._threshold_off_unchunked = (profile.threshold_needs_chunked_prefill
                                         and not config.enable_chunked_prefill)
        self._priority = config.scheduling_policy == "priority"                     # priority.py
        self._victims_before = 0
        self._cache_aware_window = (config.cache_aware_admission_window
                                    if profile.cache_aware_admission and config.enable_prefix_caching
                                    and not self._priority else 0)
        self._read_release_rules(config)      # vLLM as released (all off but with `config.as_released`)
        self._decode_stagger = config.decode_stagger
        self.current_step = 0                 # vLLM's: +1 every schedule() call, empty ones too
        # The long-prefill threshold in force for the current schedule() call.
        self._threshold = config.long_prefill_token_threshold
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # One-batch-per-request policy only: requests with a batch in flight.
        self.scheduled_req_ids: set[str] = set()
        # Finished since the last batch was built; sent to the workers with it.
        self.finished_req_ids: set[str] = set()
        # Structured output: failed grammars the waiting loop met (grammar.py).
        self.grammar_compile_error_reqs: set[str] = set()
        self._incarnations = itertools.count()
        self._next_batch_id = 1
        self.num_steps = 0            # schedule() + update_from_output() calls
        self._one_batch_per_request = not config.continue_prefill
        self._init_kv(config)                 # the KV connector (kv_transfer.py), if any
        self.num_waiting_for_streaming_input = 0   # parked streaming sessions (sessions.py)
        self._init_reset_pause(profile)       # reset and pause (reset_pause.py)
        self._init_cadence(config.prefill_schedule_interval, profile.prefill_cadence)   # cadence.py

    def _read_release_rules(self, config: SchedulerConfig) -> None:
        """The profile's constants for vLLM as released (each off but with
        `config.as_released`), read once, each at the step named beside it."""
        profile = config.version_profile
        self._outputs_to_running_by_id = profile.outputs_to_running_by_id      # _bound_fate
        self._worker_decides_sampling = profile.worker_decides_sampling        # _tokens_taken
        self._drafts_from_every_output = profile.drafts_from_every_output      # update_from_output
        self._unscheduled_drafts_kept = profile.unscheduled_drafts_kept        # _schedule_running, _admit
        self._drafts_kept_through_preemption = profile.drafts_kept_through_preemption  # _preempt
        self._held_drafts_left_uncached = profile.held_drafts_left_uncached    # _allocate
        # _clip: the length a request is clipped to (0.8.4 as released: none).
        self._clip_max_model_len = sys.maxsize if profile.no_max_model_len_clip else config.max_model_len
        self._in_flight_mark_kept_off_running = profile.in_flight_mark_kept_off_running
        # vLLM 0.33 as released: _fate_by_counters, _predicted_fate; a KV load's error (kv_transfer.py).
        self._outputs_by_id_alone = profile.outputs_by_id_alone
        self._kv_errors_after_outputs, self._kv_rollback_in_place = (profile.kv_errors_after_outputs,
                                                                      profile.kv_rollback_in_place)

    # ------------------------------------------------------------------
    # Requests in and out
    # ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; a bad one raises ValueError and changes nothing.
        Under a streaming session's id (live, or held by the connector): its next input (sessions.py)."""
        if self.session_under(request.request_id) is not None:
            return self.add_session_input(request)
        self._validate_new_request(request)
        request.incarnation = request.first_incarnation = request.arrival_order = next(self._incarnations)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self._note_enqueued(request)          # a grammar to wait for is deferred (cadence.py)
        if self._priority:
            self._order_waiting()

    def _validate_new_request(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.incarnation != -1:
            raise ValueError(f"request {request.request_id!r} was already added to a scheduler")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        # One token must fit after the prompt (vLLM accepts == max_model_len
        # and finishes on the length check; we refuse it).
        limit = self.config.max_model_len - 1
        if request.num_prompt_tokens > limit:
            raise ValueError(f"prompt of request {request.request_id!r} has "
                             f"{request.num_prompt_tokens} tokens; at most {limit} "
                             f"(max_model_len - 1) fit")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens of request {request.request_id!r} must be at least 1, "
                             f"got {request.max_tokens}")

    def finish_requests(self, request_ids: str | Iterable[str],
                        finished_status: RequestStatus) -> None:
        """Finish requests from outside (abort). Unknown or finished ids are a no-op."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"{finished_status!r} is not a finished status")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            running = request.status == RequestStatus.RUNNING
            if running:
                self.running.remove(request)          # O(n), but aborts are rare
            else:
                self._remove_waiting(request)
                if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    self.num_waiting_for_streaming_input -= 1
            load_held = self.connector is not None and self._load_outlives_abort(request)
            request.status = finished_status
            request.incarnation = next(self._incarnations)
            request.orphaned_incarnation = None
            self._drop_in_flight_mark(request, running)
            self._free_request(request, load_held)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> None:
        """Its blocks go now, behind the step fence, or held for a transfer (kv_transfer.py)."""
        req_id = request.request_id
        if self.connector is not None:
            delay_free_blocks = self._connector_finished(request, delay_free_blocks)
        if not delay_free_blocks:
            self._free_request_blocks(request)
        del self.requests[req_id]
        self.finished_req_ids.add(req_id)

    def _drop_in_flight_mark(self, request: Request, running: bool) -> None:
        """One batch per request: the request leaves `scheduled_req_ids` when
        it is preempted or finished. `running`: it was RUNNING when this
        happened. vLLM 0.8.4 as released (`in_flight_mark_kept_off_running`)
        drops the mark only then (`update_from_output`, `finish_requests` of a
        RUNNING request): its preemption and an abort of a waiting request
        keep it, and `get_num_unscheduled_requests` drifts."""
        if running or not self._in_flight_mark_kept_off_running:
            self.scheduled_req_ids.discard(request.request_id)

    def has_unfinished_requests(self) -> bool:
        """vLLM's `get_num_unfinished_requests() > 0`: parked streaming sessions left out."""
        return len(self.waiting) + len(self.running) + len(self.kv_holding_waiting) > \
            self.num_waiting_for_streaming_input

    def has_requests(self) -> bool:
        """vLLM's `SchedulerInterface.has_requests`: unfinished requests (as
        a pause counts them), or finished ids no batch has carried to the
        workers yet (vLLM 0.33's engine schedules while this holds)."""
        return bool(self.get_num_unfinished_requests() or self.finished_req_ids or self.kv_held)

    def get_num_unscheduled_requests(self) -> int:
        """vLLM <= 0.8.4's engine gate for the one-batch-per-request policy."""
        return len(self.waiting) + len(self.running) - len(self.scheduled_req_ids)

    # ------------------------------------------------------------------
    # schedule()
    # ------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.num_steps += 1
        self.current_step += 1
        batch = Batch(self.config.max_num_batched_tokens, self.config.draft_input_slots, self.config.can_skip_drafts)
        self._threshold = self._threshold_in_force()
        self._start_cadence()                 # the prefill cadence (cadence.py)
        if self._runs_running_loop():         # the pause (reset_pause.py)
            self._schedule_running(batch)
        if not batch.preempted and self._runs_waiting_loop():   # no admission in a step that preempted
            self._schedule_waiting(batch)
            self._after_waiting_loop()
        self._end_cadence(batch)
        output = self._make_output(batch)
        self._update_after_schedule(batch)
        if self.connector is not None:
            self._kv_after_schedule(output, batch)
        if self._stale_output_counters:
            self._count_in_flight(batch)
        if self._async:
            self._add_placeholders(batch)
            self._mark_pending_structured_output(output, batch)    # grammar.py
        return output

    def _threshold_in_force(self) -> int:
        """The long-prefill threshold for this call (0: none). vLLM 0.33
        `Scheduler.schedule` drops it when `get_request_counts()` (running +
        waiting and parked loads, counted once before either loop) gives a lone request."""
        if self._threshold_needs_company and len(self.running) + len(self.waiting) + len(self.kv_holding_waiting) <= 1:
            return 0
        if self._threshold_off_unchunked:
            return 0                          # vLLM 0.34: only with chunked prefill
        return self.config.long_prefill_token_threshold

    def _count_in_flight(self, batch: Batch) -> None:
        """vLLM 0.33 `Scheduler._update_after_schedule`: `num_in_flight_tokens
        += n` for every scheduled request, beside the counter advance."""
        for request, entry in zip(batch.requests, batch.entries):
            request.num_in_flight_tokens += entry.num_new_tokens

    def _add_placeholders(self, batch: Batch) -> None:
        """vLLM 0.33 `Scheduler._update_after_schedule` (after the advance):
        `is_prefill_chunk = num_computed_tokens < num_tokens +
        num_output_placeholders`; then `AsyncScheduler._update_after_schedule`:
        every entry that is not a prefill chunk adds `1 + #drafts scheduled`
        placeholders (the sampled token it will return, its drafts) and makes
        the request's next decode wait `decode_stagger` schedule() calls
        (`next_decode_eligible_step`, the V2 runner's PP cadence)."""
        for request, entry in zip(batch.requests, batch.entries):
            request.is_prefill_chunk = request.num_computed_tokens < (
                len(request.all_token_ids) + request.num_output_placeholders)
            if request.is_prefill_chunk:
                continue
            request.num_output_placeholders += 1 + len(entry.spec_token_ids)
            request.next_decode_eligible_step = self.current_step + self._decode_stagger
            if self._placeholder_drafts:
                # "We will update the actual spec token ids in the worker process."
                request.spec_token_ids = self._placeholder_drafts

    def _is_async_skipped(self, request: Request) -> bool:
        """vLLM 0.33 `Scheduler.schedule`, running loop, before the token
        count: skip a request whose steps in flight surely reach max_tokens
        (`num_output_placeholders > 0 and num_computed_tokens + 2 -
        num_output_placeholders >= num_prompt_tokens + max_tokens`: at most
        one placeholder counted as sure, the rest may be rejected drafts),
        and one inside its decode stagger (`current_step <
        next_decode_eligible_step`)."""
        placeholders = request.num_output_placeholders
        if placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
            return True
        return self.current_step < request.next_decode_eligible_step

    def _schedule_running(self, batch: Batch) -> None:
        req_index = 0
        while req_index < len(self.running) and batch.token_budget > 0:
            request = self.running[req_index]
            if (self._async and self._is_async_skipped(request)) or self._held_in_running_loop(request):
                req_index += 1                # (a prefill chunk the cadence holds: cadence.py)
                continue
            num_new_tokens = self._num_new_tokens_running(request, batch.token_budget)
            if num_new_tokens == 0:
                req_index += 1                # nothing to schedule: tokens in flight
                continue
            num_drafts = self._num_scheduled_drafts(request, num_new_tokens) \
                if request.spec_token_ids else 0
            self._victims_before = 0
            new_blocks = self._allocate_or_preempt(request, num_new_tokens, num_drafts, batch)
            req_index -= self._victims_before  # priority: victims it had passed (vLLM #49097)
            if new_blocks is None:
                if self._priority and request.status == RequestStatus.PREEMPTED:
                    continue                  # priority: the next request now sits at req_index
                return                        # the request preempted itself (or a fenced victim)
            entry = self._cached_entry(request, request.num_computed_tokens, num_new_tokens,
                                       num_drafts, new_blocks, resumed=False)
            # Drafts the budget clipped are dropped (the spec drops them always,
            # as vLLM 0.33's schedule() does, so a clipped decode cannot leave
            # drafts behind to form a second sampling entry). vLLM 0.8.x as
            # released trims them only when some were scheduled.
            if len(request.spec_token_ids) != num_drafts and not (
                    num_drafts == 0 and self._unscheduled_drafts_kept):
                request.spec_token_ids = request.spec_token_ids[:num_drafts]
            if self._drafts_emptied_when_scheduled and request.spec_token_ids:
                request.spec_token_ids = ()   # vLLM 0.33: `request.spec_token_ids = []`
            self._add_to_batch(batch, request, entry)
            self._note_scheduled_running(request)   # `prefill_scheduled` (cadence.py)
            req_index += 1

    def _num_new_tokens_running(self, request: Request, token_budget: int) -> int:
        """vLLM `Scheduler.schedule`, running loop: `num_tokens_with_spec +
        num_output_placeholders - num_computed_tokens`, clipped; 0 (skip)
        while its known tokens are all in flight or it waits for its sampled
        token. The placeholders are 0 but under async scheduling (vLLM 0.33's
        `AsyncScheduler`), where the tokens in flight count as known, so a
        decode is scheduled while the previous one's token is still in flight
        (0.8.x has no placeholders: the same formula). One batch per request
        (0.8.4): 0 while the request is in `scheduled_req_ids`."""
        if self._one_batch_per_request and request.request_id in self.scheduled_req_ids:
            return 0                          # one batch per request
        num_computed = request.num_computed_tokens
        # num_tokens_with_spec, read directly: this runs for every running request.
        num_new_tokens = (len(request.all_token_ids) + len(request.spec_token_ids)
                          + request.num_output_placeholders - num_computed)
        if num_new_tokens > 0:
            return self._clip(num_new_tokens, num_computed, token_budget)
        return 0                              # its tokens are in flight, or it waits for one

    def _clip(self, num_new_tokens: int, num_computed: int, token_budget: int) -> int:
        """The threshold in force, the budget and the room below max_model_len,
        less the sampled token's slot under vLLM 0.33 (`Scheduler.schedule`:
        `max_model_len - num_computed_tokens - num_sampled_tokens_per_step`).
        0.33 clips so only in the running loop; in the waiting loop the clip
        never binds (an unfinished request has fewer than max_model_len
        tokens and its counter is 0 there), so one clip serves both. vLLM
        0.8.4 as released has no room clip (`no_max_model_len_clip`: the
        length clipped to, `_clip_max_model_len`, is unbounded)."""
        threshold = self._threshold
        if 0 < threshold < num_new_tokens:
            num_new_tokens = threshold
        # Comparisons, not min()/max(): on CPython 3.11 those builtins parse
        # their arguments slowly (~100 ns a call), and this runs per entry.
        if num_new_tokens > token_budget:
            num_new_tokens = token_budget
        room = self._clip_max_model_len - num_computed
        if self._sampled_token_slot:
            room -= self._sampled_token_slot
        if num_new_tokens > room:
            num_new_tokens = room
        return num_new_tokens if num_new_tokens > 0 else 0

    @staticmethod
    def _num_scheduled_drafts(request: Request, num_new_tokens: int) -> int:
        """Drafts are the tokens past the known ones (placeholders counted as
        known: vLLM 0.33 `n + num_computed_tokens - num_tokens -
        num_output_placeholders`); the budget may clip them."""
        overshoot = (request.num_computed_tokens + num_new_tokens - request.num_tokens
                     - request.num_output_placeholders)
        return max(0, min(len(request.spec_token_ids), overshoot))

    def _allocate_or_preempt(self, request: Request, num_new_tokens: int, num_drafts: int,
                             batch: Batch) -> list[KVCacheBlock] | None:
        """Blocks for the request, preempting the last running request (under
        the priority policy, priority.py's victim) until they fit; None if
        the request itself had to go."""
        while True:
            fits = self._unclipped_demand_fits(request, batch.token_budget)    # 0.8.4 (drafts.py)
            new_blocks = self._allocate(request, num_new_tokens, (), num_drafts) if fits else None
            if new_blocks is not None:
                return new_blocks
            victim = self._priority_victim() if self._priority else self.running[-1]
            if self._defer_block_free and not self._request_blocks_can_be_freed(victim):
                return None                   # vLLM: "A deferred free will not help"
            if self._priority:
                self._remove_priority_victim(victim, request, batch)
            else:
                self.running.pop()
            self._preempt(victim)
            if self._priority:
                self._order_waiting()
            if self._stale_output_counters:
                self._mark_stale(victim)
            batch.preempted.append(victim.request_id)
            if victim is request:
                return None

    def _allocate(self, request: Request, num_new_tokens: int,
                  computed_blocks: Sequence[KVCacheBlock], num_drafts: int) -> list[KVCacheBlock] | None:
        """`KVCacheManager.allocate_slots`; the scheduled drafts' tokens are
        not cached (they may be rejected). vLLM 0.8.x leaves out every draft
        the request holds, scheduled or not (`held_drafts_left_uncached`, on
        in the 0.8.x profiles)."""
        if self._held_drafts_left_uncached:
            num_drafts = max(num_drafts, len(request.spec_token_ids))
        return self.kv_cache_manager.allocate_slots(request, num_new_tokens, computed_blocks, num_draft_tokens=num_drafts,
                                                    num_lookahead_tokens=self.config.num_lookahead_tokens)

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: blocks freed, back to the head of `waiting`.
        Its in-flight entries become orphaned (a new incarnation begins). Its
        drafts are cleared (as vLLM 0.33's `_preempt_request`; 0.8.x keeps
        them: `drafts_kept_through_preemption`, on in the 0.8.x profiles)."""
        self._free_request_blocks(request)
        request.inflight_prefill = False
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = request.spec_token_ids if self._drafts_kept_through_preemption else ()
        request.orphaned_incarnation = request.incarnation
        request.incarnation = next(self._incarnations)
        self.waiting.appendleft(request)
        self._drop_in_flight_mark(request, running=False)

    def _mark_stale(self, request: Request) -> None:
        """vLLM 0.33 `Scheduler._preempt_request`: the tokens in flight become
        the stale share (assigned: the in-flight count already holds any
        undrained share); an undrained drop-mode share stays dropped."""
        request.drop_stale_output = self.config.drop_stale_output or self._kv_drops_stale or (
            request.drop_stale_output and request.num_stale_output_tokens > 0)
        request.num_stale_output_tokens = request.num_in_flight_tokens
        self._reset_placeholders(request)

    def _reset_placeholders(self, request: Request) -> None:
        """`_preempt_request` also resets the output placeholders (async only;
        0 otherwise): the outputs they stood for are stale now."""
        request.num_output_placeholders = 0

    def _is_resumption_deferred(self, request: Request) -> bool:
        """vLLM 0.33's waiting loop (`Scheduler.schedule`): `if
        request.num_stale_output_tokens and not request.drop_stale_output:
        skip_request`: resuming now could resample a position that stale
        output still to come delivers. 0.8.x has no such counter."""
        return bool(request.num_stale_output_tokens) and not request.drop_stale_output

    def _admit(self, request: Request, num_hit_tokens: int, num_new_tokens: int,
               new_blocks: list[KVCacheBlock]) -> RequestData:
        was_preempted = request.status == RequestStatus.PREEMPTED
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit_tokens
        request.num_cached_tokens = num_hit_tokens
        request.orphaned_incarnation = None   # rescheduled: old entries are superseded
        if was_preempted and request.spec_token_ids and not self._unscheduled_drafts_kept:
            request.spec_token_ids = ()       # drafts held through the preemption: none scheduled
        if was_preempted:
            return self._cached_entry(request, num_hit_tokens, num_new_tokens, 0, new_blocks,
                                      resumed=True)
        return new_request_data(request, num_hit_tokens, num_hit_tokens, num_new_tokens,
                                new_blocks)

    def _cached_entry(self, request: Request, start: int, num_new_tokens: int, num_drafts: int,
                      new_blocks: list[KVCacheBlock], resumed: bool) -> CachedRequestData:
        """A fresh snapshot of a running or resumed request: the known tokens
        it computes, its first `num_drafts` drafts, the blocks new to its
        table (batch.py); a resumed one's prefix hit (`_admit` set
        `num_cached_tokens`), 0 for a running one."""
        num_computed = request.num_computed_tokens
        num_known = num_new_tokens - num_drafts
        return CachedRequestData(
            request.request_id, request.incarnation, resumed,
            request.all_token_ids[num_computed:num_computed + num_known],
            tuple([b.block_id for b in new_blocks]) if new_blocks else (),
            start, num_new_tokens, request.num_cached_tokens if resumed else 0,
            request.spec_token_ids[:num_drafts] if num_drafts else (),
            # drafts count, as in vLLM's `_update_after_schedule` (`is_prefill_chunk`
            # from the count moved by the whole entry): the same whenever drafts
            # follow every known token, and not under a released profile after a
            # reused id's older batch rolled the new request's count back
            start + num_new_tokens >= len(request.all_token_ids))

    def _add_to_batch(self, batch: Batch, request: Request, entry: RequestData) -> None:
        batch.add(request, entry)
        if self._one_batch_per_request:
            self.scheduled_req_ids.add(request.request_id)

    def _make_output(self, batch: Batch) -> SchedulerOutput:
        batch_id = None
        finished_req_ids: set[str] = set()
        if batch.total_num_scheduled_tokens:
            batch_id, self._next_batch_id = self._next_batch_id, self._next_batch_id + 1
            # Only a batch that reaches the workers carries the finished ids.
            finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        elif self._flush_finished_every_schedule:
            # vLLM 0.33: the empty batch is queued too and carries them.
            finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        return batch.to_output(batch_id, finished_req_ids)

    def _update_after_schedule(self, batch: Batch) -> None:
        """The PR's move: advance num_computed_tokens now, at schedule time,
        once every entry holds its pre-batch counts, so the next prefill chunk
        can go into the very next batch."""
        for request, entry in zip(batch.requests, batch.entries):
            request.num_computed_tokens += entry.num_new_tokens
        if (self._drafts_at_submission or self._pads_admitted_decodes
                or self.local_prefill_interval > 1) and not self._async:
            self._mark_prefill_chunks(batch)      # (async: _add_placeholders marks them)

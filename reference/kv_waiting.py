"""The waiting loop with a KV connector (a mixin of `Scheduler`; vLLM
0.33.0 / 0.34.0 `Scheduler.schedule`, "Next, schedule the WAITING
requests"). Without a connector `Scheduler._schedule_waiting` runs instead,
unchanged.

* **Queues.** `kv_holding_waiting` (requests holding blocks: a load in
  flight or landed, or a partial failure's valid prefix) is drained before
  `waiting` (`kv_holding_first`); under vLLM 0.34 with a load limit,
  requests that may load asynchronously form `async_kv_waiting`, taken in
  arrival order against `waiting`'s head (`_next_waiting_queue`). Here
  `async_kv_waiting` is a view of `waiting` (`_may_load_async`): vLLM's
  skipped requests go back to the front of their queue in order, so each
  keeps its place, and each queue's order is its view's. A load started
  joins the back of `kv_holding_waiting` (0.34's `step_started_kv_loads`;
  0.33 puts it back with the skipped block-holders, which comes to the
  same: every one of them was looked at first). Under the priority policy
  both queues are heaps (priority.py): `kv_holding_waiting` is kept in rank
  order and a started load joins at its place; the heads are compared by
  rank. 0.34's cache-aware reorder (`_reorder_waiting_by_cached_prefix`)
  reads `waiting` proper alone: the view's `async_kv_waiting` requests keep
  their order.
* **Each request** (`_admit_or_park`): a parked one goes on only once its
  load has landed (`_promote_if_landed`); a fresh one (nothing computed)
  asks the connector for tokens beyond its local prefix hit: a sync hit is
  computed at once (the entry's `external`), an async one allocates
  (leaving the in-flight prefills' reservation free), parks the request
  and skips it.
* **0.34's loads-only mode**: with no running slot or token budget left,
  only `async_kv_waiting` is read, to start loads (they take neither); a
  load beyond `max_inflight_loads`, or a request that needs a slot then,
  stops that queue (`take_async_kv`), other queues go on.
* **Under PAUSED_NEW** (reset_pause.py) the loop reads `kv_holding_waiting`
  alone: a landed load is promoted and admitted, no load starts (vLLM goes
  on to the waiting queues, loads-only mode included, only UNPAUSED).
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch import Batch
from .block_pool import KVCacheBlock
from .priority import priority_key
from .request import KvLoad, Request, RequestStatus

PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS


@dataclass
class _Lookup:
    """What a request brings to its admission: the local prefix hit, the
    connector's tokens, and whether they load asynchronously."""
    computed_blocks: list[KVCacheBlock]
    num_local: int
    num_external: int
    load_async: bool

    @property
    def num_computed(self) -> int:
        return self.num_local + self.num_external


# The outcome of one request in the loop.
_ADMITTED, _SKIP, _STOP, _STOP_ASYNC = "admitted", "skip", "stop", "stop-async"


class KvWaiting:
    _priority: bool          # the scheduler's (priority.py)

    def _schedule_waiting_kv(self, batch: Batch) -> None:
        if self._cache_aware_window and not self.defer_prefills:      # a held call does not reorder (cadence.py)
            from .admission_order import reorder_by_cached_prefix
            reorder_by_cached_prefix(self.waiting, self.kv_cache_manager, self._cache_aware_window,
                                     self.config.cache_aware_admission_threshold,
                                     lambda request: not self._may_load_async(request))   # vLLM's `waiting` proper
        skipped: set[Request] = set()         # looked at in this pass: each keeps its place
        take_async_kv = True
        while True:
            # parked streaming sessions keep their seats (sessions.py: `num_waiting_for_streaming_input`)
            seats = self._seats_taken()       # type: ignore[attr-defined]
            loads_only = seats >= self.config.max_num_seqs or batch.tokens_left <= 0
            if loads_only and not self._kv_async_queue:
                break                         # vLLM 0.33: `while token_budget > 0`, max_num_seqs
            if not loads_only and batch.token_budget <= 0:
                break                         # `input_budget <= draft_slots` (batch.py)
            pick = self._next_candidate(skipped, take_async_kv, loads_only)
            if pick is None:
                break
            request, from_async = pick
            outcome = self._admit_or_park(request, batch, loads_only)
            if outcome == _SKIP:
                skipped.add(request)
                self._note_skipped(request)       # `skip_request`: the prefill cadence's deferred_waiting (cadence.py)
            elif outcome == _STOP_ASYNC and from_async:
                take_async_kv = False
            elif outcome in (_STOP, _STOP_ASYNC):
                break

    def _may_load_async(self, request: Request) -> bool:
        """In vLLM 0.34's `async_kv_waiting` (`_enqueue_waiting_request`):
        under the load limit, a fresh request the connector may load
        asynchronously (`may_load_async`; one whose grammar still compiles
        too: vLLM decides at arrival). Kept in `waiting`, in its place: the
        two queues are views of one."""
        return (self._max_inflight_loads is not None and request.num_computed_tokens == 0
                and request.status in (RequestStatus.WAITING, RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)
                and self.connector.may_load_async(request))

    def _next_candidate(self, skipped: set[Request], take_async_kv: bool,
                        loads_only: bool) -> tuple[Request, bool] | None:
        """The request the loop looks at next, and whether it is
        `async_kv_waiting`'s: `kv_holding_waiting` first, then whichever of
        `waiting`'s and `async_kv_waiting`'s heads arrived first
        (`_next_waiting_queue`, arrival order: `arrival_order`); in
        loads-only mode `async_kv_waiting` alone. None: the loop ends."""
        async_head = next((r for r in self.waiting if r not in skipped and self._may_load_async(r)), None)
        # PAUSED_NEW: `kv_holding_waiting` alone (reset_pause.py)
        unpaused = self._takes_waiting_queue()     # type: ignore[attr-defined]
        if loads_only:
            return (async_head, True) if unpaused and take_async_kv and async_head is not None else None
        held = next((r for r in self.kv_holding_waiting if r not in skipped), None)
        if held is not None:
            return held, False
        if not unpaused:
            return None
        plain = next((r for r in self.waiting if r not in skipped and not self._may_load_async(r)), None)
        if take_async_kv and async_head is not None and (plain is None or self._async_goes_first(async_head, plain)):
            return async_head, True
        return None if plain is None else (plain, False)

    def _async_goes_first(self, async_head: Request, plain: Request) -> bool:
        """`_next_waiting_queue`: `async_head < head` under the priority
        policy (`Request.__lt__`), else the earlier `arrival_time`. A
        session's is that of the input it took last (vLLM 0.34
        `_update_request_as_session` sets `session.arrival_time =
        update.arrival_time`): a session that took an input sent after a
        request of the other queue arrived goes after it (`arrival_order`)."""
        if self._priority:
            return priority_key(async_head) < priority_key(plain)
        return async_head.arrival_order < plain.arrival_order

    def _kv_lookup(self, request: Request) -> _Lookup:
        """A fresh request's local prefix hit and the connector's offer on
        top of it; a request with tokens computed (a landed load) neither."""
        if request.num_computed_tokens:
            return _Lookup([], 0, request.num_computed_tokens, False)
        blocks, num_local = self.kv_cache_manager.get_computed_blocks(request)
        num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
        if request.prompt_logprobs:           # vLLM: `skip_reading_external_kv` (0.33: `skip_reading_prefix_cache`)
            num_external, load_async = 0, False
        return _Lookup(blocks, num_local, num_external, load_async)

    def _admit_or_park(self, request: Request, batch: Batch, loads_only: bool) -> str:
        """One request of the loop (vLLM's loop body): promoted, skipped,
        parked for an async load, admitted, or the queue stops."""
        if (not self._promote_if_landed(request) or self._blocked_on_grammar(request)    # grammar.py
                or self._is_resumption_deferred(request)
                or request.status == RequestStatus.WAITING_FOR_STREAMING_REQ):     # sessions.py
            return _SKIP
        if self._held_by_lora_cap(request):   # max_loras (lora.py): after the promotion
            self._pass_over_emptied_load(request)
            return _SKIP
        landed = request.num_computed_tokens > 0
        lookup = self._kv_lookup(request)
        if (lookup.load_async and not self._admits_inflight_kv_load()) or (
                loads_only and not lookup.load_async):
            return _STOP_ASYNC
        if lookup.load_async:
            return self._park(request, lookup, batch)     # in a held call too: it computes nothing (cadence.py)
        if self._held_at_admission(request, lookup.num_computed):
            return _STOP                      # the prefill cadence holds a sync or landed load (cadence.py)
        # a landed load, or a sync one, with one token left: padded as any admission (waiting.py)
        padded = self._padded_decode(request, lookup.num_computed, batch) if self._pads_admitted_decodes else 0
        wanted = padded if padded > 0 else request.num_tokens - lookup.num_computed
        if self._stops_unchunked(wanted, batch.token_budget):
            return _STOP
        num_new_tokens = self._clip(wanted, lookup.num_computed, batch.token_budget)
        if num_new_tokens == 0 or padded < 0:
            return _STOP
        kv = self.kv_cache_manager
        if self._full_sequence_admission and not kv.fits_whole_sequence(
                request, lookup.computed_blocks, self.config.max_model_len):
            return _STOP
        num_to_allocate = num_new_tokens + (0 if landed else lookup.num_external)
        if self._allocate(request, num_to_allocate, lookup.computed_blocks, 0) is None:
            return _STOP
        self.connector.update_state_after_alloc(request, kv.get_block_ids(request.request_id),
                                                lookup.num_local, 0 if landed else lookup.num_external,
                                                False)
        self._remove_waiting(request)
        self._set_kv_load(request, KvLoad.NONE)
        request.inflight_prefill = self._kv_load_reservation and (
            lookup.num_computed + num_new_tokens < request.num_tokens or request.parked_reservation)
        entry = self._admit(request, lookup.num_computed, num_new_tokens,
                            list(kv.req_to_blocks.get(request.request_id, ())))
        entry.external = 0 if landed else lookup.num_external   # of its start: this batch loads them
        if padded:
            self._pad_drafts(request, entry, num_new_tokens)
        self._add_to_batch(batch, request, entry)
        return _ADMITTED

    def _pass_over_emptied_load(self, request: Request) -> None:
        """vLLM's `skip_request`: a promoted load that kept no block (nothing
        valid) goes back to `waiting`, at its head (`step_skipped_waiting`
        is prepended), not to `kv_holding_waiting`."""
        if request in self.kv_holding_waiting and not self.kv_cache_manager.req_to_blocks.get(request.request_id):
            self.kv_holding_waiting.remove(request)
            self.waiting.appendleft(request)
            if self._priority:
                self._order_waiting()                  # type: ignore[attr-defined]  (a heap push)

    def _park(self, request: Request, lookup: _Lookup, batch: Batch) -> str:
        """An async load: blocks for the local hit and the load (none cached
        until it lands, the in-flight prefills' reservation left free), then
        the request waits in WAITING_FOR_REMOTE_KVS."""
        kv = self.kv_cache_manager
        if self._full_sequence_admission and not kv.fits_whole_sequence(
                request, lookup.computed_blocks, self.config.max_model_len):
            return _STOP
        if kv.allocate_slots(request, lookup.num_external, lookup.computed_blocks,
                             reserved_blocks=self._reserved_blocks(), delay_cache_blocks=True) is None:
            return _STOP
        self.connector.update_state_after_alloc(request, kv.get_block_ids(request.request_id),
                                                lookup.num_local, lookup.num_external, True)
        request.status_before_load = request.status
        request.status = PARKED
        self._set_kv_load(request, KvLoad.IN_FLIGHT)
        request.num_computed_tokens = lookup.num_computed
        request.parked_reservation = self._kv_load_reservation
        request.kv_external = lookup.num_external
        self._remove_waiting(request)
        self.kv_holding_waiting.append(request)   # vLLM's `step_started_kv_loads`
        if self._priority:
            self._order_kv_holding()               # type: ignore[attr-defined]  (a heap push)
        batch.kv_loads.append((request.request_id, lookup.num_computed))
        return _SKIP

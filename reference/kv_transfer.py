"""The KV connector's scheduler-side bookkeeping (a mixin of `Scheduler`;
vLLM 0.33.0 / 0.34.0 `v1/core/sched/scheduler.py`, each step named after
the function it follows; docs/kv-connector.md).

Nothing here runs without a connector (`SchedulerConfig.kv_connector`
None): `_free_request_blocks` then frees at once and the rest is never
called. With one:

* **Holds.** A finished request whose blocks a transfer still uses leaves
  `requests` for `kv_held` (vLLM keeps it in `requests`; the reference keeps
  `requests` to live ones, so no output can bind to it): a producer's send
  (`_connector_finished`) or an aborted load (`finish_requests`); the report
  (`finished_sending`, `finished_recving`) frees the blocks.
* **The step fence** (`kv_step_fence`, a consumer with more than one batch
  in flight: vLLM's `defer_block_free`): a request's blocks freed while a
  batch that scheduled it is in flight wait in `deferred_frees` until that
  batch is processed (`_request_blocks_can_be_freed`,
  `_drain_deferred_frees`).
* **Reports** (`_take_kv_reports`, before the outputs; `_finish_kv_reports`,
  after): failures first (`_handle_failed_recving`, `_handle_invalid_blocks`),
  then the landings and sends (`_update_from_kv_xfer_finished`).
* **Rollback** (the recompute policy, `_roll_back`): the correct one. A
  failed block invalidates every token from its first one, so the request
  goes back to that block's start, and every entry of it still in flight
  reaches past it: all are dropped (a new incarnation; under vLLM's
  counters a drop-mode stale share of all its in-flight tokens) and its
  output placeholders reset; its next entry tells the worker so
  (`rolled_back`: it forgets the tokens it sampled for the dropped entries,
  as for a resumed request). vLLM 0.34.0's `_update_requests_with_invalid_blocks`
  takes the valid prefix's base from the failing batch alone and leaves the
  placeholders (#49250); the reference has no switch for that.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from .config import SchedulerConfig, cdiv
from .connector import FabricatedConnector, KvConnectorOutput
from .kv_cache_manager import KVCacheManager
from .block_pool import KVCacheBlock
from .outputs import EngineCoreOutput, RequestData, SchedulerOutput
from .request import KvLoad, Request, RequestStatus

PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS


class KvTransfers:
    """The connector's state and steps. `Scheduler` holds the rest."""

    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    requests: dict[str, Request]
    waiting: deque[Request]
    running: list[Request]
    _incarnations: itertools.count
    _stale_output_counters: bool
    _kv_rollback_in_place: bool               # vLLM as released (profiles.py)

    def _init_kv(self, config: SchedulerConfig) -> None:
        profile = config.version_profile
        connector = config.kv_connector
        self.connector = None if connector is None else FabricatedConnector(
            connector, config.block_size, profile.kv_async_loads, profile.kv_load_failures)
        on = connector is not None
        self._recompute_kv_failures = on and connector.load_failure_policy == "recompute"
        # vLLM `defer_block_free`: a consumer, and more than one batch in flight.
        self._defer_block_free = (on and profile.kv_step_fence and connector.consumer
                                  and config.batch_queue_depth > 1)
        self._kv_holding_first = on and profile.kv_holding_first
        self._kv_load_reservation = on and (profile.kv_load_reservation if config.kv_load_reservation is None
                                            else config.kv_load_reservation)
        self._kv_drops_stale = on and profile.kv_producer_drops_stale and connector.producer
        self._kv_aborted_load_held = on and profile.kv_aborted_load_held
        self._kv_send_after_finish = on and profile.kv_send_after_finish
        self._kv_async_queue = on and profile.kv_async_waiting_queue
        self._max_inflight_loads = connector.max_inflight_loads if on and self._kv_async_queue else None
        self.kv_holding_waiting: deque[Request] = deque()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.kv_held: dict[str, Request] = {}
        self._aborted_kv_loads: set[str] = set()
        self._num_kv_loads = 0                # requests whose kv_load is not NONE
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque[tuple[int, list[KVCacheBlock]]] = deque()
        # (kind, request id, from_block) per report processed by the last
        # update_from_output, for the trace: "kv_failed", "kv_received", "kv_sent".
        self.kv_reports_seen: list[tuple[str, str, int]] = []
        self._kv_reports: tuple[int, KvConnectorOutput, set[str], list[EngineCoreOutput]] | None = None

    # -- queues ------------------------------------------------------------

    def _remove_waiting(self, request: Request) -> None:
        for queue in (self.waiting, self.kv_holding_waiting):
            if request in queue:
                queue.remove(request)
                return
        raise ValueError(f"{request.request_id} is in no waiting queue")


    # -- freeing, holding, the step fence ---------------------------------

    def _request_blocks_can_be_freed(self, request: Request) -> bool:
        """vLLM `_request_blocks_can_be_freed`: no batch that scheduled the
        request is still unprocessed (always, without the fence)."""
        return not self._defer_block_free or request.last_sched_seq <= self.processed_step_seq

    def _free_request_blocks(self, request: Request) -> None:
        """vLLM `_free_request_blocks`: free now, or behind the fence."""
        if self._request_blocks_can_be_freed(request):
            self.kv_cache_manager.free(request)
            return
        blocks = self.kv_cache_manager.pop_blocks(request)
        if blocks:
            self.deferred_frees.append((self.sched_step_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        """vLLM `_drain_deferred_frees`: oldest first, up to the first whose
        batches are not all processed; each table's tail freed first."""
        while self.deferred_frees and self.deferred_frees[0][0] <= self.processed_step_seq:
            _, blocks = self.deferred_frees.popleft()
            self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))

    def _connector_finished(self, request: Request, delay_free_blocks: bool) -> bool:
        """vLLM `_free_request` / `_connector_finished`: whether the finished
        request's blocks stay held (an aborted load's, or a send's); a held
        request waits in `kv_held` for its report. The connector is handed
        the blocks that cover the computed tokens
        (`get_block_ids_for_computed_tokens`, 0.33/0.34): none, so no send,
        for a request finished with none computed (hunt seed 350 index 60:
        r0 rolled back to 0 by its failed load, #49250's placeholders kept,
        then stopped by that batch's token)."""
        table = self.kv_cache_manager.get_block_ids(request.request_id)
        block_ids = table[:cdiv(request.num_computed_tokens, self.config.block_size)]
        if self._kv_send_after_finish and self.connector.request_finished(request, block_ids):
            delay_free_blocks = True
        request.inflight_prefill = request.parked_reservation = False
        request.kv_external = 0
        load = request.kv_load
        self._set_kv_load(request, KvLoad.NONE)
        if delay_free_blocks and load in (KvLoad.IN_FLIGHT, KvLoad.FAILED):
            request.kv_load = load            # its report is still to come (counted as aborted)
        if delay_free_blocks:
            self.kv_held[request.request_id] = request
        return delay_free_blocks

    def _load_outlives_abort(self, request: Request) -> bool:
        """vLLM `finish_requests`: an aborted request whose load is in flight
        keeps its blocks until `finished_recving` (`delay_free_blocks`, and
        0.34 counts it in `_aborted_kv_loads`); one landed is freed now."""
        if request.status != PARKED:
            return False
        req_id = request.request_id
        delay = self._kv_aborted_load_held and req_id not in self.finished_recving_kv_req_ids
        self.finished_recving_kv_req_ids.discard(req_id)
        self.failed_recving_kv_req_ids.discard(req_id)
        if delay:
            self._aborted_kv_loads.add(req_id)
        return delay

    def _free_held(self, req_id: str) -> None:
        """A held request's transfer is over: its blocks go (behind the fence)."""
        request = self.kv_held.pop(req_id)
        request.kv_load = KvLoad.NONE
        self._aborted_kv_loads.discard(req_id)
        self._free_request_blocks(request)

    # -- schedule() --------------------------------------------------------

    def _kv_after_schedule(self, output: SchedulerOutput, batch: Any) -> None:
        """The fence's count of non-empty steps and each scheduled request's
        last one (vLLM `schedule`, `_update_after_schedule`: `sched_step_seq
        += 1`, `last_sched_seq`); an in-flight prefill's reservation ends
        with its last chunk (`_inflight_prefills.discard`)."""
        if output.total_num_scheduled_tokens:
            self.sched_step_seq += 1
        for request, entry in zip(batch.requests, batch.entries):
            request.last_sched_seq = self.sched_step_seq
            entry.rolled_back, request.kv_rolled_back = request.kv_rolled_back, False
            if self._defer_block_free:        # the blocks this batch writes (the spec's Entry.blocks)
                entry.fence_blocks = tuple(self.kv_cache_manager.get_block_ids(request.request_id))
            request.parked_reservation = False
            if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
                request.inflight_prefill = False

    # -- update_from_output: the reports -------------------------------------

    def prepare_kv_reports(self, scheduler_output: SchedulerOutput) -> set[str]:
        """The connector's reports for this output, and the failures among
        them applied (before any entry's output, as vLLM's
        `update_from_output` does): recomputed, or under the fail policy the
        request finished with an error at once, as an abort (vLLM as
        released, `kv_errors_after_outputs`: after the outputs, its entries
        skipped meanwhile; those requests are returned). Once per output:
        the tracer calls it first to read the fates."""
        if self._kv_reports is not None and self._kv_reports[0] == id(scheduler_output):
            return self._kv_reports[4]      # (the tracer asked first)
        self.kv_reports_seen = []
        reports = self.connector.worker_output(scheduler_output.entries)
        failed: set[str] = set()
        if reports.failed_recving:
            failed |= self._handle_failed_recving(reports.failed_recving)
        # The trace's failures: each load that failed, its request's own (docs/kv-connector.md).
        self.kv_reports_seen += [("kv_failed", req_id, first) for req_id, first in sorted(reports.failed_loads.items())]
        if reports.invalid_block_ids:
            failed |= self._handle_invalid_blocks(reports.invalid_block_ids, scheduler_output.entries)
        # Skipped: the failing requests' entries of this batch (recompute: a
        # rollback in place's, vLLM as released; the reference's rollback
        # drops them as a new incarnation's).
        skipped = failed if self._kv_rollback_in_place or not self._recompute_kv_failures else set()
        failed = set() if self._recompute_kv_failures else failed
        errors: list[EngineCoreOutput] = []
        if failed and not self._kv_errors_after_outputs:
            # While the failing batch still counts as in flight (the spec's
            # order): its blocks go behind the fence, never sooner.
            errors, failed, skipped = self._finish_with_error(failed), set(), set()
        if self._defer_block_free and scheduler_output.total_num_scheduled_tokens:
            self.processed_step_seq += 1      # vLLM: first thing in update_from_output
            self._drain_deferred_frees()
        self._kv_reports = (id(scheduler_output), reports, failed, errors, skipped)
        return skipped

    def _kv_skipped(self, entry: RequestData, skipped: set[str]) -> bool:
        return bool(skipped) and entry.req_id in skipped

    def _finish_with_error(self, req_ids: set[str]) -> list[EngineCoreOutput]:
        """The fail policy: `finish_requests(..., FINISHED_ERROR)`, in id
        order, or the configuration's `kv_error_order` (vLLM iterates a set)."""
        first = self.config.kv_error_order
        error_ids = [req_id for req_id in sorted(req_ids, key=lambda r: (first.index(r) if r in first
                                                                          else len(first), r))
                     if req_id in self.requests]
        self.finish_requests(error_ids, RequestStatus.FINISHED_ERROR)
        return [EngineCoreOutput(req_id, [], "error") for req_id in error_ids]

    def _finish_kv_reports(self, scheduler_output: SchedulerOutput) -> list[EngineCoreOutput]:
        """After the outputs: the errors (vLLM as released: now), then the
        landings and sends are taken (vLLM `update_from_output`,
        `_update_from_kv_xfer_finished`)."""
        _, reports, failed, outputs, _ = self._kv_reports
        self._kv_reports = None
        if failed:
            outputs = self._finish_with_error(failed)
        # (in id order: the bridge's connector hands vLLM its sets so ordered)
        for req_id in sorted(reports.finished_recving):
            self.kv_reports_seen.append(("kv_received", req_id, 0))
            request = self.requests.get(req_id)
            if request is not None and request.status == PARKED:
                self.finished_recving_kv_req_ids.add(req_id)
                self._set_kv_load(request, KvLoad.RECEIVED)
            else:
                self._free_held(req_id)   # aborted, or failed under the fail policy
        for req_id in sorted(reports.finished_sending):
            self.kv_reports_seen.append(("kv_sent", req_id, 0))
            self._free_held(req_id)
        return outputs

    def _handle_failed_recving(self, failed_req_ids: list[str]) -> set[str]:
        """vLLM `_handle_failed_recving`: a parked request's whole load failed;
        recompute from 0 (its blocks are released at promotion)."""
        affected = set()
        for req_id in failed_req_ids:
            self.kv_reports_seen.append(("kv_failed", req_id, 0))   # (its load's, aborted or not)
            request = self.requests.get(req_id)
            if request is None or request.status != PARKED:
                continue
            affected.add(req_id)
            self._set_kv_load(request, KvLoad.FAILED)
            if self._recompute_kv_failures:
                request.num_computed_tokens = 0
                self.failed_recving_kv_req_ids.add(req_id)
        return affected

    def _handle_invalid_blocks(self, invalid_block_ids: set[int],
                               entries: list[RequestData]) -> set[str]:
        """vLLM `_handle_invalid_blocks`: the parked requests, then the
        running ones, whose computed tokens lie in an invalid block
        (`_invalid_block_holders`) recompute, or fail (the fail policy: the
        running ones' blocks from there are evicted from the prefix cache)."""
        parked = [r for r in self.kv_holding_waiting if r.status == PARKED]
        starts = {entry.req_id: entry for entry in entries}
        to_evict: set[int] = set()
        affected = self._invalid_block_holders(parked, invalid_block_ids, starts, to_evict)
        affected |= self._invalid_block_holders(list(self.running), invalid_block_ids, starts, to_evict)
        if to_evict and not self._recompute_kv_failures:
            self.kv_cache_manager.block_pool.evict_blocks(to_evict)
        return affected

    def _invalid_block_holders(self, requests: list[Request], invalid_block_ids: set[int],
                               entries: dict[str, RequestData], to_evict: set[int]) -> set[str]:
        """vLLM `_update_requests_with_invalid_blocks`, over one queue: an
        invalid block is recomputed by the first request (in queue order)
        that holds it, which goes back to the start of its first such block
        (`_roll_back`); a later holder whose invalid blocks the earlier ones
        all recompute keeps them as computed and only loses the failing
        batch's tokens (vLLM: the shared blocks are rewritten before it reads
        them). Returns the holders (the fail policy finishes them all)."""
        block_size = self.config.block_size
        marked: set[int] = set()
        affected: set[str] = set()
        for request in requests:
            block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            entry = entries.get(request.request_id)
            batch_start = (entry.num_computed_tokens if entry is not None
                           and entry.incarnation == request.incarnation else request.num_computed_tokens)
            # vLLM as released looks only below the failing batch's own tokens
            computed = self._base_in_place(request, entry) if self._kv_rollback_in_place else request.num_computed_tokens
            num_blocks = -(-computed // block_size)
            held = [i for i, block_id in enumerate(block_ids[:num_blocks]) if block_id in invalid_block_ids]
            if not held:
                continue
            affected.add(request.request_id)
            first = next((i for i in held if block_ids[i] not in marked), None)
            marked.update(block_ids[i] for i in held)
            if request.status == PARKED:
                self._set_kv_load(request, KvLoad.FAILED)
                if self._recompute_kv_failures:
                    if first is not None:
                        request.num_computed_tokens = first * block_size
                    self.failed_recving_kv_req_ids.add(request.request_id)
            elif not self._recompute_kv_failures:
                if first is not None:
                    to_evict.update(block_ids[first:])
            elif self._kv_rollback_in_place:
                request.num_computed_tokens = computed if first is None else first * block_size
            elif first is not None:
                self._roll_back(request, first * block_size)
            elif batch_start != request.num_computed_tokens:
                self._roll_back(request, batch_start)
        return affected

    @staticmethod
    def _base_in_place(request: Request, entry: RequestData | None) -> int:
        """vLLM's valid-prefix base: `num_computed_tokens` less the failing
        batch's tokens for the request (none when it has no entry there)."""
        return request.num_computed_tokens - (entry.num_new_tokens if entry is not None else 0)

    def _roll_back(self, request: Request, valid_tokens: int) -> None:
        """A running request's sync load failed from `valid_tokens` on: it
        recomputes from there, and all of its work in flight (which starts
        at or past the failed load) is dropped: a new incarnation, and
        under vLLM's counters a drop-mode stale share of every token in
        flight, so the in-flight, stale and placeholder counts speak only of
        entries still live (none)."""
        request.num_computed_tokens = valid_tokens
        request.orphaned_incarnation = None
        request.incarnation = next(self._incarnations)
        if self._stale_output_counters:
            request.num_stale_output_tokens = request.num_in_flight_tokens
            request.drop_stale_output = True
        request.num_output_placeholders = 0
        request.spec_token_ids = ()
        request.kv_rolled_back = True         # the worker forgets what it sampled past the prefix

    # -- promotion -----------------------------------------------------------

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        """vLLM `_update_waiting_for_remote_kv`: the landed blocks are cached
        (those of the valid prefix after a failure; none valid: the table is
        released, a retry may hit the local cache); a load that covered
        every token leaves the last one to compute."""
        req_id = request.request_id
        if req_id in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(req_id)
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(req_id)

    def _promote_if_landed(self, request: Request) -> bool:
        """vLLM `_handle_blocked_waiting_request`: a parked request goes on
        only once its load has landed (promoted back to its status)."""
        if request.status != PARKED:
            return True
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self._update_waiting_for_remote_kv(request)
        request.status = request.status_before_load
        request.kv_external = 0
        return True                           # (its load counts until it is scheduled)

    def _set_kv_load(self, request: Request, state: KvLoad) -> None:
        """vLLM `_set_kv_fetch_stage`: a load counts against the limit from
        its start until its request is scheduled or freed."""
        if (request.kv_load is KvLoad.NONE) != (state is KvLoad.NONE):
            self._num_kv_loads += -1 if state is KvLoad.NONE else 1
        request.kv_load = state

    # -- the load limit and the reservation (0.33, 0.34) -----------------------

    def _admits_inflight_kv_load(self) -> bool:
        """vLLM 0.34 `_admits_inflight_kv_load`: loads in flight, landed and
        not promoted, and aborted ones stay below the limit."""
        limit = self._max_inflight_loads
        return limit is None or self._num_kv_loads + len(self._aborted_kv_loads) < limit

    def _remaining_blocks(self, request: Request) -> int:
        """vLLM `_request_remaining_blocks`: blocks the request still needs
        for its whole sequence, with drafts and one step of 1 + k tokens past it."""
        k = self.config.num_spec_tokens       # and a drafter's lookahead slots (`1 + k + num_lookahead_tokens`)
        tokens = min(request.num_tokens, self.config.max_model_len) + (1 + k + self.config.num_lookahead_tokens
                                                                       if k else 0)
        whole = -(-tokens // self.config.block_size)
        return max(0, whole - len(self.kv_cache_manager.req_to_blocks.get(request.request_id, ())))

    def _reserved_blocks(self) -> int:
        """What an async load may not take (vLLM's waiting loop, `reserved_blocks`
        of a `load_kv_async` admission): `_inflight_prefill_reserved_blocks`,
        what parked loads and running prefills still need, and with drafts
        `_spec_decode_step_blocks`, the blocks of one step of 1 + k tokens
        (and a drafter's lookahead slots: `1 + k + num_lookahead_tokens`)."""
        if not self._kv_load_reservation:
            return 0
        holders = [r for r in self.kv_holding_waiting if r.parked_reservation]
        holders += [r for r in self.running if r.inflight_prefill]
        k = self.config.num_spec_tokens
        spec_step_blocks = -(-(1 + k + self.config.num_lookahead_tokens) // self.config.block_size) if k else 0
        return sum(self._remaining_blocks(r) for r in holders) + spec_step_blocks

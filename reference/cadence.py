"""vLLM 0.33/0.34's local prefill cadence, a mixin of `Scheduler`
(`SchedulerConfig.prefill_schedule_interval` > 1 on an engine without data
parallelism; vLLM `Scheduler.__init__`, `Scheduler.schedule`).

A call made within the interval of the last prefill-carrying executed step
defers prefills while some running request decodes: the running loop skips
prefill chunks, the waiting loop stops at a request with more than one
token left to compute. The escape (vLLM PR #44558): a call that did not
defer records whether the waiting queue stayed backed up
(`prefill_capacity_bound`), and while it did, no call defers.

Beside a KV connector (kv_waiting.py): a skipped or parked request joins
`deferred_waiting` (`skip_request`); an async load starts in a held call
(it computes nothing, and restarts no interval); a sync or landed load
meets the same gate with its computed tokens. A held call does not run
vLLM 0.34's cache-aware reorder (`not defer_prefills`).
"""

from __future__ import annotations

from .batch import Batch
from .request import Request, RequestStatus


class PrefillCadence:
    def _init_cadence(self, interval: int, in_profile: bool) -> None:
        self.local_prefill_interval = interval if in_profile else 1
        self.last_prefill_step = -self.local_prefill_interval   # the first step is never held
        self.num_executed_steps = 0
        self.prefill_capacity_bound = False
        self.deferred_waiting: set[str] = set()     # waiting requests skipped since their admission
        self.defer_prefills = False

    def _start_cadence(self) -> None:
        """`defer_prefills` for this call, and what it must know after it."""
        self.defer_prefills = (
            self.local_prefill_interval > 1 and not self.prefill_capacity_bound
            and (self.num_executed_steps + 1) - self.last_prefill_step < self.local_prefill_interval
            and any(not r.is_prefill_chunk for r in self.running))
        self._prefill_scheduled = False
        self._was_running = {r.request_id for r in self.running}

    def _note_scheduled_running(self, request: Request) -> None:
        """The running loop scheduled `request` (vLLM `prefill_scheduled |=
        request.is_prefill_chunk`): noted as it is scheduled, so a chunk a
        priority preemption later takes back out of the batch (priority.py
        `_hand_back`) still restarts the interval, as in vLLM 0.33/0.34."""
        self._prefill_scheduled |= request.is_prefill_chunk

    def _held_in_running_loop(self, request: Request) -> bool:
        return self.defer_prefills and request.is_prefill_chunk

    def _held_at_admission(self, request: Request, num_computed: int) -> bool:
        return self.defer_prefills and num_computed < request.num_tokens - 1

    def _note_skipped(self, request: Request) -> None:
        if self.local_prefill_interval > 1:
            self.deferred_waiting.add(request.request_id)

    def _note_enqueued(self, request: Request) -> None:
        """`_enqueue_waiting_request`: a request joining a waiting queue (on
        arrival, or a streaming session's stop) is deferred iff its status
        blocks it (a grammar to wait for, a session parked for input); a
        stopped session leaves the set first."""
        if self.local_prefill_interval == 1:
            return
        if request.status in (RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
                              RequestStatus.WAITING_FOR_STREAMING_REQ, RequestStatus.WAITING_FOR_REMOTE_KVS):
            self.deferred_waiting.add(request.request_id)
        else:
            self.deferred_waiting.discard(request.request_id)

    def _after_waiting_loop(self) -> None:
        """vLLM: `num_waiting > len(deferred_waiting)`, both over `waiting` and
        `kv_holding_waiting` (a deferred request leaves the set when admitted
        or finished; ids of finished ones are not counted here)."""
        if self.local_prefill_interval > 1 and not self.defer_prefills:
            queued = [*self.waiting, *self.kv_holding_waiting]
            deferred = sum(1 for r in queued if r.request_id in self.deferred_waiting)
            self.prefill_capacity_bound = len(queued) > deferred

    def _end_cadence(self, batch: Batch) -> None:
        """Count the executed step; restart the interval from one that carried
        a prefill (a running prefill chunk scheduled, even if taken back, or an
        admission with more than one token left to compute). Runs before the
        counters advance."""
        if self.local_prefill_interval == 1:
            return
        carried = self._prefill_scheduled
        for request, entry in zip(batch.requests, batch.entries):
            self.deferred_waiting.discard(request.request_id)
            if request.request_id not in self._was_running:     # admitted: its hit is its start
                carried |= entry.num_computed_tokens < request.num_tokens - 1
        if batch.total_num_scheduled_tokens > 0:
            self.num_executed_steps += 1
        if carried:
            self.last_prefill_step = self.num_executed_steps

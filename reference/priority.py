"""The priority scheduling policy (vLLM's `SchedulingPolicy.PRIORITY`,
`SchedulerConfig.scheduling_policy == "priority"`, profiles `priority_policy`), as a
mixin of the scheduler.

`waiting` stays a deque, kept in `PriorityRequestQueue`'s order: by
priority (lower first), then arrival time, then request id (the heap's
`Request.__lt__`); a request joins at its place when it arrives and when it
is preempted. The running loop's victim is the running request of the
largest (priority, arrival time), wherever it sits in `running`: if the
loop already scheduled it in this call, everything it got goes back (its
entry, tokens, budget, drafts; its blocks go with the preemption), and if
it sat before the loop's index, the index moves back by one.

With a KV connector its queues are heaps too (`Scheduler.__init__`:
`create_request_queue(self.policy)` for `kv_holding_waiting` and
`async_kv_waiting`): `kv_holding_waiting` is kept in the same order (a load
started in a call joins at its place), and `async_kv_waiting`'s head goes
before `waiting`'s when it ranks first (`_next_waiting_queue`: `async_head <
head`), which, both being views of the one sorted `waiting`, is whichever
comes first in it.
"""

from __future__ import annotations

from collections import deque

from .batch import Batch
from .request import Request


def priority_key(request: Request) -> tuple[int, float, str]:
    """`Request.__lt__`: priority (lower first), arrival time, request id."""
    return request.priority, request.arrival_time, request.request_id


def _sort_ranked(queue: deque[Request]) -> None:
    """The queue in `priority_key` order, in place."""
    if len(queue) > 1:
        ordered = sorted(queue, key=priority_key)
        queue.clear()
        queue.extend(ordered)


class PriorityPolicy:
    """Mixed into `Scheduler` (reads its `waiting`, `running`)."""

    waiting: "deque[Request]"  # noqa: F821  (the scheduler's)
    running: list[Request]
    _victims_before: int      # victims removed from before the loop's index, this allocation

    def _order_waiting(self) -> None:
        """`waiting` in (priority, arrival time, id) order, as its heap pops
        it after a push onto it (an arrival, a preemption's
        `prepend_request`). That heap only: `kv_holding_waiting` is a heap
        of its own, which a push onto `waiting` leaves as it is, out of
        order too where a parked session's input changed its key in place
        (docs/request-states.md, "Finding: a session's input reorders a
        priority heap"; hunt seed 333 index 8: a preemption re-sorted it
        here, and r4 went ahead of the session vLLM admitted)."""
        _sort_ranked(self.waiting)

    def _order_kv_holding(self) -> None:
        """`kv_holding_waiting` in that order after a push onto it (a load
        started in the call: `step_started_kv_loads`)."""
        _sort_ranked(self.kv_holding_waiting)      # type: ignore[attr-defined]  (the connector's)

    def _priority_victim(self) -> Request:
        """`max(running, key=(priority, arrival_time))`: the first of the largest key."""
        return max(self.running, key=lambda r: (r.priority, r.arrival_time))

    def _remove_priority_victim(self, victim: Request, request: Request, batch: Batch) -> None:
        """`del self.running[victim_index]`, the index moved back when the
        victim sat before the request being scheduled (`victim_index <
        req_index`: the request is still at `req_index` while it is being
        allocated), and the hand-back of what the victim got in this call."""
        victim_index = self.running.index(victim)
        if victim_index < self.running.index(request):
            self._victims_before += 1
        del self.running[victim_index]
        if victim.request_id in batch.num_scheduled_tokens:
            self._hand_back(batch, victim)

    def _hand_back(self, batch: Batch, victim: Request) -> None:
        """The victim leaves the batch under construction: its entry, its
        scheduled tokens (back to the budget) and its scheduled drafts
        (`scheduled_spec_decode_tokens`)."""
        req_id = victim.request_id
        index = next(i for i, r in enumerate(batch.requests) if r is victim)
        entry = batch.entries[index]
        del batch.requests[index], batch.entries[index]
        (batch.new_reqs if entry in batch.new_reqs else batch.cached_reqs).remove(entry)  # type: ignore[arg-type]
        batch.restore(req_id)
        batch.spec_decode_tokens.pop(req_id, None)


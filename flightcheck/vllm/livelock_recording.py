"""The ground truth's livelock watch (`Observations.admission_livelocks`):
vLLM's `Scheduler.schedule` preempting a request twice in a row from one
state, with nothing from the environment between, loops so for ever.

What "one state" holds: every live request (identity, tokens, computed
tokens, status), what each batch in flight schedules, the waiting queues'
orders, the running list and the free blocks' count -- what `schedule()`
reads to decide -- and how many of the environment's events the recorder
has written (`_fc_note_event`). The last makes a recurrence that an event
between brought about no loop: a reset of the running requests rolls every
request back to the state a preemption left before (seed 388 index 40 of
the hunt over seeds 389-402, 0.33.0: r2 preempted at two schedule() calls
with two resets between, then it finished). The events that count are
check-trace's (verification/traces/lasso.py `quiet_completion`): anything
but a `schedule` and a completion that applied no token (every token it
returned dropped). Drafts proposed are no event of the environment: the
drafter's function of the request's tokens, held in the state (each
request's `spec_token_ids`), as check-trace holds them (seed 403 index 48
of the hunt over seeds 403-409, 0.34.0 async: r4 admitted, sampled,
proposed 2 drafts and preempted for their slots, its token dropped, round
again to the step limit, which neither named as a loop).

Found first as vLLM 0.33.0/0.34.0's admission gate
`KVCacheManager.allocate_slots(full_sequence_must_fit=True)` counting the
blocks of `request.num_tokens` and no lookahead slot, while every chunk's
allocation asks `num_lookahead_tokens` slots more: admitted, prefilled and
preempted again and again beside a parked session holding the other blocks.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

from typing import Any

from . import compat

# Preemptions in a row from one state that name a livelock: the second, one
# recurrence, as check-trace's L4_no_livelock names it. Three let a loop the
# environment ends after two rounds go unnamed (seed 388 index 43 of the
# hunt over seeds 364-395: the lookahead gate's loop, ended by two sessions'
# clients).
LIVELOCK_REPEATS = 2


def loud_event(event: dict[str, Any]) -> bool:
    """An event of the environment, or progress: anything but a `schedule`
    and a completion whose every returned token was dropped (check-trace's
    `quiet_completion`)."""
    kind = event.get("ev")
    if kind == "schedule":
        return False
    if kind != "complete":
        return True
    dropped = set(event.get("dropped") or ())
    return any(tokens and req not in dropped for req, tokens in event.get("tokens", {}).items())


class LivelockWatch:
    """Mixed into GroundTruthMixin: the recorder calls `_fc_note_event` for
    every event it writes and `_fc_check_livelock` for every request a
    `schedule()` preempted."""

    flightcheck_step: int
    flightcheck_observations: Any
    _fc_in_flight: dict[int, Any]
    # req_id -> (the state at its latest preemption, how many in a row found it so)
    _fc_preempted_from: dict[str, tuple[tuple, int]]
    _fc_loud_events: int = 0

    def _fc_start_livelock_watch(self) -> None:
        self._fc_preempted_from = {}
        self._fc_loud_events = 0

    def _fc_note_event(self, event: dict[str, Any]) -> None:
        """A trace event written: count it where it is the environment's."""
        if loud_event(event):
            self._fc_loud_events += 1

    def _fc_check_livelock(self, req_id: str) -> None:
        """A preemption that finds the state (`_fc_request_states`) as the
        same request's previous preemption left it: nothing progressed or
        came between, and vLLM's `Scheduler.schedule` is deterministic, so
        from there it loops for ever. Recorded once a request, at the
        LIVELOCK_REPEATS-th preemption in a row from that state, with the
        blocks its whole sequence needs with and without the lookahead slots
        (0.33.0/0.34.0 `KVCacheManager.allocate_slots`: the admission gate,
        `full_sequence_must_fit`, counts `request.num_tokens` alone; every
        chunk after asks `num_lookahead_tokens` slots more)."""
        request = self.requests.get(req_id)          # type: ignore[attr-defined]
        if self._fc_waits_on_environment():
            self._fc_preempted_from.pop(req_id, None)   # its report may change what comes next
            return
        state = self._fc_request_states()
        before, repeats = self._fc_preempted_from.get(req_id, ((), 0))
        repeats = repeats + 1 if state == before else 1
        self._fc_preempted_from[req_id] = (state, repeats)
        if repeats != LIVELOCK_REPEATS or request is None:
            return
        block_size = self.cache_config.block_size    # type: ignore[attr-defined]
        lookahead = int(getattr(self, "num_lookahead_tokens", 0) or 0)
        self.flightcheck_observations.admission_livelocks.append({
            "step": self.flightcheck_step, "req": req_id, "num_tokens": request.num_tokens, "repeats": repeats,
            "num_lookahead_tokens": lookahead, "blocks_of_sequence": -(-request.num_tokens // block_size),
            "blocks_with_lookahead": -(-(request.num_tokens + lookahead) // block_size),
            "free_blocks": self.kv_cache_manager.block_pool.get_num_free_blocks()})   # type: ignore[attr-defined]

    def _fc_waits_on_environment(self) -> bool:
        """Something the environment still reports, as check-trace's
        spec/deadlock.py `waits_on_environment` reads it: a KV load
        (WAITING_FOR_REMOTE_KVS), a finished request whose blocks vLLM holds
        for its connector (0.33.0/0.34.0 `Scheduler._free_request`: kept in
        `requests` while `delay_free_blocks`), a grammar compiling, or a
        failed grammar the next update finishes. A loop then may end at the
        report: seed 405 index 125 of the hunt over seeds 403-409 (0.34.0
        async, a producer), r3 preempted twice for a block r2's send
        held, its token dropped each time, then admitted at the send's end."""
        waiting = ("WAITING_FOR_REMOTE_KVS", "WAITING_FOR_FSM", "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR")
        for request in self.requests.values():       # type: ignore[attr-defined]
            if request.status.name in waiting or request.is_finished():
                return True
        return bool(getattr(self, "grammar_compile_error_reqs", None))

    def _fc_request_states(self) -> tuple:
        """Every live request's identity, tokens, computed tokens, status and
        drafts held, what each batch in flight schedules, oldest first, the queues and
        free blocks, and the environment's events so far. With batches in
        flight (pipeline stages, async) the requests alone can repeat while
        a token is on its way: 0.8.5 seed 396 index 76, four stages, r0
        admitted and preempted for r2's decode blocks from one request state
        three times while r2's sampling entry was in flight."""
        requests = tuple(sorted((req_id, id(r), r.num_tokens, r.num_computed_tokens, r.status.name,
                                 len(getattr(r, "spec_token_ids", None) or ()))
                                for req_id, r in self.requests.items()))   # type: ignore[attr-defined]
        batches = sorted(getattr(self, "_fc_in_flight", {}).values(), key=lambda record: record.batch_id)
        in_flight = tuple(tuple((e.req_id, id(e.request), e.start, e.n, e.samples) for e in record.entries)
                          for record in batches)
        return requests, in_flight, self._fc_queues_and_free_blocks(), self._fc_loud_events

    def _fc_queues_and_free_blocks(self) -> tuple:
        """The queues' orders and the free blocks' count: what `schedule()`
        reads beside the requests (which one it admits or preempts first,
        whether a chunk's blocks fit), so that one recurrence of the whole
        state is a loop, not two states that differ where the requests alone
        do not show it."""
        queues = tuple(tuple(r.request_id for r in compat.queued_requests(getattr(self, name)))
                       for name in ("waiting", "kv_holding_waiting") if hasattr(self, name))
        running = tuple(r.request_id for r in self.running)                          # type: ignore[attr-defined]
        return queues, running, self.kv_cache_manager.block_pool.get_num_free_blocks()  # type: ignore[attr-defined]

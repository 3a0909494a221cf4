"""The named properties of streaming sessions (spec/sessions.py;
docs/request-states.md, "Streaming sessions"), each read from vLLM 0.34.0's
scheduler: the predicates of SS2-SS5 (invariants, registered in
invariants.py) and of SS1 (a transition property, registered in
transitions.py). Each applies only where `sessions.has_sessions(cfg)`.

Abstracted away: what spec/sessions.py abstracts.
"""

from __future__ import annotations

from . import blocks, priority
from .config import Config
from .sessions import seats_taken, table_covers
from .state import Fate, Request, State, Status, content_label


def _is_session(q: Request) -> bool:
    return q.resumable and q.status.is_active


def ss1_old_output_never_bound(before: State, after: State, completed: tuple, cfg: Config) -> bool:
    """SS1: a streaming session's re-add never binds an old output to the new input: when a batch returns, an entry scheduled in an earlier turn of its session than the session's turn now changes none of its tokens (num_output, prompt, num_computed)."""
    for e in completed:
        b, a = before.requests[e.req], after.requests[e.req]
        if _is_session(b) and e.turn < b.turn and (a.num_output, a.prompt_len, a.num_computed) != (
                b.num_output, b.prompt_len, b.num_computed):
            return False
    return True


def ss2_old_turn_given_up(s: State, cfg: Config, r: int) -> bool:
    """SS2: at a session's stop every entry of the turn still in flight is given up: none is live, and the session's drop-mode stale count covers them all (`_handle_stopped_request`: drop_stale_output, num_stale_output_tokens = num_in_flight_tokens), so each is dropped when it returns."""
    q = s.requests[r]
    if not _is_session(q):
        return True
    old = [e for e in s.entries_of(r, fate=None) if e.turn < q.turn]
    if not old:
        return True
    return (all(e.fate is not Fate.LIVE for e in old) and q.drop_stale
            and q.num_stale >= sum(e.n for e in old))


def ss3_waiting_session_holds_blocks(s: State, cfg: Config, r: int) -> bool:
    """SS3: a session waiting for input (WAITING_FOR_STREAMING_REQ) holds the blocks of its computed tokens and nothing in flight for itself: no live entry, no drafts, no placeholders, no queued input; it waits in kv_holding exactly when it computed tokens (`_holds_kv_blocks`), and its next input finds every token but the last sampled one at most computed (`_update_request_as_session` asserts keep_end >= num_computed_tokens)."""
    q = s.requests[r]
    if q.status is not Status.WAITING_FOR_STREAMING_REQ:
        return True
    return (q.resumable and not s.entries_of(r) and q.num_drafts == 0 and q.placeholders == 0
            and not q.queued_inputs and (r in s.kv_holding_set) == (q.num_computed > 0)
            and table_covers(s, cfg, r) and q.num_computed <= q.num_tokens - 1)


def ss4_waiting_session_keeps_seat(s: State, cfg: Config) -> bool:
    """SS4: the sessions waiting for input keep their seats: running requests plus sessions waiting for input never exceed max_num_seqs (`num_waiting_for_streaming_input` in the waiting loop's admission cap)."""
    return seats_taken(s) <= cfg.max_num_seqs


def ss5_session_queues_in_priority_order(s: State, cfg: Config) -> bool:
    """SS5: under the priority policy the queues a session waits in (`waiting` and `kv_holding_waiting`, both `PriorityRequestQueue`s) stay in (priority, arrival) order: a session's input taken while it is parked (`_update_request_as_session`: `session.arrival_time = update.arrival_time`) must not leave its heap out of order."""
    if not priority.is_priority(cfg):
        return True
    for queue in (s.waiting, s.kv_holding):
        keys = [priority.rank(s, r) for r in queue]
        if keys != sorted(keys):
            return False
    return True


def sa10_stale_preemption_leaves_a_seat(s: State, cfg: Config, r: int) -> bool:
    """SA10 (auxiliary: with at most two batches in flight): a request preempted with deliver-mode stale output in flight (`_preempt_request`: num_stale_output_tokens = num_in_flight_tokens, drop_stale_output False) left its seat free, and nothing takes it before that output returns: the preempting call filled the batch queue (the call before it left one batch out, holding every token of the request in flight, and a call that preempts skips the waiting loop), so every entry of the request in flight is in the oldest batch, and running requests plus sessions waiting for input stay below max_num_seqs. (With a third batch a call between the preemption and the return may admit a request past the deferred resumption, and a stop by that output then breaks SS4: session-seats-k3.)"""
    q = s.requests[r]
    if q.status is not Status.PREEMPTED or q.num_stale <= 0 or q.drop_stale:
        return True
    return (len(s.in_flight) == cfg.queue_depth and all(e.req != r for batch in s.in_flight[1:] for e in batch)
            and seats_taken(s) < cfg.max_num_seqs)


def sa10_applies(cfg: Config) -> bool:
    """SA10 is a fact of the session models with at most two batches in flight."""
    return cfg.queue_depth <= 2


# "Sometimes" targets (registered in sometimes.py): the states a session
# model must reach, so that SS1-SS4 are not checked vacuously.
def waits_with_old_output_in_flight(s: State, cfg: Config, r: int) -> bool:
    """Session r waits for input while a batch of its last turn is still in flight."""
    q = s.requests[r]
    return q.status is Status.WAITING_FOR_STREAMING_REQ and any(e.turn < q.turn for e in s.entries_of(r, fate=None))


def runs_beside_old_output(s: State, cfg: Config, r: int) -> bool:
    """Session r runs its next turn while a batch of its previous turn is still in flight."""
    q = s.requests[r]
    return (q.status is Status.RUNNING and q.resumable
            and any(e.turn < q.turn for e in s.entries_of(r, fate=None)) and bool(s.entries_of(r)))


def seat_held_for_input(s: State, cfg: Config, r: int) -> bool:
    """Session r, waiting for input, holds the seat a waiting request would take."""
    return (s.requests[r].status is Status.WAITING_FOR_STREAMING_REQ and len(s.running) < cfg.max_num_seqs
            <= seats_taken(s) and any(q.status is Status.WAITING and not q.resumable for q in s.requests))


def kept_output_cached_for_its_lookup(s: State, cfg: Config, r: int) -> bool:
    """Session r, in a later turn and holding no computed tokens (preempted, or stopped while preempted), would hit in the prefix cache a prompt block past the prompt it arrived with: a block of its kept outputs, cached when it was an output block."""
    q = s.requests[r]
    if not (q.resumable and q.turn > 0 and q.num_computed == 0 and q.status in (Status.WAITING, Status.PREEMPTED)):
        return False
    labels = [content_label(s, r, i, cfg.block_size) for i in range(q.num_tokens // cfg.block_size)]
    return len(blocks.lookup_hit(s.pool, labels, (q.num_tokens - 1) // cfg.block_size)) > len(q.prompt_labels)


def finished_after_a_later_turn(s: State, cfg: Config, r: int) -> bool:
    """Session r finished by a stop or its length in a turn after its first."""
    q = s.requests[r]
    return q.status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH) and q.turn > 0

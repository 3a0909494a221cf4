"""Streaming sessions: vLLM's resumable requests (docs/request-states.md,
"Streaming sessions"), read in vLLM 0.34.0's `vllm/v1/core/sched/scheduler.py`
(0.33.0 has the same rules).

A session is one request (one slot, one name) whose input arrives in turns.
Its client sends the first input as an ordinary arrival, marked resumable;
each later input is an `add_request` under the session's live id, which
vLLM does not refuse (`Scheduler.add_request` finds `existing`): it is a
streaming update of the same request, not a new one. Where an id is reused
after its request finished (`Config.allow_name_reuse`, `actions.arrive_as`)
the spec brings in a new slot, a new incarnation; a session's update stays
in its slot and starts a new *turn* (`Request.turn`; each batch entry
records the turn it was scheduled in, `Entry.turn`).

The lifecycle: RUNNING -> (a stop: a stop token or the turn's max_tokens)
WAITING_FOR_STREAMING_REQ -> (the next input) WAITING -> RUNNING -> ... ->
(the end of the session) finished. A stop that finds an input already sent
(`streaming_queue`) goes on at once; the end of the session sent while the
session waits finishes it (`finish_requests(FINISHED_ABORTED)`), sent before
its stop finishes it at the stop.

At a stop (`_handle_stopped_request`) the turn's work still in flight is
given up: `num_computed_tokens` falls back to what is materialized
(placeholders taken off), drafts are dropped, and every token in flight
becomes stale output in drop mode (`drop_stale_output = True`,
`num_stale_output_tokens = num_in_flight_tokens`), so the outputs of the
batches launched before the stop are discarded when they return
(`update_from_output`). The session keeps its blocks (it is not freed) and,
while it waits for input, its seat: the waiting loop admits nobody while
`len(running) + num_waiting_for_streaming_input >= max_num_seqs`. The next
input (`_update_request_as_session`) keeps every output token but the last
sampled one (its KV was never computed) as prompt, appends the new tokens,
takes the update's max_tokens, and clears the outputs: the turn starts with
no output.

Under the priority policy (spec/priority.py) a session keeps the priority
of its first input (a `StreamingUpdate` carries none) and takes each
input's arrival time when it takes the input (`_update_request_as_session`:
`session.arrival_time = update.arrival_time`, the time the client sent it),
which the running loop's victim and every later push onto a queue read.
Its queues are `PriorityRequestQueue`s (`kv_holding_waiting` too): a stop
pushes it at its rank; an input taken while it is parked changes its
arrival time where it sits, and vLLM does not re-sort the heap, so the spec
leaves it in place too and SS5 (session_invariants.py) flags a queue left
out of order (docs/request-states.md, "Finding: a session's input reorders
a priority heap").

With prefix caching on, a turn's kept outputs and the next input become
prompt tokens (`_update_request_as_session` extends `prompt_token_ids` and
`_all_token_ids`, drops the block hashes from the block of the discarded
last token on, `del block_hashes[keep_end // hash_block_size:]`, and hashes
the new full blocks, `update_block_hashes`). The hashes of the full blocks
before that one stay: their tokens did not change. The spec's labels follow
that (state.py `content_label`): a session's prompt blocks past the prompt
it arrived with keep the label unique to (session, block) they had as
output blocks, and a block that fills up in a later turn gets that label
then. No block with such a label is cached before its tokens are final: a
block is cached when every token in it is known and scheduled
(`allocate_slots`, `cache_blocks`), and the discarded token's KV was never
computed (SS3: `num_computed <= num_tokens - 1` while the session waits).
A parked session keeps its blocks and its computed tokens, so its next turn
is admitted from them without a prefix lookup (the waiting loop looks up
only a request with `num_computed_tokens == 0`); a session preempted
before its stop looks up its whole prompt, kept outputs included, and hits
the blocks it cached as outputs.

Abstracted away: token ids (an input is its length, and its tokens are
taken to be the session's own: no other request's prompt shares a block
with them), multimodal features, sampling parameters other than
max_tokens and whether prompt logprobs are asked for, the hash function, the engine's front end (it delivers each
input as an `add_request`), and the pause states.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from . import cadence, priority
from .blocks import cdiv
from .config import Config
from .lora import take_input_logprobs
from .state import Fate, Request, State, Status, retire_entries

# How a request finishes (actions.finish_request, actions.end_by_stop),
# passed in: the actions call into this module, not the other way.
Finish = Callable[[State, Config, int, Status], State]

# The end of a session, as an input: vLLM's `StreamingUpdate.from_request`
# of a request that is not resumable (None in `streaming_queue`).
END_OF_SESSION = (0, 0)

# An input is `(new tokens, max_tokens)`, or `(new tokens, max_tokens, 1)`
# when its sampling parameters ask for prompt logprobs (spec/lora.py).
ASKS_PROMPT_LOGPROBS = 1


def asks_prompt_logprobs(sent: tuple[int, ...]) -> bool:
    """Whether an input's sampling parameters ask for prompt logprobs."""
    return len(sent) > 2 and sent[2] == ASKS_PROMPT_LOGPROBS


def has_sessions(cfg: Config) -> bool:
    """Sessions are on and the profile has them (vLLM 0.33, 0.34)."""
    return cfg.streaming_sessions and cfg.rules.streaming_sessions


def open_session(state: State, cfg: Config, r: int, inputs: tuple[tuple[int, ...], ...]) -> State:
    """r arrived resumable (`Request.resumable`; `add_request` gives it a
    `streaming_queue`): the client will send `inputs` after its prompt."""
    if not has_sessions(cfg) or not inputs:
        return state
    return state.with_request(r, resumable=True, inputs_to_send=inputs)


def waiting_for_input(state: State) -> int:
    """vLLM's `num_waiting_for_streaming_input`: the sessions parked for input."""
    return sum(1 for q in state.requests if q.status is Status.WAITING_FOR_STREAMING_REQ)


def end_parked_sessions(state: State, cfg: Config, finish: Finish) -> State:
    """The state after every parked session's client sent the end of its
    session: vLLM `Scheduler.add_request` finds the session in
    WAITING_FOR_STREAMING_REQ and `finish_requests(FINISHED_ABORTED)` frees
    what it held between turns, its blocks (`_free_request`) and its seat
    (`num_waiting_for_streaming_input -= 1`); it held no LoRA slot, which
    the waiting loop counts from `running` alone (`scheduled_loras`).
    Which idles wait on a client (deadlock.py, L2) reads this."""
    for r, q in enumerate(state.requests):
        if q.status is Status.WAITING_FOR_STREAMING_REQ:
            state = finish(state, cfg, r, Status.FINISHED_ABORTED)
    return state


def seats_taken(state: State) -> int:
    """What the waiting loop counts against max_num_seqs: the running
    requests and the sessions waiting for input (`Scheduler.schedule`:
    paused sessions still hold a model-runner slot)."""
    return len(state.running) + waiting_for_input(state)


def is_send_enabled(state: State, cfg: Config, r: int) -> bool:
    """The client may send r's next input: r is an unfinished session with
    inputs left (an input sent to a finished session is not modelled: its
    id would name a new request)."""
    if not has_sessions(cfg) or not 0 <= r < len(state.requests):
        return False
    q = state.requests[r]
    return q.resumable and q.status.is_active and bool(q.inputs_to_send)


def send_input(state: State, cfg: Config, r: int, finish: Finish) -> State | None:
    """vLLM `Scheduler.add_request` under r's live id: while r waits for
    input the update applies at once (the end of the session finishes it,
    `finish`: `finish_requests`); otherwise it is queued (`streaming_queue`)
    for r's next stop."""
    if not is_send_enabled(state, cfg, r):
        return None
    q = state.requests[r]
    sent, rest = q.inputs_to_send[0], q.inputs_to_send[1:]
    state = _stamp_input(state.with_request(r, inputs_to_send=rest), cfg, r, sent)
    if q.status is not Status.WAITING_FOR_STREAMING_REQ:
        return state.with_request(r, queued_inputs=q.queued_inputs + (sent,))
    if sent == END_OF_SESSION:
        return finish(state, cfg, r, Status.FINISHED_ABORTED)
    # in place: vLLM leaves r where it sits in its queue (a heap under the
    # priority policy, not re-sorted: SS5 flags a queue left out of order)
    return _take_input(state, cfg, r, sent)


def _stamp_input(state: State, cfg: Config, r: int, sent: tuple[int, ...]) -> State:
    """Where r's arrival is kept (`arrivals`: under the priority policy, and
    under FCFS beside vLLM 0.34's load limit, whose `_next_waiting_queue`
    compares arrival times: actions.py `_offer_of_connector`): the input's
    arrival time (vLLM's `StreamingUpdate.arrival_time`, the time the
    client sent it; the end of the session is no update and has none),
    recorded as a later place of r. r's first place stays its arrival time
    (`priority.rank`, kv_loads.py `_arrived_before`) until the input is
    taken (`_take_input`). Otherwise: nothing."""
    if r not in state.arrivals or sent == END_OF_SESSION:
        return state
    return replace(state, arrivals=state.arrivals + (r,))


def _take_input(state: State, cfg: Config, r: int, sent: tuple[int, ...]) -> State:
    """vLLM `_update_request_as_session`: the outputs but the last sampled
    one become prompt (its KV was never computed), the new tokens join it,
    the turn's outputs start again from none under the update's max_tokens,
    and r waits to be scheduled (in the queue it already is in). Where its
    arrival is kept r takes the input's arrival time (`session.arrival_time
    = update.arrival_time`: r's first place in `arrivals` goes, its next is
    the input's; under FCFS vLLM 0.34's `_next_waiting_queue` then puts r
    behind an async load that arrived before the input) and keeps its
    priority (the update carries none).

    A structured session keeps its grammar and its FSM where the last turn
    left it (`_update_request_as_session` replaces the sampling parameters
    but not `structured_output_request`; the FSM accepted every output of
    the turn, the last sampled one too, before `_handle_stopped_request`).
    The spec's FSM counts from the turn's start (`fsm` back to 0 with the
    outputs): a mask is compared only with the FSM of its own turn, since
    an earlier turn's entries are dropped (SS1), so the offset is not
    state. Its prompt-logprobs flag: the input's under vLLM 0.34, the
    first input's under 0.33 (spec/lora.py `take_input_logprobs`)."""
    q = state.requests[r]
    kept = q.num_tokens - 1         # vLLM asserts kept >= num_computed_tokens: SS3 states it
    new_tokens, max_tokens = sent[0], sent[1]
    if state.arrivals.count(r) > 1:                  # the input was stamped (`_stamp_input`)
        first = state.arrivals.index(r)
        state = replace(state, arrivals=state.arrivals[:first] + state.arrivals[first + 1:])
    state = state.with_request(r, prompt_len=kept + new_tokens, num_output=0, max_tokens=max_tokens,
                               status=Status.WAITING, fsm=0)
    return take_input_logprobs(state, cfg, r, asks_prompt_logprobs(sent))


def _in_rank_order(state: State, cfg: Config, queue: str) -> State:
    """Under the priority policy `waiting` and `kv_holding_waiting` are
    `PriorityRequestQueue`s (`Scheduler.__init__`: `create_request_queue(
    self.policy)` for both): a session pushed onto one (`add_request`)
    takes its place by `priority.rank`; the other heap is not sifted. (A
    session whose input is taken while it waits in one changes its arrival
    time in place, not re-sorted: `send_input`.) FCFS: unchanged."""
    return priority.ranked(state, queue) if priority.is_priority(cfg) else state


def stop_session(state: State, cfg: Config, r: int, stop: Status, finish: Finish) -> State:
    """vLLM `_handle_stopped_request` and the re-enqueueing after it in
    `update_from_output`: r stopped (`stop`, FINISHED_STOPPED or _LENGTH, as
    `check_stop` set it). Its turn's in-flight work is given up (drop-mode
    stale output); an input already queued starts the next turn at once
    (the end of the session finishes r with `stop`, `finish`), else r waits for one.
    Either way it leaves the queue it was in for the tail of `kv_holding`
    (it holds blocks) or `waiting` (`_enqueue_waiting_request`)."""
    q = state.requests[r]
    state = retire_entries(state, r, frozenset({Fate.LIVE, Fate.ORPHANED}), Fate.SUPERSEDED)
    state = state.with_request(r, num_computed=q.num_computed - q.placeholders, num_drafts=0,
                               drop_stale=True, num_stale=q.num_in_flight, placeholders=0,
                               turn=q.turn + 1)
    if q.queued_inputs and q.queued_inputs[0] == END_OF_SESSION:
        return finish(state.with_request(r, queued_inputs=q.queued_inputs[1:]), cfg, r, stop)
    if not q.queued_inputs:
        parked = _requeue(state, cfg, r).with_request(r, status=Status.WAITING_FOR_STREAMING_REQ)
        return cadence.note_enqueued(parked, cfg, r)    # parked: in `deferred_waiting` (cadence.py)
    # the input is taken before the re-enqueueing (`_handle_stopped_request`
    # returns, then `_enqueue_waiting_request`): r is pushed with its new arrival
    state = state.with_request(r, queued_inputs=q.queued_inputs[1:])
    return cadence.note_enqueued(_requeue(_take_input(state, cfg, r, q.queued_inputs[0]), cfg, r), cfg, r)


def _requeue(state: State, cfg: Config, r: int) -> State:
    """Out of `running` (or, stopped by a stale output while preempted, out
    of the waiting queues) and onto the tail of `kv_holding` if r holds
    blocks (`_holds_kv_blocks`: computed tokens), else of `waiting`
    (`_enqueue_waiting_request`; at its rank under the priority policy)."""
    state = replace(state, running=tuple(x for x in state.running if x != r),
                    waiting=tuple(x for x in state.waiting if x != r),
                    kv_holding=tuple(x for x in state.kv_holding if x != r))
    if state.requests[r].num_computed > 0:
        return _in_rank_order(replace(state, kv_holding=state.kv_holding + (r,)), cfg, "kv_holding")
    return _in_rank_order(replace(state, waiting=state.waiting + (r,)), cfg, "waiting")


def waits_for_input(state: State, r: int) -> bool:
    """The waiting loop skips r (`_handle_blocked_waiting_request` returns
    False for WAITING_FOR_STREAMING_REQ); it keeps its place."""
    return state.requests[r].status is Status.WAITING_FOR_STREAMING_REQ


def session_holds_blocks(q: Request) -> bool:
    """A session between turns that keeps its computed tokens' blocks
    (vLLM's `_holds_kv_blocks`: num_computed_tokens > 0)."""
    return q.resumable and q.status in (Status.WAITING, Status.WAITING_FOR_STREAMING_REQ) and q.num_computed > 0


def table_covers(state: State, cfg: Config, r: int) -> bool:
    q = state.requests[r]
    return len(q.block_table) >= cdiv(q.num_computed, cfg.block_size)

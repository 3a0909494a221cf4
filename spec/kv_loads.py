"""The KV connector in `schedule`'s waiting loop: which request is looked at
next, what the connector offers it, an async load's parking and a landed
load's promotion (vLLM 0.34.0 `Scheduler.schedule`, waiting loop; 0.33.0
where it agrees).

* Order (`kv_holding_waiting`, `Profile.kv_holding_first`): waiting requests
  that hold KV blocks (parked and landed loads, `State.kv_holding`) are
  looked at before `waiting`. Under vLLM 0.34's load limit
  (`Profile.kv_inflight_load_limit` with `KvConnector.max_inflight_loads`),
  the fresh requests the connector may load asynchronously form
  `async_kv_waiting` (here: the requests of `waiting` with such an offer
  not yet asked for), whose head goes first when it arrived first
  (`_next_waiting_queue`); with no running slot or no budget left the loop
  only starts loads from that queue (loads-only mode). A skipped request
  keeps its place; a request whose load starts joins `kv_holding`'s tail
  (`step_started_kv_loads`).
* The offer (`get_num_new_matched_tokens`): asked only when nothing is
  computed, once per request (contract C1: afterwards it offers 0): the
  prompt's `external_hit`, clipped to the tokens past the local hit (a sync
  hit leaves the last token to compute, block aligned).
* Parking: an async hit allocates blocks for local + external tokens
  (uncached until the load lands: `delay_cache_blocks`) where they fit
  beside the blocks loads and prefills in flight are reserved, sets
  `num_computed` and parks the request in WAITING_FOR_REMOTE_KVS.
* Promotion (`_handle_blocked_waiting_request`, `_update_waiting_for_remote_kv`):
  a landed load's blocks are cached up to `num_computed`; a failed load
  whose valid prefix is empty frees them; a load that covered every token
  leaves the last one to compute (`num_tokens - 1`).

A streaming session (sessions.py) is asked at its first turn only: its
later turns keep their blocks in `kv_holding` (no lookup); waiting for
input it is skipped, keeps its seat (loads-only mode) and reserves nothing
beside an async load (`_holds_load`); admitted from there in the call that
parks a load, it reserves only a chunk short of its tokens, as any
admission (it is in neither 0.33's `_inflight_prefills` nor 0.34's
`_parked_reservations`: `Walk.parked` holds loads alone).

Abstracted away: the connector's own matching (its offer is the
environment's, fixed at arrival), partial-tail hits, HiSparse's deferred
loads and parked reservations (`_reserve_parked`), the DSV4 replay window
and the encoder connector. Under PAUSED_NEW the loop takes
`kv_holding_waiting` alone and starts no load (`request_queue` goes on to
the waiting queues, loads-only mode included, only UNPAUSED;
reset_pause.py). Under the priority policy the queues are heaps
(priority.py: `kv_holding` sorted by rank, the heads compared by rank).
vLLM 0.34's cache-aware reorder (admission_order.py) reorders `waiting`
proper alone: `async_kv_waiting`'s requests, a view of `waiting` here,
keep their order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import blocks, cadence, lookahead, priority
from .config import Config
from .drafts import keeps_prefill_chunk_flag
from .reset_pause import takes_waiting_queue
from .state import Load, Request, State, Status, content_label


@dataclass
class Walk:
    """One waiting loop's bookkeeping: the requests skipped or parked in
    this call (each keeps its place, looked at no more), and whether
    `async_kv_waiting` may still be taken from (`take_async_kv`)."""

    skipped: set[int] = field(default_factory=set)
    take_async: bool = True
    # Loads taken from `kv_holding`: each keeps its reservation through its admission in this
    # call (vLLM 0.34 `Scheduler.schedule`: `request in self._parked_reservations`; 0.33: in
    # `_inflight_prefills` since its park). A session between turns there holds none.
    parked: set[int] = field(default_factory=set)


def load_limit(cfg: Config) -> int | None:
    """`max_num_inflight_kv_loads` where the profile has it, else None."""
    kv = cfg.kv_connector
    return kv.max_inflight_loads if kv is not None and cfg.rules.kv_inflight_load_limit else None


def may_load_async(state: State, cfg: Config, r: int) -> bool:
    """r belongs to `async_kv_waiting`: under the load limit, a fresh
    request (never asked) offered an async load (`_enqueue_waiting_request`:
    `connector.may_load_async`, at arrival, whatever its status: one whose
    grammar still compiles joins it too, and the loop meets it there)."""
    q = state.requests[r]
    return (load_limit(cfg) is not None and q.load is Load.NONE and q.load_async and q.num_computed == 0
            and q.status in (Status.WAITING, Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR))


def loads_in_flight(state: State) -> int:
    """`_kv_fetch_counts[IN_PROGRESS] + [COMPLETED_WAITING] + len(_aborted_kv_loads)`:
    loads in flight (aborted and failed ones included), and landed loads of
    unfinished requests not yet running."""
    return sum(1 for q in state.requests
               if q.load.in_transfer or (q.load is Load.RECEIVED and q.status.is_active))


def admits_inflight_load(state: State, cfg: Config) -> bool:
    """`_admits_inflight_kv_load`: a new async load stays within the limit."""
    limit = load_limit(cfg)
    return limit is None or loads_in_flight(state) < limit


def _head(queue: tuple[int, ...], walk: Walk) -> int | None:
    return next((r for r in queue if r not in walk.skipped), None)


def next_candidate(state: State, cfg: Config, walk: Walk, loads_only: bool) -> tuple[int, str] | None:
    """The request the loop looks at next and its queue ("holding", "async",
    "waiting"), or None: the loop ends (its queue is empty)."""
    async_head = _head(tuple(r for r in state.waiting if may_load_async(state, cfg, r)), walk)
    unpaused = takes_waiting_queue(state)            # under PAUSED_NEW: `kv_holding_waiting` alone
    if loads_only:
        return (async_head, "async") if unpaused and walk.take_async and async_head is not None else None
    held = _head(state.kv_holding, walk)
    if held is not None:
        if _holds_load(state, held):        # a session between turns is in no reservation
            walk.parked.add(held)
        return held, "holding"
    if not unpaused:
        return None
    plain = _head(tuple(r for r in state.waiting if not may_load_async(state, cfg, r)), walk)
    if walk.take_async and async_head is not None and (plain is None or _goes_first(state, cfg, async_head, plain)):
        return async_head, "async"
    return None if plain is None else (plain, "waiting")


def _goes_first(state: State, cfg: Config, async_head: int, plain: int) -> bool:
    """`_next_waiting_queue`: FCFS by arrival time, or by rank under the priority policy."""
    ranked = priority.async_head_first(state, cfg, async_head, plain)
    return _arrived_before(state, async_head, plain) if ranked is None else ranked


def _arrived_before(state: State, a: int, b: int) -> bool:
    """FCFS by arrival time (`_next_waiting_queue`)."""
    order = state.arrivals
    return a in order and (b not in order or order.index(a) < order.index(b))


def is_blocked(state: State, r: int) -> bool:
    """`_handle_blocked_waiting_request` returns False: a parked request
    whose load has not landed."""
    q = state.requests[r]
    return q.status is Status.WAITING_FOR_REMOTE_KVS and q.load is not Load.RECEIVED


def connector_offer(state: State, cfg: Config, r: int, local_tokens: int) -> tuple[int, bool]:
    """`get_num_new_matched_tokens`: (external tokens, load async); a
    prompt-logprobs request drops the offer (0.33 `skip_reading_prefix_cache`,
    0.34 `skip_reading_external_kv`: its cache-hit limit is 0)."""
    q = state.requests[r]
    if cfg.kv_connector is None or q.load is not Load.NONE or q.external_hit == 0 or q.prompt_logprobs:
        return 0, False
    if q.load_async:
        external = min(q.external_hit, q.num_tokens - local_tokens)
        return max(0, external), external > 0
    external = min(q.external_hit, q.num_tokens - 1 - local_tokens)
    external -= external % cfg.block_size
    return max(0, external), False


def pass_over(state: State, cfg: Config, r: int) -> State:
    """`skip_request` of a request the LoRA cap passes over: it keeps its
    place, but a promoted load that left no block (nothing valid) leaves
    `kv_holding_waiting` for the head of `waiting` (`step_skipped_waiting`,
    prepended: looked at first, it goes first; under the policy a heap push)."""
    if r not in state.kv_holding or state.requests[r].block_table:
        return state
    state = replace(state, kv_holding=tuple(x for x in state.kv_holding if x != r), waiting=(r,) + state.waiting)
    return priority.in_priority_order(state, cfg)


def fits_beside_reservations(state: State, cfg: Config, r: int, hit: tuple[int, ...], computed: int,
                             admitted: Sequence[Any] = (), parked: Collection[int] = ()) -> bool:
    """An async load's allocation leaves the blocks other loads and prefills
    in flight still need (`allocate_slots(reserved_blocks=...)` with
    `_inflight_prefill_reserved_blocks`: parked and landed loads, and running
    requests still prefilling, each short of its whole sequence's blocks,
    `_request_remaining_blocks`), and with drafts the blocks of one step of
    1 + k tokens (`_spec_decode_step_blocks`; each holder's whole sequence
    then counts one such step past it too; no look-ahead slots are modelled).
    `admitted`: the entries this call's waiting loop admitted so far; each
    counts only if its chunk stops short of the request's tokens or it was a
    parked load (`parked`): vLLM adds it to `_inflight_prefills` when
    `num_computed_tokens + num_new_tokens < num_tokens` or it is in
    `_parked_reservations`, before `_update_after_schedule` moves its count."""
    step = lookahead.step_tokens(cfg)      # with drafts, one step's blocks (`_spec_decode_step_blocks`)
    reserved = blocks.cdiv(step, cfg.block_size)
    chunk_ends = {entry.req: entry.start + entry.n for entry in admitted}
    for h, q in enumerate(state.requests):
        prefilling = q.status is Status.RUNNING and _in_inflight_prefills(cfg, q)
        if h in chunk_ends:
            prefilling = chunk_ends[h] < q.num_tokens or h in parked
        if h != r and (_holds_load(state, h) or prefilling):
            whole = blocks.cdiv(min(q.num_tokens, cfg.max_model_len) + step, cfg.block_size)
            reserved += max(0, whole - len(q.block_table))
    fresh = max(0, blocks.cdiv(computed, cfg.block_size) - len(hit))
    return blocks.can_allocate(state.pool, fresh + reserved, hit)


def _in_inflight_prefills(cfg: Config, q: Request) -> bool:
    """A running request still in `_inflight_prefills`: its last chunk stopped
    short of its tokens (`_update_after_schedule` drops it once
    `is_prefill_chunk` turns False), so one whose chunk ended one token short
    is still in. Where the state keeps `is_prefill_chunk` (the cadence, or
    drafts that pad: drafts.keeps_prefill_chunk_flag) it is read, and a
    failed load's victim keeps what its last schedule left, as vLLM's set
    does; elsewhere a decoder at `num_tokens - 1` (an output counted, no
    placeholder left) is told apart by its outputs (not modelled there: a
    request resumed with outputs whose chunk ended one short, and a rollback's
    victim the set had already dropped)."""
    if cadence.is_on(cfg) or keeps_prefill_chunk_flag(cfg):
        return q.is_prefill_chunk
    if q.num_computed < q.num_tokens - 1:
        return True
    return q.num_computed == q.num_tokens - 1 and q.num_output == 0 and q.placeholders == 0


def _holds_load(state: State, h: int) -> bool:
    """h waits in `kv_holding` with a load parked or landed (`_parked_reservations`,
    kept from the park to its admission); a streaming session between turns
    holds blocks there too but reserves nothing (sessions.py)."""
    return h in state.kv_holding_set and state.requests[h].load not in (Load.NONE, Load.DONE)


def park(state: State, cfg: Config, r: int, computed: int, external: int) -> State:
    """An async load starts: WAITING_FOR_REMOTE_KVS with `num_computed`
    set to local + external tokens; it joins `kv_holding`'s tail (under
    the priority policy its place by rank: a heap push)."""
    if cfg.rules.kv_holding_first:
        state = replace(state, waiting=tuple(x for x in state.waiting if x != r),
                        kv_holding=state.kv_holding + (r,))
    state = state.with_request(r, status=Status.WAITING_FOR_REMOTE_KVS, num_computed=computed,
                               load=Load.IN_FLIGHT, external=external)
    return priority.kv_holding_in_rank_order(state, cfg)


def promote(state: State, cfg: Config, r: int) -> State:
    """A landed load's request back to WAITING (`_update_waiting_for_remote_kv`):
    its valid blocks cached, or its table freed when nothing is valid; a
    load of every token leaves the last one to compute. Its load stays
    RECEIVED until it runs (`KV_FETCH_COMPLETED_WAITING`)."""
    q = state.requests[r]
    if q.num_computed == 0:
        pool = blocks.free_table(state.pool, q.block_table, cfg.release_order, cfg.rules.unhashed_blocks_to_head)
        return replace(state, pool=pool).with_request(r, status=Status.WAITING, block_table=(), external=0)
    if cfg.prefix_caching:
        labels = [content_label(state, r, i, cfg.block_size)
                  for i in range(min(q.num_computed, q.num_tokens) // cfg.block_size)]
        state = replace(state, pool=blocks.cache_labels(state.pool, q.block_table, labels,
                                                        cfg.cache_duplicate_blocks))
    computed = q.num_tokens - 1 if q.num_computed == q.num_tokens else q.num_computed
    return state.with_request(r, status=Status.WAITING, num_computed=computed, external=0)

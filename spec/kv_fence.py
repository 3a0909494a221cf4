"""When a request's KV blocks go back to the pool, with a KV connector:
at once, behind the step fence, or held for a transfer.

* The step fence (vLLM 0.33/0.34 `defer_block_free`, `Config.fences_freed_blocks`:
  a consumer connector with more than one batch in flight). A consumer's
  load can fill a reallocated block out of order with a step that still
  writes it, so a request whose last batch is still in flight
  (`_request_blocks_can_be_freed`: `last_sched_seq > processed_step_seq`)
  has its blocks put aside (`_free_request_blocks`) as one entry of
  `State.deferred_frees`, with the non-empty batches then in flight
  (`sched_step_seq - processed_step_seq`); each non-empty batch that
  completes counts every entry down by one, and the entries that reach 0
  are freed in order, stopping at the first that has not
  (`_drain_deferred_frees`, run in `update_from_output` before the
  batch's outputs are applied).
* The fail policy's frees (`State.error_frees`): vLLM's
  `update_from_output` finishes the requests whose load failed
  (`failed_kv_load_req_ids`, FINISHED_ERROR) after its loop over the
  batch's outputs, so their tables go back to the pool after those the
  loop's own finishes freed (the free queue's order, which later
  allocations read). The spec takes the failure before the output that
  reports it: the table waits for that output's end, and a request with a
  later batch still in flight is put aside behind the fence only there,
  after the loop's own fenced finishes.
* Holding (`finish_requests`, `_free_request`, `_connector_finished`): a
  request aborted (or failed) while its async load is in flight keeps its
  table until the load's `finished_recving` (`Profile.kv_aborted_load_held`);
  a producer's finished request keeps it until its `finished_sending`
  (`Profile.kv_send_hold`). The table stays in `Request.block_table`, with
  `Request.held`.

Abstracted away: copy-on-write retentions (`_free_cow_retained_blocks`),
HiSparse's deferred loads, and which finished requests a producer sends
(here: every request that finishes by a stop or its length with a table;
vLLM's connectors decide per request from its transfer parameters).
"""

from __future__ import annotations

from dataclasses import replace

from . import blocks
from .config import Config
from .state import Fate, Load, State, Status, retire_entries


def batches_in_flight(state: State) -> int:
    """Non-empty batches in flight: vLLM's `sched_step_seq -
    processed_step_seq` (an empty batch advances neither)."""
    return sum(1 for batch in state.in_flight if batch)


def has_batch_in_flight(state: State, r: int) -> bool:
    """Some in-flight batch holds an entry of r, whatever its fate: r's last
    scheduled step is not yet processed (`last_sched_seq > processed_step_seq`)."""
    return bool(state.entries_of(r, fate=None))


def can_free_now(state: State, cfg: Config, r: int) -> bool:
    """`_request_blocks_can_be_freed`: no fence, or r's last batch is done."""
    return not cfg.fences_freed_blocks or not has_batch_in_flight(state, r)


def release_table(state: State, cfg: Config, r: int, table: tuple[int, ...]) -> State:
    """`_free_request_blocks`: r's table back to the pool, or put aside
    behind the batches in flight while r has one of them."""
    if not table:
        return state
    if can_free_now(state, cfg, r):
        return replace(state, pool=blocks.free_table(state.pool, table, cfg.release_order,
                                                     cfg.rules.unhashed_blocks_to_head))
    return replace(state, deferred_frees=state.deferred_frees + ((batches_in_flight(state), table),))


def drain_deferred_frees(state: State, cfg: Config, completed: tuple) -> State:
    """`update_from_output`: a completed non-empty batch advances
    `processed_step_seq`; the deferred frees it was the last for are freed,
    oldest first, up to the first still pending (`_drain_deferred_frees`)."""
    if not completed or not state.deferred_frees:
        return state
    pending = tuple((left - 1, table) for left, table in state.deferred_frees)
    pool = state.pool
    while pending and pending[0][0] <= 0:
        pool = blocks.free_table(pool, pending[0][1], cfg.release_order, cfg.rules.unhashed_blocks_to_head)
        pending = pending[1:]
    return replace(state, pool=pool, deferred_frees=pending)


def defer_to_output_end(state: State, r: int, carrier: int, fenced: bool = False) -> State:
    """r's table, taken out of r, waits for the end of the update of the
    batch at index `carrier` in flight (`error_frees`); `fenced`: a later
    batch of r's is still in flight then, so the table goes from there
    behind the step fence."""
    table = state.requests[r].block_table
    if not table:
        return state
    left = sum(1 for batch in state.in_flight[:carrier + 1] if batch)
    state = replace(state, error_frees=state.error_frees + ((left, table, fenced),))
    return state.with_request(r, block_table=())


def drain_error_frees(state: State, cfg: Config, completed: tuple) -> State:
    """The end of `update_from_output`: `finish_requests(failed_kv_load_req_ids,
    FINISHED_ERROR)` after the output loop frees the tables of the requests
    this output's failures finished, in the order they failed; a table whose
    request still has a batch in flight is put aside there
    (`_free_request_blocks`), so its fenced entry comes after those the
    output loop's own finishes put aside (vLLM 0.34 `_drain_deferred_frees`
    returns them in that order)."""
    if not completed or not state.error_frees:
        return state
    pending = tuple((left - 1, table, fenced) for left, table, fenced in state.error_frees)
    pool, deferred = state.pool, state.deferred_frees
    for _, table, fenced in (f for f in pending if f[0] <= 0):
        if fenced:
            deferred += ((batches_in_flight(state), table),)
        else:
            pool = blocks.free_table(pool, table, cfg.release_order, cfg.rules.unhashed_blocks_to_head)
    return replace(state, pool=pool, deferred_frees=deferred, error_frees=tuple(f for f in pending if f[0] > 0))


def requires_kv_delivery(cfg: Config) -> bool:
    """vLLM 0.33/0.34 `_preempt_request(drop_stale_output=self.requires_kv_delivery)`:
    a producer's preempted request drops its in-flight output, whose KV the
    preemption's free would leave undelivered (`Profile.kv_producer_drops_stale_output`)."""
    kv = cfg.kv_connector
    return kv is not None and kv.producer and cfg.rules.kv_producer_drops_stale_output


def holds_for_transfer(state: State, cfg: Config, r: int, status: Status) -> bool:
    """Whether r, finishing with `status`, keeps its table: its async load
    is still in flight (`finish_requests`' `delay_free_blocks`), or a
    producer holds it for a send (`_connector_finished`'s `delay_free`)."""
    req = state.requests[r]
    if not req.block_table:
        return False
    if req.status is Status.WAITING_FOR_REMOTE_KVS and req.load.in_transfer:
        return cfg.rules.kv_aborted_load_held
    producer = cfg.kv_connector is not None and cfg.kv_connector.producer
    # the send is handed the blocks covering the computed tokens
    # (`get_block_ids_for_computed_tokens`): none where none is computed
    return (producer and cfg.rules.kv_send_hold and req.num_computed > 0
            and status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH))


def finish_with_connector(state: State, cfg: Config, r: int, status: Status) -> State:
    """Finish or abort r with a connector configured: out of every queue,
    in-flight work superseded, its table held for a transfer or released
    (fenced). A load that landed but was not promoted is forgotten
    (`finished_recving_kv_req_ids.discard`); one still in flight keeps its
    state, so its report can free the table."""
    req = state.requests[r]
    held = holds_for_transfer(state, cfg, r, status)
    if not held:
        state = release_table(state, cfg, r, req.block_table)
    state = replace(state, waiting=tuple(x for x in state.waiting if x != r),
                    running=tuple(x for x in state.running if x != r),
                    kv_holding=tuple(x for x in state.kv_holding if x != r),
                    scheduled_ids=state.scheduled_ids - {r})
    state = retire_entries(state, r, frozenset({Fate.LIVE, Fate.ORPHANED}), Fate.SUPERSEDED)
    load = req.load if req.load.in_transfer and held else (Load.DONE if req.load is not Load.NONE else Load.NONE)
    return state.with_request(r, status=status, num_computed=0, num_drafts=0,
                              block_table=req.block_table if held else (), held=held, load=load, external=0)

"""The KV connector's reports, as environment actions: `receive_kv`
(`finished_recving`), `fail_kv_load` (`failed_recving` or
`invalid_block_ids`) and `send_kv` (`finished_sending`).

vLLM delivers them with a batch's output (`update_from_output`:
`_handle_failed_recving` and `_handle_invalid_blocks` before the outputs,
`_update_from_kv_xfer_finished` after them); the spec lets each happen
between any two actions, which includes every order vLLM can produce.
Each is offered only where the profile has it (`Profile.kv_*`).

The rollback of a recomputed failure is the INTENDED one: the request's
valid prefix is the first invalid block's start, every later live entry of
the request is superseded (its output must never be applied), and every
counter that speaks of the lost tokens is restored (the stale counter
takes the superseded entries as dropped stale output, the placeholders
give theirs back). vLLM 0.34's `_update_requests_with_invalid_blocks` takes
the prefix from `num_computed_tokens - num_scheduled_tokens[req]` (one
batch in flight assumed) and leaves `num_output_placeholders` alone (#49250):
that is vLLM's behaviour, checked against this intended rule elsewhere.

Abstracted away: a load reported failed twice (one failure per load; a
second report is refused), failures of blocks shared by two loads in one
batch (`marked_invalid_block_ids`: the models give loads no shared blocks),
the eviction of invalid cached blocks under the fail policy, and connector
statistics.
"""

from __future__ import annotations

from .actions import finish_request
from .blocks import cdiv
from .config import Config
from .kv_fence import release_table
from .state import Entry, Fate, Load, State, Status, retire_entries


def receive_kv(state: State, cfg: Config, r: int) -> State | None:
    """`finished_recving` for r's load in flight: a parked request's load
    has landed (promoted by the next `schedule`); an aborted or failed one's
    held table is freed now (`_update_from_kv_xfer_finished` -> `_free_blocks`)."""
    if cfg.kv_connector is None or not (0 <= r < len(state.requests)):
        return None
    req = state.requests[r]
    if not req.load.in_transfer:
        return None
    if req.status is Status.WAITING_FOR_REMOTE_KVS:
        return state.with_request(r, load=Load.RECEIVED)
    state = release_table(state, cfg, r, req.block_table)
    return state.with_request(r, block_table=(), held=False, load=Load.DONE)


def send_kv(state: State, cfg: Config, r: int) -> State | None:
    """`finished_sending` for a finished request held for a send: its
    blocks are freed (`_free_blocks`, behind the fence where it is in force)."""
    if cfg.kv_connector is None or not (0 <= r < len(state.requests)):
        return None
    req = state.requests[r]
    if not (req.status.is_finished and req.held and not req.load.in_transfer):
        return None
    state = release_table(state, cfg, r, req.block_table)
    return state.with_request(r, block_table=(), held=False)


def loading_entry(state: State, r: int) -> Entry | None:
    """r's live entry in flight that carries a synchronous load, if any."""
    for e in state.entries_of(r):
        if e.external > 0:
            return e
    return None


def failable_blocks(state: State, cfg: Config, r: int) -> range:
    """The block indexes of r's table a failure may name (contract C2: blocks
    it was given for a load of r, within the load): an async load's
    `[local hit, num_computed)`, a sync load's `[start - external, start)`;
    block 0 stands too for a request-level `failed_recving` of an async load."""
    req, bs = state.requests[r], cfg.block_size
    if req.status is Status.WAITING_FOR_REMOTE_KVS and req.load is Load.IN_FLIGHT:
        return range((req.num_computed - req.external) // bs, cdiv(req.num_computed, bs))
    e = loading_entry(state, r) if req.status is Status.RUNNING else None
    if e is None:
        return range(0)
    return range((e.start - e.external) // bs, cdiv(e.start, bs))


def fail_kv_load(state: State, cfg: Config, r: int, from_block: int) -> State | None:
    """r's load failed from block `from_block` of its table on (0 for an
    async load: also the request-level `failed_recving`). Recompute: r rolls
    back to `from_block * block_size`; fail: r finishes with FINISHED_ERROR
    (an async load's table held until its `finished_recving`)."""
    if cfg.kv_connector is None or not cfg.rules.kv_load_failures or not (0 <= r < len(state.requests)):
        return None
    req = state.requests[r]
    parked = req.status is Status.WAITING_FOR_REMOTE_KVS
    if not (from_block in failable_blocks(state, cfg, r) or (parked and req.load is Load.IN_FLIGHT and from_block == 0)):
        return None
    if cfg.kv_connector.load_failure_policy == "fail":
        return _fail_request(state, cfg, r)
    valid = from_block * cfg.block_size
    if parked:
        return state.with_request(r, num_computed=valid, load=Load.FAILED)
    return rollback(state, cfg, r, valid)


def _fail_request(state: State, cfg: Config, r: int) -> State:
    """The fail policy: `finish_requests(..., FINISHED_ERROR)`; a parked
    request's load is marked failed, its report still to come."""
    if state.requests[r].status is Status.WAITING_FOR_REMOTE_KVS:
        state = state.with_request(r, load=Load.FAILED)
    return finish_request(state, cfg, r, Status.FINISHED_ERROR)


def rollback(state: State, cfg: Config, r: int, valid: int) -> State:
    """The intended recompute of a running request's failed sync load: its
    counter back to the valid prefix, every live entry of it superseded, the
    stale counter taking them as dropped output and the placeholders theirs
    back (vLLM 0.33's counters; without them the fates alone decide)."""
    req = state.requests[r]
    live = state.entries_of(r)
    state = retire_entries(state, r, frozenset({Fate.LIVE}), Fate.SUPERSEDED)
    changes: dict = {"num_computed": valid, "num_drafts": 0}
    if cfg.rules.stale_output_counters:
        changes.update(num_stale=req.num_stale + sum(e.n for e in live), drop_stale=True)
    if cfg.rules.output_placeholders:
        changes.update(placeholders=req.placeholders - sum(1 + e.drafts for e in live if e.samples))
    return state.with_request(r, **changes)

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

A sync load's blocks are cached when it is scheduled, so a request admitted
after it may hold them through its prefix hit. vLLM's
`_update_requests_with_invalid_blocks` scans every running request and
marks each invalid block once (`marked_invalid_block_ids`): such a holder
fails with the loader under the fail policy; under recompute it keeps its
hit (the loader recomputes the shared blocks) and loses only its entry in
the batch that carried the load (and every later one: the intended rule,
as for the loader).

One output may report several loads' failures (its `failed_recving` and
`invalid_block_ids`): vLLM judges them jointly, in one scan over every
block any of them made invalid (`fail_kv_output`): in scan order, a request
recomputes from its first invalid block no earlier request marked, and one
whose invalid blocks all were marked keeps them and loses only the carrying
batch's tokens. `fail_kv_load` is that action for an output with one
failure, the one the explicit search and the Z3 encodings explore (an
output with several reaches what its failures reach one by one in the
reverse of the scan order: docs/kv-connector.md, "One output, several
failures").

Abstracted away: a load reported failed twice (one failure per load; a
second report is refused), the marks among parked holders of a sync load's
invalid blocks (vLLM's async pass marks too: each parked holder is cut at
its first invalid block here), and connector statistics.
Under the fail policy a sync load's invalid blocks, and the loader's blocks
after them, leave the prefix cache (`evict_blocks`) before the requests
finish. Under the recompute policy they stay (KV7's breach, finding 7),
but for finding 7's fix (`quarantines_invalid_kv`, no vLLM release): there
they leave the cache too, and every holder recomputes from its own first
invalid block (`_scan_invalid_blocks` with no marks).
"""

from __future__ import annotations

from dataclasses import replace

from .actions import finish_request
from .blocks import cached_block, cdiv, uncache
from .config import Config
from .kv_fence import defer_to_output_end, holds_for_transfer, release_table
from .kv_invalid import mark_invalid
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


def finished_load_blocks(state: State, cfg: Config, r: int) -> range:
    """The block indexes a failure of r's sync load may name after r
    finished (aborted) with the batch carrying it in flight (vLLM reports it
    with that batch's output: `_fail_holders_of_finished`), until its failure
    is reported (a load fails once: its entry then brings nothing in,
    `_report_taken`). Empty for a request not finished."""
    q = state.requests[r]
    e = _load_entry(state, r) if q.status.is_finished else None
    if e is None:
        return range(0)
    return range((e.start - e.external) // cfg.block_size, cdiv(e.start, cfg.block_size))


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
    if req.status.is_finished:
        return _fail_holders_of_finished(state, cfg, r, from_block)
    parked = req.status is Status.WAITING_FOR_REMOTE_KVS
    if not (from_block in failable_blocks(state, cfg, r) or (parked and req.load is Load.IN_FLIGHT and from_block == 0)):
        return None
    holders = shared_holders(state, cfg, r, from_block)
    if cfg.kv_connector.load_failure_policy == "fail":
        if holders:              # a sync load's invalid blocks and r's blocks after them leave the cache
            state = replace(state, pool=uncache(state.pool, req.block_table[from_block:]))
        carrier = _carrier(state, r)
        for x in holders or [r]:                     # in vLLM's scan order, r among them
            state = _fail_past_carrier(state, cfg, x, carrier)
        return state
    valid = from_block * cfg.block_size
    if parked:
        return state.with_request(r, num_computed=valid, load=Load.FAILED)
    if quarantines_invalid_kv(cfg):           # the fix: no marks, every holder cut, the blocks evicted
        return _scan_invalid_blocks(state, cfg, ((r, from_block),))
    state = mark_invalid(state, _invalid_blocks(state, cfg, r, from_block))     # KV7 (kv_invalid.py)
    state = _cut_parked_holders(state, cfg, _invalid_blocks(state, cfg, r, from_block), {})
    for h in holders:
        if h != r and state.requests[h].status is Status.RUNNING:
            state = _recompute_holder(state, cfg, h, r, from_block)
    return _report_taken(rollback(state, cfg, r, valid), cfg, r)


def fail_cut_parked_load(state: State, cfg: Config, r: int, from_block: int) -> State | None:
    """The own failure of a parked load that another load's failure already
    cut (it held that load's invalid blocks: its load FAILED). Recompute: vLLM
    cuts it again where its own failure is shorter (`_handle_failed_recving`
    zeroes `num_computed_tokens` of a request in WAITING_FOR_REMOTE_KVS, its
    request-level report here `from_block` 0; `_update_requests_with_invalid_blocks`
    cuts at the first invalid block of its computed prefix), and its promotion
    frees a table left with nothing valid. Not an action of the spec's
    connector, which offers a FAILED load no failure (a load fails once):
    check-trace replays it where a recorded connector reports one
    (verification/traces/connector.py). The fail policy finished the load
    at the first failure: None."""
    req = state.requests[r]
    if cfg.kv_connector is None or cfg.kv_connector.load_failure_policy != "recompute" \
            or req.status is not Status.WAITING_FOR_REMOTE_KVS or req.load is not Load.FAILED:
        return None
    return state.with_request(r, num_computed=min(req.num_computed, from_block * cfg.block_size))


def fail_kv_output(state: State, cfg: Config, failures: tuple[tuple[int, int], ...]) -> State | None:
    """The load failures one batch output reports, `(request, from_block)`
    each, judged jointly as vLLM's `update_from_output` does. Guards: each
    request once, and each failure one the connector may report in the
    state before the output (`fail_kv_load` enabled there: C2-C4 read
    there, not after another failure of the same output rolled its request
    back). One failure: `fail_kv_load`. The fail policy evicts the tails
    one scan over every invalid block finds (`_evict_invalid_tails`), then
    finishes every request holding an invalid block, in the scan order (it
    orders the frees);
    recompute: `_scan_invalid_blocks`."""
    if not failures or len({r for r, _ in failures}) < len(failures):
        return None
    if any(fail_kv_load(state, cfg, r, from_block) is None for r, from_block in failures):
        return None
    if len(failures) == 1:
        return fail_kv_load(state, cfg, *failures[0])
    if cfg.kv_connector.load_failure_policy == "fail":
        # finished (and their tables freed) in the order vLLM's recorder takes
        # `finish_requests`' set: `kv_holding_waiting`, then `running`
        scan = {x: i for i, x in enumerate(state.kv_holding + state.running)}
        ordered = sorted(failures, key=lambda f: (scan.get(f[0], len(scan)), f[0]))
        state = _evict_invalid_tails(state, cfg, failures)     # (`evict_blocks` before `finish_requests`)
        for r, from_block in ordered:
            state = fail_kv_load(state, cfg, r, from_block) or state   # one an earlier failure finished: nothing
        return state
    return _scan_invalid_blocks(state, cfg, failures)


def _evict_invalid_tails(state: State, cfg: Config, failures: tuple[tuple[int, int], ...]) -> State:
    """The fail policy's eviction for an output's failures together, before
    any request finishes: vLLM 0.33.0/0.34.0 `Scheduler._handle_invalid_blocks`
    scans `running` once over every block the output made invalid
    (`_update_requests_with_invalid_blocks(evict_blocks=True)`), and each
    request with an invalid block among its computed ones that no earlier
    request marked leaves the cache from there (its table's tail). An
    aborted loader's invalid blocks count too, which a running sharer still
    holds: one by one, the running loader's own failure first would finish
    that sharer before the aborted loader's scan could reach it, and its
    hit would stay cached (hunt seed 423 index 93, 0.33.0/0.34.0 async: a
    later request hit it in the spec, missed in vLLM)."""
    invalid: set[int] = set().union(*(_invalid_blocks(state, cfg, r, b) for r, b in failures))
    marked: set[int] = set()
    evicted: list[int] = []
    for h in state.running:
        blocks = _computed_blocks(state, cfg, h)
        fresh = [i for i, block in enumerate(blocks) if block in invalid and block not in marked]
        marked.update(block for block in blocks if block in invalid)
        if fresh:
            evicted.extend(state.requests[h].block_table[fresh[0]:])
    return replace(state, pool=uncache(state.pool, tuple(evicted))) if evicted else state


def _scan_invalid_blocks(state: State, cfg: Config, failures: tuple[tuple[int, int], ...]) -> State | None:
    """Recompute, for an output's failures together (vLLM's
    `_handle_invalid_blocks`: `_update_requests_with_invalid_blocks` over
    parked loads, then over `running`). Parked loads, one set of marks
    (`_cut_parked_holders`): each cut at its own failed block or its first
    block among the sync loads' invalid ones no earlier one marked,
    whichever comes first, its load failed (one that has landed stays
    RECEIVED: `_failed`). Running requests, in order, one
    set of marks: each holder of an invalid block recomputes from its first
    one no earlier holder marked, and marks every invalid block it holds;
    a holder whose invalid blocks all were marked keeps them
    (`_revert_to_carrier`). Under finding 7's fix (`quarantines_invalid_kv`)
    no marks: every running holder recomputes from its own first invalid
    block, and the invalid blocks, with each such holder's blocks after its
    first, leave the prefix cache. None if the sync loads' failures name two
    carrying batches (one output carries one batch's)."""
    bs = cfg.block_size
    parked = {r: b for r, b in failures if state.requests[r].status is Status.WAITING_FOR_REMOTE_KVS}
    sync = [(r, b) for r, b in failures if r not in parked]
    carriers = {_carrier(state, r) for r, _ in sync}
    if len(carriers) > 1:
        return None
    carrier = next(iter(carriers), None)
    invalid: set[int] = set().union(*(_invalid_blocks(state, cfg, r, b) for r, b in sync))
    state = _cut_parked_holders(state, cfg, invalid, parked)
    marked: set[int] = set()
    quarantine, evicted = quarantines_invalid_kv(cfg), set(invalid)
    for h in state.running:
        blocks = _computed_blocks(state, cfg, h)
        hits = [i for i, block in enumerate(blocks) if block in invalid]
        fresh = hits if quarantine else [i for i in hits if blocks[i] not in marked]
        marked.update(blocks[i] for i in hits)
        if fresh:
            state = rollback(state, cfg, h, fresh[0] * bs)
            evicted.update(state.requests[h].block_table[fresh[0]:])
        elif hits:
            state = _revert_to_carrier(state, cfg, h, carrier)
    if quarantine:
        state = replace(state, pool=uncache(state.pool, tuple(evicted)))
    for r, _ in sync:
        state = _report_taken(state, cfg, r)
    return mark_invalid(state, invalid)                 # KV7 (kv_invalid.py)


def _cut_parked_holders(state: State, cfg: Config, invalid: set[int], own: dict[int, int]) -> State:
    """Recompute, vLLM's pass over parked loads (0.34.0
    `_update_requests_with_invalid_blocks` over `kv_holding_waiting`, one set
    of marks for the pass): each parked load holding an invalid block, or
    failing itself (`own`: its failed block), is cut at its own failed block
    or its first invalid block no earlier holder marked, whichever comes
    first; one whose invalid blocks all were marked keeps its computed
    tokens ("this request can still consider this block as computed"). Its
    load fails either way (`failed_recving_kv_req_ids`)."""
    marked: set[int] = set()
    for h in _parked_loads(state):
        blocks = _computed_blocks(state, cfg, h)
        held = [i for i, block in enumerate(blocks) if block in invalid]
        cuts = ([own[h]] if h in own else []) + [i for i in held if blocks[i] not in marked][:1]
        marked.update(blocks[i] for i in held)
        q = state.requests[h]
        if cuts:
            state = state.with_request(h, num_computed=min(cuts) * cfg.block_size, load=_failed(q.load))
        elif held:
            state = state.with_request(h, load=_failed(q.load))
    return state


def _parked_loads(state: State) -> list[int]:
    """vLLM's `kv_holding_waiting` requests still in WAITING_FOR_REMOTE_KVS, in order."""
    return [h for h in state.kv_holding if state.requests[h].status is Status.WAITING_FOR_REMOTE_KVS]


def shared_holders(state: State, cfg: Config, r: int, from_block: int) -> list[int]:
    """The requests vLLM's `_handle_invalid_blocks` finds holding an invalid
    block of r's sync load (its table from `from_block` to the load's end)
    among their computed blocks, r first of all, in the order it scans them:
    parked loads (`kv_holding_waiting`), then `running`. Empty for a load
    that is not a sync load in flight (only r's own table is at stake)."""
    invalid = _invalid_blocks(state, cfg, r, from_block)
    if not invalid:
        return []
    return [h for h in _parked_loads(state) + list(state.running)
            if h == r or invalid.intersection(_computed_blocks(state, cfg, h))]


def _fail_holders_of_finished(state: State, cfg: Config, r: int, from_block: int) -> State | None:
    """r finished (aborted) while the batch carrying its sync load was in
    flight: its report changes nothing for r, but vLLM's scan still finds
    the requests sharing the invalid blocks. Its pass over parked loads and
    its pass over `running` mark apart: recompute cuts each parked holder at
    its first invalid block and the first running holder there, the later
    running holders keep them (`_scan_invalid_blocks`); the fail policy
    finishes every holder, the first running one's blocks from there leaving
    the cache (only the pass over `running` evicts). When no request shares
    them vLLM returns before anything (None), save for what the report
    still changes: under finding 7's fix the blocks leave the cache, and
    where KV7 is checked (`Config.check_invalid_kv`) they are invalid from
    here (`mark_finished_load_invalid`; finding 7's stale hit after an
    aborted loader)."""
    holders = shared_holders(state, cfg, r, from_block)
    if not holders:
        if _load_entry(state, r) is None or not (quarantines_invalid_kv(cfg) or cfg.check_invalid_kv):
            return None
        return _report_taken(mark_finished_load_invalid(state, cfg, r, from_block), cfg, r)
    if cfg.kv_connector.load_failure_policy == "recompute":
        return _scan_invalid_blocks(state, cfg, ((r, from_block),))
    invalid = _invalid_blocks(state, cfg, r, from_block)
    first = next((h for h in holders if state.requests[h].status is Status.RUNNING), None)
    if first is not None:
        index = next(i for i, b in enumerate(_computed_blocks(state, cfg, first)) if b in invalid)
        state = replace(state, pool=uncache(state.pool, state.requests[first].block_table[index:]))
    carrier = _carrier(state, r)
    for h in holders:
        state = _fail_past_carrier(state, cfg, h, carrier)
    return state


def mark_finished_load_invalid(state: State, cfg: Config, r: int, from_block: int) -> State:
    """The failure of a finished (aborted) request's sync load, reported with
    the batch that carried it, where no request holds its blocks: vLLM acts
    on nobody (`_handle_invalid_blocks` finds no affected request and
    returns), and under the recompute policy the blocks stay cached, invalid
    (KV7, kv_invalid.py)."""
    if cfg.kv_connector is None or cfg.kv_connector.load_failure_policy != "recompute":
        return state
    invalid = _invalid_blocks(state, cfg, r, from_block)
    if quarantines_invalid_kv(cfg):                     # the fix: they leave the cache
        state = replace(state, pool=uncache(state.pool, tuple(invalid)))
    return mark_invalid(state, invalid)


def quarantines_invalid_kv(cfg: Config) -> bool:
    """The seam of `Profile.kv_recompute_quarantines_invalid` (finding 7's
    fix, no vLLM release): under the recompute policy, does a failure's scan
    cut every holder at its own first invalid block and evict the invalid
    blocks (with each cut running holder's blocks after them) from the
    prefix cache? vLLM 0.33.0/0.34.0 `Scheduler._handle_invalid_blocks`
    evicts only under the fail policy and `_update_requests_with_invalid_blocks`
    lets a later holder keep a marked block: False in every released
    profile. With it, no later prefix hit reaches an invalid block and no
    holder's computed prefix keeps one, so KV7 holds (verification/kv_models.py)."""
    return cfg.kv_connector is not None and cfg.kv_connector.load_failure_policy == "recompute" \
        and cfg.rules.kv_recompute_quarantines_invalid


def _load_entry(state: State, r: int) -> Entry | None:
    """r's entry in flight carrying its sync load: a live one while r runs,
    any once r finished (its fate changed, its batch still in flight)."""
    if state.requests[r].status is Status.RUNNING:
        return loading_entry(state, r)
    if state.requests[r].status.is_finished:
        return next((e for e in state.entries_of(r, fate=None) if e.external > 0), None)
    return None


def _report_taken(state: State, cfg: Config, r: int) -> State:
    """r's sync load has had its failure reported: where KV7's models offer
    an aborted loader's report (`Config.check_invalid_kv`,
    `finished_load_blocks`), the entry carrying it, live or not, brings
    nothing in from here (`external` 0), so the load is not reported again
    once r has finished (a load fails once, C3). Elsewhere nothing changes
    (no search offers that report, and the state counts stay as they were)."""
    e = next((x for x in state.entries_of(r, fate=None) if x.external > 0), None) if cfg.check_invalid_kv else None
    if e is None:
        return state
    return replace(state, in_flight=tuple(tuple(replace(x, external=0) if x is e else x for x in batch)
                                          for batch in state.in_flight))


def _invalid_blocks(state: State, cfg: Config, r: int, from_block: int) -> set[int]:
    """The blocks of r's sync load in flight from `from_block` on (empty:
    none); once r finished, those still caching its content."""
    req, bs = state.requests[r], cfg.block_size
    e = _load_entry(state, r)
    if e is None or not (e.start - e.external) // bs <= from_block < cdiv(e.start, bs):
        return set()
    if not req.status.is_finished:
        return set(req.block_table[from_block:cdiv(e.start, bs)])
    labels = [req.prompt_labels[i] for i in range(from_block, cdiv(e.start, bs)) if i < len(req.prompt_labels)]
    return {b for b in (cached_block(state.pool, label) for label in labels) if b is not None}


def _computed_blocks(state: State, cfg: Config, h: int) -> tuple[int, ...]:
    q = state.requests[h]
    return q.block_table[:cdiv(q.num_computed, cfg.block_size)]


def _recompute_holder(state: State, cfg: Config, h: int, r: int, from_block: int) -> State:
    """Recompute, for a running request h sharing r's invalid blocks through
    its prefix hit (parked ones: `_cut_parked_holders`): it keeps its hit
    (r recomputes the shared blocks), its entry in the batch carrying r's
    load and every later one superseded; none there: nothing changes."""
    return _revert_to_carrier(state, cfg, h, _carrier(state, r))


def _revert_to_carrier(state: State, cfg: Config, h: int, carrier: int | None) -> State:
    """A running holder whose invalid blocks another request recomputes: it
    keeps them as computed and loses its entry in the carrying batch and
    every later one (vLLM: back to `num_computed_tokens -
    num_scheduled_tokens`); none there: nothing changes."""
    batch = state.in_flight[carrier] if carrier is not None else ()
    mine = next((x for x in batch if x.req == h and x.fate is Fate.LIVE), None)
    return state if mine is None else rollback(state, cfg, h, mine.start)


def _carrier(state: State, r: int) -> int | None:
    """The index in flight of the batch carrying r's sync load, whose output
    reports its failure."""
    e = _load_entry(state, r)
    return None if e is None else next(i for i, batch in enumerate(state.in_flight) if e in batch)


def _fail_past_carrier(state: State, cfg: Config, x: int, carrier: int | None) -> State:
    """The fail policy for x. vLLM finishes the requests of a batch's load
    failures at the end of its `update_from_output`, after the output loop's
    own finishes (`finish_requests(error_req_ids, FINISHED_ERROR)`): x's
    table waits for the carrier's update to end (kv_fence.error_frees),
    where it goes back to the pool, the fence's count having taken the
    carrier processed (`processed_step_seq += 1` opens the update). Behind
    the fence, a batch of x's after the carrier keeps its table fenced
    (`_free_request_blocks`), put aside at that same end, after the tables
    the output loop's finishes put aside (vLLM 0.34 `update_from_output`,
    `_drain_deferred_frees` returns them in that order); a table held for a
    transfer stays held."""
    later = carrier is not None and any(e.req == x for i, batch in enumerate(state.in_flight)
                                        if i != carrier for e in batch)
    if carrier is None or holds_for_transfer(state, cfg, x, Status.FINISHED_ERROR):
        return _fail_request(state, cfg, x)
    return _fail_request(defer_to_output_end(state, x, carrier, later and cfg.fences_freed_blocks), cfg, x)


def _fail_request(state: State, cfg: Config, r: int) -> State:
    """The fail policy: `finish_requests(..., FINISHED_ERROR)`; a parked
    request's load is marked failed, its report still to come (one already
    reported, landed and not yet promoted, is not held: `finish_requests`'
    `delay_free_blocks` is off for a request in `finished_recving_kv_req_ids`)."""
    q = state.requests[r]
    if q.status is Status.WAITING_FOR_REMOTE_KVS:
        state = state.with_request(r, load=_failed(q.load))
    return finish_request(state, cfg, r, Status.FINISHED_ERROR)


def _failed(load: Load) -> Load:
    """A parked load another load's failure reaches: FAILED while its report
    is to come; one that landed (its `finished_recving` seen) stays RECEIVED,
    its cut counters promoted by the next waiting loop."""
    return Load.FAILED if load is Load.IN_FLIGHT else load


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

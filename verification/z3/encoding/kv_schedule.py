"""The KV connector's path through `schedule` in Z3 (spec/kv_loads.py and
spec.schedule._schedule_waiting_with_connector, `_victim_frees_at_once`,
`_snapshot`): one waiting-loop micro-step with the connector, the running
loop's fence gate, and the connector fields of the batch `_launch` queues.

The waiting loop looks at the first request of `kv_holding` it has not
passed over in this call, else the first such of `waiting`; since it only
reaches `waiting` once every holder is passed over, and a parked request
joins `kv_holding` passed over (at the tail, or at its rank's place under
the priority policy: priority.join_kv_holding), the passed-over requests of each
queue are a prefix of it: two counters (`BatchInProgress.skipped` for
`waiting`, `held_skipped` for `kv_holding`) say where each loop stands.

What it encodes is what the connector models need (kv_state.`refuse_unencoded_connector`
names the rest, which the explicit search covers): asynchronous loads
(parking, a landed or failed load's promotion, admission of a promoted
request), the step fence, aborts and failures during a load, a producer's
held tables; and, for KV7's models, a consumer's synchronous loads beside
prefix caching (the admission's local hit and sync offer: kv_sync.py);
under vLLM 0.33's rules and 0.34's without a load limit, with no drafts,
chunked prefill on and synchronous scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.allocation import blocks_for, candidate, snapshot_entry
from flightcheck.verification.z3.encoding.connector import has_batch_in_flight, kv_of, load_at, with_kv
from flightcheck.verification.z3.encoding import kv_sync as sync
from flightcheck.verification.z3.encoding.kv_invalid import forget_rewritten
from flightcheck.verification.z3.encoding.kv_state import L_DONE, L_IN_FLIGHT, L_RECEIVED, SKvEntry
from flightcheck.verification.z3.encoding.kv_sync import has_sync_loads
from flightcheck.verification.z3.encoding.priority import holder_looked_at_first, join_kv_holding
from flightcheck.verification.z3.encoding.reset_pause_state import takes_waiting_queue
from flightcheck.verification.z3.encoding.requests import empty_table, put_flag, req_at, tokens_at, with_req
from flightcheck.verification.z3.encoding.state import (
    PAD,
    PREEMPTED,
    REMOTE_KVS,
    RUNNING,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    Builder,
    V,
    clone,
    conj,
    disj,
    eq,
    imax,
    imin,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    put,
    remove,
)


def victim_is_fenced(layout: Layout, st: SState, victim: Any) -> Any:
    """spec.schedule._victim_frees_at_once, negated: under the step fence a
    victim with a batch in flight is not preempted (the running loop stops)."""
    if not st.kv or not layout.cfg.fences_freed_blocks:
        return z3.BoolVal(False)
    return has_batch_in_flight(st, victim)


def unfinished_or_held(layout: Layout, s: SState, r: int) -> Any:
    """spec.schedule._idle's test for request r with a connector: active, or
    finished with its table held."""
    q = s.reqs[r]
    active = disj(*[eq(q.status, c) for c in (WAITING, RUNNING, PREEMPTED, REMOTE_KVS)])
    return disj(active, kv_of(s).held[r])


def _promote(layout: Layout, st: SState, r: Any, q: Any, tokens: Any) -> SState:
    """kv_loads.promote without prefix caching: nothing valid frees the
    table; a load of every token leaves the last one to compute."""
    empty = eq(q.num_computed, 0)
    freed = clone(st)
    freed.pool = zb.free_table(layout, st.pool, q.table, q.table_len)
    freed = with_req(freed, r, status=V(WAITING), table_len=V(0), table=empty_table(layout))
    kept = with_req(st, r, status=V(WAITING), num_computed=ite(eq(q.num_computed, tokens), tokens - 1, q.num_computed))
    return with_kv(merge(empty, freed, kept), r, external=V(0))


def _allocate(layout: Layout, st: SState, r: Any, q: Any, total: Any) -> tuple[Any, SState]:
    """spec.schedule._allocate without a hit: (it fits, the state with r's table grown to `total` tokens)."""
    num_fresh = imax(V(0), blocks_for(layout, total) - q.table_len)
    pool, fresh = zb.pop_fresh(layout, st.pool, num_fresh, layout.T)
    table, table_len = zb.append_blocks(layout, q.table, q.table_len, fresh, num_fresh)
    out = clone(st)
    out.pool = pool
    return le(num_fresh, st.pool.free_len), with_req(out, r, table_len=table_len, table=table)


def _whole_fits(layout: Layout, st: SState, q: Any, tokens: Any) -> Any:
    """spec.schedule._fits_whole with no hit (vLLM 0.33's full-sequence
    admission): the blocks r's whole sequence needs beyond those it holds (a
    promoted load's) are free (session_schedule.py's; kv_sync.py's with a hit)."""
    if not layout.cfg.rules.full_sequence_admission:
        return z3.BoolVal(True)
    whole = blocks_for(layout, imin(tokens, V(layout.cfg.max_model_len)))
    return le(imax(V(0), whole - q.table_len), st.pool.free_len)


@dataclass(frozen=True)
class LoopParts:
    """What the connector's waiting step takes from schedule.py's waiting
    loop (handed over by `schedule`, so this module does not import it): the
    batch under construction's type, `_add`, `_clip`, `_is_resumption_deferred`."""

    batch: Any
    add: Any
    clip: Any
    deferred: Any


def _hits(layout: Layout) -> bool:
    """The admission takes a local hit or a sync load (kv_sync.py); else the
    circuit of the async models, as it was."""
    return has_sync_loads(layout) or layout.cfg.prefix_caching


def kv_waiting_step(layout: Layout, builder: Builder, acc, phase: Any, threshold_on: Any, pads: Any,
                    parts: LoopParts):
    """One iteration of _schedule_waiting_with_connector: pass the candidate
    over (a load not landed, a deferred resumption), park it (an async hit),
    admit it (a landed load promoted first), or stop the loop. `pads` is
    None: the models the encoding takes have no drafts."""
    BatchInProgress, _add, _clip, _is_resumption_deferred = parts.batch, parts.add, parts.clip, parts.deferred
    cfg, st = layout.cfg, acc.state
    kv = kv_of(st)
    if isinstance(acc.held_skipped, int):               # the loop's first iteration: a literal
        acc = replace(acc, held_skipped=V(acc.held_skipped))
    held, plain = pick(kv.holding, acc.held_skipped, V(PAD)), pick(st.waiting, acc.skipped, V(PAD))
    plain_left = conj(lt(acc.skipped, st.waiting_len), takes_waiting_queue(layout, st))   # PAUSED_NEW: holders only
    first = holder_looked_at_first(layout, st, held, plain, plain_left)
    from_holding = builder.let("from_holding", conj(lt(acc.held_skipped, kv.holding_len), first))
    active = builder.let("active", conj(phase, neg(acc.done), lt(0, acc.budget), lt(st.running_len, cfg.max_num_seqs),
                                        disj(from_holding, plain_left)))
    r = builder.let("r", ite(from_holding, held, plain))
    q = builder.snap(req_at(st, r), "q")
    tokens = builder.let("tokens", tokens_at(layout, st, r))
    blocked = conj(eq(q.status, REMOTE_KVS), neg(eq(load_at(st, r), L_RECEIVED)))
    skip = builder.let("skip", conj(active, disj(blocked, _is_resumption_deferred(layout, builder, st, r, q))))
    going = conj(active, neg(skip))
    st1 = builder.snap(merge(conj(going, eq(q.status, REMOTE_KVS)), _promote(layout, st, r, q, tokens), st), "promoted")
    q1 = builder.snap(req_at(st1, r), "q1")
    hit = sync.prefix_hit(layout, builder, st1, r, q1, tokens)
    external, is_async = sync.connector_offer(layout, st1, r, tokens, hit.num_hit * cfg.block_size)
    external, is_async = builder.let("external", external), builder.let("async", is_async)
    fits_whole = sync.admission_fits_whole(layout, st1, q1, tokens, hit)
    # an async hit: blocks for its external tokens, parked in kv_holding, passed over
    park_fits, parked = _allocate(layout, st1, r, q1, q1.num_computed + external)
    park = builder.let("park", conj(going, is_async, fits_whole, park_fits))
    parked.waiting, parked.waiting_len = remove(st1.waiting, st1.waiting_len, r)
    pk = kv_of(parked)
    pk.holding, pk.holding_len = join_kv_holding(layout, st1, pk.holding, pk.holding_len, r), pk.holding_len + 1
    parked = with_req(parked, r, status=V(REMOTE_KVS), num_computed=q1.num_computed + external)
    parked = with_kv(parked, r, load=V(L_IN_FLIGHT), external=external)
    # otherwise an admission from its computed tokens, its local hit and a sync load's
    computed = builder.let("computed", q1.num_computed + hit.num_hit * cfg.block_size + external) \
        if _hits(layout) else q1.num_computed
    num_new = builder.let("num_new", _clip(layout, acc.budget, q1.num_computed, tokens - computed, True, threshold_on))
    admit_fits, admitted = sync.allocate_with_hit(layout, builder, st1, r, q1, tokens, hit, computed + num_new) \
        if _hits(layout) else _allocate(layout, st1, r, q1, computed + num_new)
    admit = builder.let("admit", conj(going, neg(is_async), neg(eq(num_new, 0)), fits_whole, admit_fits))
    a = builder.snap(req_at(admitted, r), "a")
    entry, _ = snapshot_entry(layout, candidate(admitted, r, a, tokens), computed, num_new, computed, acc.budget)
    admitted.waiting, admitted.waiting_len = remove(st1.waiting, st1.waiting_len, r)
    ak = kv_of(admitted)
    ak.holding, ak.holding_len = remove(ak.holding, ak.holding_len, r)
    admitted.running, admitted.running_len = put(st1.running, st1.running_len, r), st1.running_len + 1
    admitted = with_kv(with_req(admitted, r, status=V(RUNNING), num_computed=computed), r, load=V(L_DONE),
                       external=external if _hits(layout) else V(0))      # a sync load's: the entry's at launch
    entries, cnt, budget = _add(layout, acc, entry, admit)
    state = merge(park, parked, merge(admit, admitted, st1))
    return BatchInProgress(state, budget, cnt, entries, acc.preempted,
                           put_flag(acc.admitted_from_preempted, r, eq(q.status, PREEMPTED), admit),
                           put_flag(acc.admitted, r, z3.BoolVal(True), admit), acc.any_preempted, acc.position,
                           disj(acc.done, conj(going, neg(park), neg(admit))),
                           ite(conj(skip, neg(from_holding)), acc.skipped + 1, acc.skipped),
                           ite(disj(conj(skip, from_holding), park), acc.held_skipped + 1, acc.held_skipped))


def kv_launch(layout: Layout, st: SState, acc, put_batch: Any) -> SState:
    """spec.schedule._snapshot's connector fields for the batch `_launch`
    queues at slot `num_batches` of `st` (before it is counted): no sync
    load (external 0), and under the fence each entry's request's table."""
    fenced = layout.cfg.fences_freed_blocks
    row, externals = [], []
    for j, e in enumerate(acc.entries):
        q = req_at(st, e.req)
        used = conj(lt(j, acc.count), z3.BoolVal(fenced))
        externals.append(ite(lt(j, acc.count), pick(kv_of(st).external, e.req, V(0)), V(0))
                         if has_sync_loads(layout) else V(0))
        row.append(SKvEntry(externals[-1], ite(used, q.table_len, V(0)), [ite(used, x, V(PAD)) for x in q.table]))
    out = clone(st)
    kv = kv_of(out)
    kv.entries = [[merge(conj(put_batch, eq(st.num_batches, k)), new, old) for new, old in zip(row, slots)]
                  for k, slots in enumerate(kv.entries)]
    if has_sync_loads(layout):      # the admitted requests' sync loads are the entries' now
        kv.external = [ite(flag, V(0), x) for flag, x in zip(acc.admitted, kv.external)]
    return forget_rewritten(layout, out, acc.entries, acc.count, externals)

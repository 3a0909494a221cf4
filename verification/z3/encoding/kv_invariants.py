"""The KV connector's invariants in Z3 (spec/kv_invariants.py): KV1, KV2,
KV4 and KV6, each a formula of the same name written clause for clause
after the Python predicate (tests/test_z3_kv.py checks that they agree on
the connector models' reachable states and on perturbed ones), and the
auxiliary invariants that make them inductive on those models.

KV3 (a transition property of a recompute rollback) is not encoded: the
models the encoding takes fail only async loads (kv_state.py), whose
rollback sets `num_computed` and nothing else, with no entry in flight to
restore counters for; the explicit search checks KV3 on the spec's
sync-load models. KV5 (liveness, checked like L2) is not encoded either.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.verification.z3.encoding.connector import batches_in_flight, in_transfer, kv_of
from flightcheck.verification.z3.encoding.kv_state import L_DONE, L_FAILED, L_IN_FLIGHT, L_NONE, L_RECEIVED
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_ERROR,
    F_LENGTH,
    F_STOPPED,
    LIVE,
    NEW,
    PREEMPTED,
    REMOTE_KVS,
    RUNNING,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import V, conj, count, disj, eq, le, lt, member, neg

KvFormula = Callable[[Layout, SState], Any]


def _finished(status: Any) -> Any:
    return disj(*[eq(status, c) for c in (F_STOPPED, F_LENGTH, F_ABORTED, F_ERROR)])


def _in_free_queue(s: SState, b: Any) -> Any:
    return member(b, s.pool.free, s.pool.free_len)


def _table(q) -> list[tuple[Any, Any]]:
    """(block, slot in use) of a request's table."""
    return [(b, lt(t, q.table_len)) for t, b in enumerate(q.table)]


def _entries(s: SState) -> list[tuple[int, Any, Any, Any]]:
    """(batch index, entry, its connector fields, slot in use) over every in-flight slot."""
    kv = kv_of(s)
    return [(k, e, kv.entries[k][j], conj(lt(k, s.num_batches), lt(j, b.length)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]


def kv1_no_reuse_under_transfer(layout: Layout, s: SState) -> Any:
    """KV1: no block of a request whose load is in flight or that is held,
    nor (under the fence) of an in-flight entry, is in the free queue."""
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        guarded = disj(in_transfer(kv.load[r]), kv.held[r])
        out += [z3.Implies(conj(guarded, used), neg(_in_free_queue(s, b))) for b, used in _table(q)]
    if layout.cfg.fences_freed_blocks:
        for _, _, ke, used in _entries(s):
            out += [z3.Implies(conj(used, lt(t, ke.blocks_len)), neg(_in_free_queue(s, b)))
                    for t, b in enumerate(ke.blocks)]
    return conj(out)


def kv2_loading_not_scheduled(layout: Layout, s: SState) -> Any:
    """KV2: a request in WAITING_FOR_REMOTE_KVS has its load in flight, failed
    or landed, is not running and has no live entry in flight."""
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        load = kv.load[r]
        live = disj(*[conj(used, eq(e.req, r), eq(e.fate, LIVE)) for _, e, _, used in _entries(s)])
        ok = conj(disj(eq(load, L_IN_FLIGHT), eq(load, L_FAILED), eq(load, L_RECEIVED)),
                  neg(member(V(r), s.running, s.running_len)), neg(live))
        out.append(z3.Implies(eq(q.status, REMOTE_KVS), ok))
    return conj(out)


def kv4_no_leak(layout: Layout, s: SState) -> Any:
    """KV4: a finished request holds a table exactly when it is held, and is
    held only for a transfer still to be reported (its load in flight, or a
    producer's send after a stop or the length cap); an unfinished one is
    never held; every deferred free waits for 1 to the non-empty batches in
    flight and frees a non-empty table (none without the fence: the frame
    holds none)."""
    kv, out = kv_of(s), []
    connector = layout.cfg.kv_connector
    producer = connector is not None and connector.producer
    for r, q in enumerate(s.reqs):
        held_for_send = disj(eq(q.status, F_STOPPED), eq(q.status, F_LENGTH)) if producer else z3.BoolVal(False)
        held_for_a_transfer = z3.Implies(kv.held[r], disj(in_transfer(kv.load[r]), held_for_send))
        out.append(z3.If(_finished(q.status), conj(lt(0, q.table_len) == kv.held[r], held_for_a_transfer),
                         neg(kv.held[r])))
    in_flight = batches_in_flight(s)
    for d, slot in enumerate(kv.deferred):
        out.append(z3.Implies(lt(d, kv.deferred_len), conj(le(1, slot.left), le(slot.left, in_flight),
                                                            lt(0, slot.length))))
    return conj(out)


def kv6_load_limit(layout: Layout, s: SState) -> Any:
    """KV6: loads in flight (aborted and failed ones included) and landed
    loads of unfinished requests never exceed the load limit (vLLM 0.34;
    true where there is none)."""
    kv, cfg = kv_of(s), layout.cfg
    limit = cfg.kv_connector.max_inflight_loads if cfg.rules.kv_inflight_load_limit else None
    if limit is None:
        return z3.BoolVal(True)
    active = [disj(*[eq(q.status, c) for c in (WAITING, RUNNING, PREEMPTED, REMOTE_KVS)]) for q in s.reqs]
    loads = count(disj(in_transfer(kv.load[r]), conj(eq(kv.load[r], L_RECEIVED), active[r]))
                  for r in range(layout.N))
    return le(loads, limit)


def kv_l2_no_deadlock(layout: Layout, s: SState, sch: Any) -> Any:
    """spec.deadlock.l2_no_deadlock with a connector, under the rules of
    vLLM 0.33 and 0.34 (empty batches; the connector's encoding takes no
    other): with only empty batches in flight, a request unfinished and no
    load or send to be reported, the drained state's schedule (`sch`, s's
    own: an empty batch holds no victim and is no deferred free's) forms a
    batch, preempts, or starts or promotes a load (`moves_a_load`: a
    request's load or status changes). Not in KV_FORMULAS: the connector
    models' rows do not read it; BMC of #57841's mutant does
    (priority_engines.priority_kv_l2_bmc)."""
    if not layout.cfg.rules.empty_batches or s.grammar or s.sess or s.rp:
        raise ValueError("kv_l2_no_deadlock reads a connector frame under empty batches, without other waits")
    kv, after = kv_of(s), kv_of(sch.state)
    unfinished = disj(*[disj(*[eq(q.status, c) for c in (WAITING, RUNNING, PREEMPTED, REMOTE_KVS)]) for q in s.reqs])
    waits = disj(*[disj(in_transfer(kv.load[r]), kv.held[r]) for r in range(layout.N)])
    drained = conj(*[z3.Implies(lt(k, s.num_batches), eq(b.length, 0)) for k, b in enumerate(s.batches)])
    forms = disj(lt(0, sch.count), sch.any_preempted)
    moved = disj(*[disj(neg(eq(a.status, b.status)), neg(eq(after.load[r], kv.load[r])))
                   for r, (a, b) in enumerate(zip(sch.state.reqs, s.reqs))])
    return z3.Implies(conj(drained, unfinished, neg(waits)), disj(forms, moved))


KV_FORMULAS: dict[str, KvFormula] = {
    "KV1_no_reuse_under_transfer": kv1_no_reuse_under_transfer,
    "KV2_loading_not_scheduled": kv2_loading_not_scheduled,
    "KV4_no_leak": kv4_no_leak,
    "KV6_load_limit": kv6_load_limit,
}


# --- auxiliary invariants of the connector models -----------------------------------

def _holders(layout: Layout, s: SState, b: int) -> Any:
    """How many tables and deferred frees hold block b."""
    kv = kv_of(s)
    in_tables = [conj(used, eq(x, b)) for q in s.reqs for x, used in _table(q)]
    in_deferred = [conj(lt(d, kv.deferred_len), lt(t, slot.length), eq(x, b))
                   for d, slot in enumerate(kv.deferred) for t, x in enumerate(slot.blocks)]
    return count(in_tables + in_deferred)


def kva1_pool_ownership(layout: Layout, s: SState) -> Any:
    """A block's reference count is the number of tables and deferred frees
    holding it, at most one (with prefix caching a hit shares it: no table
    or deferred free holds it twice); it is in the free queue, once, exactly when nobody
    holds it (S9's partition, read with deferred frees); without prefix
    caching no block caches a label."""
    out = []
    free = s.pool.free
    if not layout.cfg.prefix_caching:      # nothing is ever cached: no label, no copy rank
        out += [conj(eq(lab, layout.none_label), eq(rank, 0)) for lab, rank in zip(s.pool.label, s.pool.copy_rank)]
    else:                                  # no table, nor deferred free, holds a block twice
        kv = kv_of(s)
        tables = [_table(q) for q in s.reqs]
        tables += [[(x, conj(lt(d, kv.deferred_len), lt(t, slot.length))) for t, x in enumerate(slot.blocks)]
                   for d, slot in enumerate(kv.deferred)]
        out += [z3.Implies(conj(u, v), neg(eq(x, y))) for table in tables for t, (x, u) in enumerate(table)
                for y, v in table[t + 1:]]
    for b in range(layout.B):
        held = _holders(layout, s, b)
        out.append(eq(s.pool.ref[b], held))
        out += [] if layout.cfg.prefix_caching else [le(held, 1)]
        out.append(eq(count(conj(lt(j, s.pool.free_len), eq(x, b)) for j, x in enumerate(free)),
                      z3.If(eq(held, 0), V(1), V(0))))
    return conj(out)


def kva2_who_holds_a_table(layout: Layout, s: SState) -> Any:
    """Only running, parked, landed-and-promoted and held requests hold a
    table; a fresh request (load NONE) holds none and has computed nothing;
    a parked one's load was its first, and it never had an entry."""
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        load = kv.load[r]
        may = disj(eq(q.status, RUNNING), eq(q.status, REMOTE_KVS), conj(eq(q.status, WAITING), eq(load, L_RECEIVED)),
                   conj(_finished(q.status), kv.held[r]))
        out.append(z3.Implies(lt(0, q.table_len), may))
        out.append(z3.Implies(eq(load, L_NONE), conj(eq(q.table_len, 0), eq(q.num_computed, 0), neg(kv.held[r]))))
        mine = disj(*[conj(used, eq(e.req, r)) for _, e, _, used in _entries(s)])
        out.append(z3.Implies(disj(eq(q.status, REMOTE_KVS), eq(q.status, NEW), eq(load, L_NONE)), neg(mine)))
        out.append(z3.Implies(eq(q.status, REMOTE_KVS), lt(0, q.table_len)))
    return conj(out)


def kva3_fenced_blocks_stay(layout: Layout, s: SState) -> Any:
    """Under the fence, each block an in-flight entry writes is in its
    request's table at the same slot, or in a deferred free that waits for
    that entry's batch (more non-empty batches than precede it)."""
    if not layout.cfg.fences_freed_blocks:
        return z3.BoolVal(True)
    kv, out = kv_of(s), []
    before = [count(conj(lt(i, s.num_batches), lt(0, s.batches[i].length)) for i in range(k))
              for k in range(layout.K)]
    for k, e, ke, used in _entries(s):
        for t, b in enumerate(ke.blocks):
            own = disj(*[conj(eq(e.req, r), lt(t, q.table_len), eq(q.table[t], b)) for r, q in enumerate(s.reqs)])
            fenced = disj(*[conj(lt(d, kv.deferred_len), lt(before[k], slot.left),
                                 disj(*[conj(lt(u, slot.length), eq(x, b)) for u, x in enumerate(slot.blocks)]))
                            for d, slot in enumerate(kv.deferred)])
            out.append(z3.Implies(conj(used, lt(t, ke.blocks_len)), disj(own, fenced)))
    return conj(out)


def kva4_parked_tables_fit(layout: Layout, s: SState) -> Any:
    """A held, parked or landed request's blocks cover its computed tokens,
    and a request with nothing in transfer has its load settled."""
    kv, bs, out = kv_of(s), layout.cfg.block_size, []
    for r, q in enumerate(s.reqs):
        load = kv.load[r]
        out.append(z3.Implies(eq(q.status, REMOTE_KVS), le(q.num_computed, q.table_len * bs)))
        out.append(z3.Implies(conj(_finished(q.status), in_transfer(load)), kv.held[r]))
    return conj(out)


def kva5_queues(layout: Layout, s: SState) -> Any:
    """S10's queues read with a connector: a RUNNING request is once in
    `running` and nowhere else; a WAITING, PREEMPTED or parked one once in
    `waiting` or `kv_holding` and not in `running`; a parked one, and only a
    parked or landed-and-promoted one, in `kv_holding`; any other in none."""
    kv, out = kv_of(s), []

    def times(xs: list, length: Any, r: int) -> Any:
        return count(conj(lt(j, length), eq(x, r)) for j, x in enumerate(xs))

    for r, q in enumerate(s.reqs):
        running, waiting, holding = (times(s.running, s.running_len, r), times(s.waiting, s.waiting_len, r),
                                     times(kv.holding, kv.holding_len, r))
        queued = disj(eq(q.status, WAITING), eq(q.status, PREEMPTED), eq(q.status, REMOTE_KVS))
        out.append(eq(running, z3.If(eq(q.status, RUNNING), V(1), V(0))))
        out.append(eq(waiting + holding, z3.If(queued, V(1), V(0))))
        out.append(z3.Implies(eq(q.status, REMOTE_KVS), eq(holding, 1)))
        out.append(z3.Implies(lt(0, holding), disj(eq(q.status, REMOTE_KVS),
                                                   conj(eq(q.status, WAITING), eq(kv.load[r], L_RECEIVED)))))
    return conj(out)


def kva6_load_by_status(layout: Layout, s: SState) -> Any:
    """Which load a request's status allows: none before arrival; none or a
    landed one while WAITING; a settled one while RUNNING or PREEMPTED; one in
    flight, failed or landed while parked; only a parked request counts
    external tokens, at most its offer, all of them computed while its load
    is in flight (no local hit without prefix caching); an entry's sync
    load is within its offer and its start (none without sync loads); a
    model with sync loads parks nobody."""
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        load = kv.load[r]
        out.append(z3.Implies(eq(q.status, NEW), eq(load, L_NONE)))
        out.append(z3.Implies(eq(q.status, WAITING), disj(eq(load, L_NONE), eq(load, L_RECEIVED))))
        out.append(z3.Implies(disj(eq(q.status, RUNNING), eq(q.status, PREEMPTED)), eq(load, L_DONE)))
        out.append(z3.Implies(neg(eq(q.status, REMOTE_KVS)), eq(kv.external[r], 0)))
        hit = layout.model.prompts[r].external_hit
        out += [le(0, kv.external[r]), le(kv.external[r], max(hit, 0)),
                z3.Implies(conj(eq(q.status, REMOTE_KVS), eq(load, L_IN_FLIGHT)), eq(q.num_computed, kv.external[r]))]
    out += [z3.Implies(used, _entry_load(layout, e, ke)) for _, e, ke, used in _entries(s)]
    return conj(out + _sync_only(layout, s))


def _sync_only(layout: Layout, s: SState) -> list:
    """A model whose loads are all synchronous (kv_sync.py; no async load
    beside them, kv_state.refuse_unencoded_connector): nobody parks, so no
    request waits for remote KV, none is in `kv_holding`, and a load is
    never asked for or settled (NONE or DONE)."""
    from flightcheck.verification.z3.encoding.kv_sync import has_sync_loads
    if not has_sync_loads(layout):
        return []
    kv = kv_of(s)
    return [eq(kv.holding_len, 0)] + [conj(neg(eq(q.status, REMOTE_KVS)), disj(eq(load, L_NONE), eq(load, L_DONE)))
                                      for q, load in zip(s.reqs, kv.load)]


def _entry_load(layout: Layout, e: Any, ke: Any) -> Any:
    """An entry's sync load (kv_sync.py): none in a model without one; else
    at most its request's offer, block aligned, within its start."""
    from flightcheck.verification.z3.encoding.kv_sync import has_sync_loads
    from flightcheck.verification.z3.encoding.terms import div_const, pick
    if not has_sync_loads(layout):
        return eq(ke.external, 0)
    bs = layout.cfg.block_size
    offers = [V(max(p.external_hit, 0)) for p in layout.model.prompts]
    return conj(le(0, ke.external), le(ke.external, pick(offers, e.req, V(0))), le(ke.external, e.start),
                eq(div_const(ke.external, bs) * bs, ke.external))


def kva7_counters(layout: Layout, s: SState) -> Any:
    """S1 and vLLM 0.33's counters read with a connector: 0 <= num_computed
    <= the known tokens, 0 outside RUNNING except a parked or landed load's;
    0 <= num_output <= max_tokens; no drafts without spec decode; a
    waiting or parked request never ran (no output, no counters: a
    preempted one is PREEMPTED), and a finished one keeps no counters."""
    from flightcheck.verification.z3.encoding.requests import max_tokens, num_tokens
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        landed = disj(eq(q.status, REMOTE_KVS), conj(eq(q.status, WAITING), eq(kv.load[r], L_RECEIVED)))
        out += [le(0, q.num_computed), le(q.num_computed, num_tokens(layout, q, r)),
                z3.Implies(neg(disj(eq(q.status, RUNNING), landed)), eq(q.num_computed, 0)),
                le(0, q.num_output), le(q.num_output, max_tokens(layout, q, r))]
        if not layout.cfg.num_spec_tokens:
            out.append(eq(q.num_drafts, 0))
        never_ran = disj(eq(q.status, NEW), eq(q.status, WAITING), eq(q.status, REMOTE_KVS))
        if s.counters:
            c = s.counters[r]
            idle = conj(eq(c.in_flight, 0), eq(c.stale, 0), neg(c.drop))
            out.append(z3.Implies(disj(never_ran, _finished(q.status)), idle))
        out.append(z3.Implies(never_ran, eq(q.num_output, 0)))
    return conj(out)


def kva8_entries_and_counters(layout: Layout, s: SState) -> Any:
    """Every in-flight entry starts at >= 0, holds 1 to max_model_len tokens
    and ends within max_model_len, no drafts without spec decode; and IF0-IF2
    read with a connector (a parked request is unfinished too): an
    unfinished request's in-flight counter is the tokens of its entries in
    flight, its stale counter those of its entries no longer live."""
    from flightcheck.verification.z3.encoding.state import ORPHANED, SUPERSEDED
    from flightcheck.verification.z3.encoding.terms import sum_terms
    cfg, out = layout.cfg, []
    for _, e, _, used in _entries(s):
        mml = cfg.max_model_len          # each bounded alone first: the bit-vector sum cannot wrap
        bounds = [le(0, e.start), le(e.start, mml), le(1, e.n), le(e.n, mml), le(e.start + e.n, mml)]
        if not cfg.num_spec_tokens:
            bounds.append(eq(e.drafts, 0))
        out.append(z3.Implies(used, conj(bounds)))
    for r, (q, c) in enumerate(zip(s.reqs, s.counters)):
        mine = [(e, conj(used, eq(e.req, r))) for _, e, _, used in _entries(s)]
        tokens = sum_terms([z3.If(m, e.n, V(0)) for e, m in mine])
        stale = sum_terms([z3.If(conj(m, disj(eq(e.fate, ORPHANED), eq(e.fate, SUPERSEDED))), e.n, V(0))
                           for e, m in mine])
        unfinished = disj(eq(q.status, WAITING), eq(q.status, RUNNING), eq(q.status, PREEMPTED), eq(q.status, REMOTE_KVS))
        out.append(z3.Implies(unfinished, conj(eq(c.in_flight, tokens), eq(c.stale, stale), le(0, c.stale),
                                               le(c.stale, c.in_flight))))
        out.append(le(c.in_flight, layout.K * layout.E * cfg.max_model_len))
    return conj(out)


def kva9_deferred_in_order(layout: Layout, s: SState) -> Any:
    """Deferred frees wait for no fewer batches than those before them (each
    joins with every non-empty batch then in flight, and all count down
    together), so the drain's stop at the first pending one frees every
    one that is done."""
    kv = kv_of(s)
    return conj([z3.Implies(lt(d + 1, kv.deferred_len), le(a.left, b.left))
                 for d, (a, b) in enumerate(zip(kv.deferred, kv.deferred[1:]))])


KV_AUXILIARY: dict[str, KvFormula] = {
    "KVA5_queues": kva5_queues,
    "KVA9_deferred_in_order": kva9_deferred_in_order,
    "KVA8_entries_and_counters": kva8_entries_and_counters,
    "KVA7_counters": kva7_counters,
    "KVA6_load_by_status": kva6_load_by_status,
    "KVA1_pool_ownership": kva1_pool_ownership,
    "KVA2_who_holds_a_table": kva2_who_holds_a_table,
    "KVA3_fenced_blocks_stay": kva3_fenced_blocks_stay,
    "KVA4_parked_tables_fit": kva4_parked_tables_fit,
}

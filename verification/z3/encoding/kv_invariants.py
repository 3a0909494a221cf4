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
from flightcheck.verification.z3.encoding.kv_state import L_FAILED, L_IN_FLIGHT, L_NONE, L_RECEIVED
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
    """KV4: a finished request holds a table exactly when it is held for a
    transfer, an unfinished one is never held; every deferred free waits for
    1 to the non-empty batches in flight and frees a non-empty table (none
    without the fence: the frame holds none)."""
    kv, out = kv_of(s), []
    for r, q in enumerate(s.reqs):
        out.append(z3.If(_finished(q.status), lt(0, q.table_len) == kv.held[r], neg(kv.held[r])))
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
    holding it, at most one; it is in the free queue, once, exactly when
    nobody holds it (S9's partition, read with deferred frees)."""
    out = []
    free = s.pool.free
    for b in range(layout.B):
        held = _holders(layout, s, b)
        out += [eq(s.pool.ref[b], held), le(held, 1)]
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


KV_AUXILIARY: dict[str, KvFormula] = {
    "KVA1_pool_ownership": kva1_pool_ownership,
    "KVA2_who_holds_a_table": kva2_who_holds_a_table,
    "KVA3_fenced_blocks_stay": kva3_fenced_blocks_stay,
    "KVA4_parked_tables_fit": kva4_parked_tables_fit,
}

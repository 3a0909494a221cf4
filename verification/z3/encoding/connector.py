"""The KV connector in Z3 (spec/kv_fence.py and spec/kv_reports.py,
docs/kv-connector.md): where a request's blocks go when it is freed (at
once, behind the step fence, or held for a transfer), the fence's drain
when a batch completes, and the connector's reports as environment actions:
`receive_kv`, `fail_kv_load`, `send_kv`. The schedule's connector path is
in kv_schedule.py.

Each function is the spec function of the same name on a symbolic state,
clause for clause; all of them act only on frames with a connector part
(`SState.kv`), and the encoding calls them only there.

A sync load's failure (a running loader's, or a finished one's reported
with its carrier) is kv_sync.py's, built only where a prompt is offered one.

Left out (the encoding refuses a model that needs them,
kv_state.`refuse_unencoded_connector`): synchronous loads under the fail
policy; async loads or a producer beside sync loads or prefix caching (no
parked holder of a sync load's blocks, no promoted load's labels); vLLM
0.34's load limit with `max_inflight_loads` (the `arrivals` order and
loads-only mode); asynchronous scheduling with a connector.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.kv_state import (
    L_DONE,
    L_FAILED,
    L_IN_FLIGHT,
    L_NONE,
    L_RECEIVED,
    PAD,
    SDeferred,
    SKv,
    pad_deferred,
    pad_kv_entry,
)
from flightcheck.verification.z3.encoding.kv_sync import has_sync_loads, sync_failure
from flightcheck.verification.z3.encoding.requests import (
    empty_table,
    put_flag,
    req_at,
    with_async,
    with_counters,
    with_req,
)
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_ERROR,
    F_LENGTH,
    F_STOPPED,
    LIVE,
    ORPHANED,
    REMOTE_KVS,
    SUPERSEDED,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    V,
    clone,
    conj,
    count,
    disj,
    div_const,
    eq,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    remove,
)

RECEIVE, FAIL, SEND = 4, 5, 6        # the connector's action codes (Choices.act), after actions.py's four


# --- a request's connector fields --------------------------------------------------

def kv_of(s: SState) -> SKv:
    return s.kv[0]


def load_at(s: SState, r: Any) -> Any:
    return pick(kv_of(s).load, r)


def held_at(s: SState, r: Any) -> Any:
    return pick(kv_of(s).held, r, z3.BoolVal(False))


def with_kv(s: SState, r: Any, when: Any = True, **fields: Any) -> SState:
    """s with request r's connector fields (load, external, held) set, if `when`."""
    out = clone(s)
    kv = kv_of(out)
    for name, value in fields.items():
        setattr(kv, name, [ite(conj(when, eq(r, k)), value, old) for k, old in enumerate(getattr(kv, name))])
    return out


def in_transfer(load: Any) -> Any:
    """spec Load.in_transfer: the worker may still write the request's blocks."""
    return disj(eq(load, L_IN_FLIGHT), eq(load, L_FAILED))


# --- the step fence (spec/kv_fence.py) ----------------------------------------------

def batches_in_flight(s: SState) -> Any:
    """Non-empty batches in flight (`sched_step_seq - processed_step_seq`)."""
    return count(conj(lt(k, s.num_batches), lt(0, b.length)) for k, b in enumerate(s.batches))


def has_batch_in_flight(s: SState, r: Any) -> Any:
    """Some in-flight entry of r, whatever its fate."""
    return disj(*[conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r))
                  for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)])


def release_table(layout: Layout, s: SState, r: Any, table: list, table_len: Any, when: Any = True) -> SState:
    """kv_fence.release_table: r's table back to the pool, or put aside as
    one deferred free behind the non-empty batches in flight while r has an
    entry in one of them (only where the fence is in force)."""
    when = conj(when, lt(0, table_len))
    out = clone(s)
    if not layout.cfg.fences_freed_blocks:
        out.pool = zb.free_table(layout, s.pool, table, table_len, when)
        return out
    fenced = has_batch_in_flight(s, r)
    out.pool = zb.free_table(layout, s.pool, table, table_len, conj(when, neg(fenced)))
    kv, put_aside = kv_of(out), conj(when, fenced)
    entry = SDeferred(batches_in_flight(s), table_len, list(table))
    kv.deferred = [merge(conj(put_aside, eq(kv.deferred_len, d)), entry, slot) for d, slot in enumerate(kv.deferred)]
    kv.deferred_len = ite(put_aside, kv.deferred_len + 1, kv.deferred_len)
    return out


def drain_deferred_frees(layout: Layout, s: SState, completed_nonempty: Any) -> SState:
    """kv_fence.drain_deferred_frees: a completed non-empty batch counts every
    deferred free down by one; those at 0 are freed oldest first, up to the
    first still pending."""
    kv0 = kv_of(s)
    if not kv0.deferred:
        return s
    out = clone(s)
    kv = kv_of(out)
    used = [conj(completed_nonempty, lt(d, kv0.deferred_len)) for d in range(len(kv0.deferred))]
    lefts = [ite(u, slot.left - 1, slot.left) for u, slot in zip(used, kv0.deferred)]
    going, pops = z3.BoolVal(True), []
    for u, left in zip(used, lefts):
        going = conj(going, u, le(left, 0))
        pops.append(going)
    pool = s.pool
    for popped, slot in zip(pops, kv0.deferred):
        pool = zb.free_table(layout, pool, slot.blocks, slot.length, popped)
    out.pool = pool
    num_popped = count(pops)
    shifted = [SDeferred(left, slot.length, list(slot.blocks)) for left, slot in zip(lefts, kv0.deferred)]
    cap = len(shifted)
    kv.deferred = [_shift_slot(layout, shifted, d, num_popped, cap) for d in range(cap)]
    kv.deferred_len = kv0.deferred_len - num_popped
    return out


def _shift_slot(layout: Layout, slots: list, d: int, num_popped: Any, cap: int) -> SDeferred:
    """The deferred free at slot d once `num_popped` have left the head (padding past the end)."""
    out = pad_deferred(layout)
    for p in range(cap - 1, -1, -1):
        src = slots[d + p] if d + p < cap else pad_deferred(layout)
        out = merge(eq(num_popped, p), src, out)
    return out


def shift_entries(layout: Layout, s: SState) -> SState:
    """complete_oldest's FIFO pop for the entries' connector fields."""
    out = clone(s)
    kv = kv_of(out)
    kv.entries = [list(row) for row in kv.entries[1:]] + [[pad_kv_entry(layout) for _ in range(layout.E)]]
    return out


# --- finishing with a connector (kv_fence.finish_with_connector) --------------------

def holds_for_transfer(layout: Layout, s: SState, r: Any, status: Any) -> Any:
    """kv_fence.holds_for_transfer: r, finishing with `status`, keeps its table
    for its async load in flight, or for a producer's send."""
    cfg, q = layout.cfg, req_at(s, r)
    loading = conj(eq(q.status, REMOTE_KVS), in_transfer(load_at(s, r)))
    producer = cfg.kv_connector.producer and cfg.rules.kv_send_hold
    send = conj(producer, disj(eq(status, F_STOPPED), eq(status, F_LENGTH)))
    return conj(lt(0, q.table_len), ite(loading, z3.BoolVal(cfg.rules.kv_aborted_load_held), send))


def finish_with_connector(layout: Layout, s: SState, r: Any, status: Any, when: Any = True) -> SState:
    """kv_fence.finish_with_connector, then actions._forget_counters: out of
    every queue, in-flight work superseded, the table held or released."""
    q, load = req_at(s, r), load_at(s, r)
    held = holds_for_transfer(layout, s, r, status)
    st = release_table(layout, s, r, q.table, q.table_len, neg(held))
    st.waiting, st.waiting_len = remove(s.waiting, s.waiting_len, r)
    st.running, st.running_len = remove(s.running, s.running_len, r)
    kv = kv_of(st)
    kv.holding, kv.holding_len = remove(kv.holding, kv.holding_len, r)
    st.scheduled = put_flag(s.scheduled, r, z3.BoolVal(False))
    for b in st.batches:
        for e in b.entries:
            mine = conj(eq(e.req, r), disj(eq(e.fate, LIVE), eq(e.fate, ORPHANED)))
            e.fate = ite(mine, V(SUPERSEDED), e.fate)
    new_load = ite(conj(in_transfer(load), held), load, ite(eq(load, L_NONE), V(L_NONE), V(L_DONE)))
    st = with_req(st, r, status=status, num_computed=V(0), num_drafts=V(0),
                  table_len=ite(held, q.table_len, V(0)), table=[ite(held, x, V(PAD)) for x in q.table])
    st = with_kv(st, r, held=held, load=new_load, external=V(0))
    st = with_counters(st, r, in_flight=V(0), stale=V(0), drop=z3.BoolVal(False))
    st = with_async(st, r, placeholders=V(0), countdown=V(0))
    return merge(when, st, s)


# --- the connector's reports (spec/kv_reports.py) -----------------------------------

def receive_guard(layout: Layout, s: SState, r: Any) -> Any:
    return conj(le(0, r), lt(r, layout.N), in_transfer(load_at(s, r)))


def receive_kv(layout: Layout, s: SState, r: Any) -> SState:
    """`finished_recving`: a parked load has landed; an aborted or failed
    request's held table is freed now."""
    q = req_at(s, r)
    parked = eq(q.status, REMOTE_KVS)
    landed = with_kv(s, r, load=V(L_RECEIVED))
    freed = release_table(layout, s, r, q.table, q.table_len)
    freed = with_req(freed, r, table_len=V(0), table=empty_table(layout))
    freed = with_kv(freed, r, held=z3.BoolVal(False), load=V(L_DONE))
    return merge(parked, landed, freed)


def send_guard(layout: Layout, s: SState, r: Any) -> Any:
    q = req_at(s, r)
    finished = disj(*[eq(q.status, c) for c in _FINISHED])
    return conj(le(0, r), lt(r, layout.N), finished, held_at(s, r), neg(in_transfer(load_at(s, r))))


def send_kv(layout: Layout, s: SState, r: Any) -> SState:
    """`finished_sending`: the held table is freed (behind the fence where it is in force)."""
    q = req_at(s, r)
    st = release_table(layout, s, r, q.table, q.table_len)
    st = with_req(st, r, table_len=V(0), table=empty_table(layout))
    return with_kv(st, r, held=z3.BoolVal(False))


def failable(layout: Layout, s: SState, r: Any, from_block: Any) -> Any:
    """kv_reports.failable_blocks (async loads only, kv_schedule.py): block
    `from_block` of a parked request's load in flight, within the load
    `[(num_computed - external) // bs, cdiv(num_computed, bs))`, or 0 (the
    request-level `failed_recving`)."""
    bs = layout.cfg.block_size
    q = req_at(s, r)
    parked = conj(eq(q.status, REMOTE_KVS), eq(load_at(s, r), L_IN_FLIGHT))
    external = pick(kv_of(s).external, r)
    low = _floor_div(q.num_computed - external, bs)
    high = _floor_div(q.num_computed + (bs - 1), bs)
    return conj(parked, disj(eq(from_block, 0), conj(le(low, from_block), lt(from_block, high))))


def _floor_div(x: Any, d: int) -> Any:
    return div_const(x, d)


def fail_guard(layout: Layout, s: SState, r: Any, from_block: Any) -> Any:
    if not layout.cfg.rules.kv_load_failures or not fails_loads(layout.model):
        return z3.BoolVal(False)
    guard = failable(layout, s, r, from_block)
    if has_sync_loads(layout):          # a sync load's, running or finished (kv_sync.py)
        guard = disj(guard, sync_failure(layout, s, r, from_block)[0])
    return conj(le(0, r), lt(r, layout.N), guard)


def fail_kv_load(layout: Layout, s: SState, r: Any, from_block: Any) -> SState:
    """`fail_kv_load` of a parked async load: recompute rolls it back to
    `from_block * block_size` with its load FAILED; fail finishes it with
    FINISHED_ERROR, its load FAILED (its table held for the report). A sync
    load's failure: kv_sync.sync_failure."""
    failed = with_kv(s, r, load=V(L_FAILED))
    if layout.cfg.kv_connector.load_failure_policy == "fail":
        return finish_with_connector(layout, failed, r, V(F_ERROR))
    parked = with_req(failed, r, num_computed=from_block * layout.cfg.block_size)
    if not has_sync_loads(layout):
        return parked
    sync, st = sync_failure(layout, s, r, from_block)
    return merge(sync, st, parked)


_FINISHED = (F_STOPPED, F_LENGTH, F_ABORTED, F_ERROR)


# --- the reports as actions of the transition relation (system.py) ------------------

def connector_transitions(layout: Layout, builder, s: SState, ch) -> tuple[list, list, list]:
    """Guards and effects of receive_kv, fail_kv_load and send_kv (action
    codes RECEIVE, FAIL, SEND) from frame s, and what makes their choices
    legal: `from_block` is 0 unless the step fails a load."""
    r, fb = ch.req, ch.from_block
    guards = [receive_guard(layout, s, r), fail_guard(layout, s, r, fb), send_guard(layout, s, r)]
    effects = [builder.snap(receive_kv(layout, s, r), "receive"), builder.snap(fail_kv_load(layout, s, r, fb), "fail"),
               builder.snap(send_kv(layout, s, r), "send")]
    legal = [z3.Implies(neg(eq(ch.act, FAIL)), eq(fb, 0))]
    return guards, effects, legal


def connector_action(act: int, r: int, from_block: int):
    """The spec's action for a decoded connector step."""
    from flightcheck.spec.transitions import FailKvLoad, ReceiveKv, SendKv
    if act == RECEIVE:
        return ReceiveKv(r)
    if act == FAIL:
        return FailKvLoad(r, from_block)
    return SendKv(r)


def fails_loads(model) -> bool:
    """Whether the model's connector may report failed loads (`Model.kv_failures`)."""
    return getattr(model, "kv_failures", False)


def connector_reports(model, s):
    """Every report the connector could make from concrete state s, with its
    successor: each request's receive, send and failure from each block
    (the spec's own guards pick the enabled ones), so the cross-check does
    not rest on the search's enumeration of them."""
    from flightcheck.spec import step
    from flightcheck.spec.transitions import FailKvLoad, ReceiveKv, SendKv
    from flightcheck.verification.mutants import applied
    tries = [a for r in range(len(s.requests)) for a in (ReceiveKv(r), SendKv(r))]
    if fails_loads(model):
        blocks = -(-model.cfg.max_model_len // model.cfg.block_size)
        tries += [FailKvLoad(r, b) for r in range(len(s.requests)) for b in range(blocks)]
    with applied(model.mutant):
        found = [(a, nxt) for a in tries if (nxt := step(s, model.cfg, a)) is not None]
    return iter(found)

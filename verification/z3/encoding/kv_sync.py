"""Synchronous loads and prefix caching beside the KV connector in Z3
(spec/kv_loads.py `connector_offer`, spec.schedule `_admit_with_connector`,
spec/kv_reports.py's failures of a sync load, spec/kv_invalid.py's
`invalid_kv`): the shape of KV7's models (verification/kv_models.py
`kv-invalid-k2`), a consumer under the recompute policy whose loads are all
synchronous, with prefix caching (kv_state.`refuse_unencoded_connector`
refuses async loads or a producer beside them).

* Admission (vLLM 0.34 `Scheduler.schedule`, waiting loop: the local hit
  of `get_computed_blocks`, then `get_num_new_matched_tokens`): a request
  with nothing computed takes its prefix hit, the connector's sync offer
  past it (block aligned, the last token left to compute), and
  `allocate_slots` caches every full block up to the end of its chunk. The
  tokens the load brings ride on the entry (`Entry.external`); during the
  call they wait in the request's `external` (0 for every running request
  otherwise), which `kv_launch` moves onto the entry.
* Failures (`_update_requests_with_invalid_blocks`, `_handle_invalid_blocks`):
  of a running loader (block `from_block` within its load), and of a
  finished (aborted) one's load reported with the batch that carried it
  (`_fail_holders_of_finished`). Each static request r has its own circuit,
  merged on the action's request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.allocation import blocks_for, cache_full_blocks, candidate, concat
from flightcheck.verification.z3.encoding.kv_state import L_NONE, PAD, kv_offer
from flightcheck.verification.z3.encoding.requests import label_at, req_at, with_counters, with_req
from flightcheck.verification.z3.encoding.state import (F_ABORTED, F_ERROR, F_LENGTH, F_STOPPED, LIVE, RUNNING,
                                                        SUPERSEDED, Layout, SState)
from flightcheck.verification.z3.encoding.terms import (
    V,
    Builder,
    clone,
    conj,
    count,
    disj,
    div_const,
    eq,
    imax,
    imin,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    sum_terms,
)


def has_sync_loads(layout: Layout) -> bool:
    """Some prompt is offered a synchronous load (the connector's sync path is built)."""
    return any(layout.cfg.kv_connector is not None and kv_offer(layout, r, True)["external_hit"] > 0
               and not kv_offer(layout, r, True)["load_async"] for r in range(layout.N))


# --- the waiting loop's admission ----------------------------------------------------

def connector_offer(layout: Layout, st: SState, r: Any, tokens: Any, local: Any) -> tuple[Any, Any]:
    """kv_loads.connector_offer: (external tokens, async). Asked once (load
    NONE); an async hit takes the tokens past the local hit, a sync one
    those short of the last token, block aligned."""
    from flightcheck.verification.z3.encoding.reset_pause_state import offered_by_prompt
    bs = layout.cfg.block_size
    offers = [kv_offer(layout, k, True) for k in range(layout.N)]
    hits = [ite(offered_by_prompt(layout, st, k), V(o["external_hit"]), V(0)) for k, o in enumerate(offers)]
    hit = ite(eq(req_at(st, r).status, 0), V(0), pick(hits, r, V(0)))      # 0 once a reset took it
    is_async = pick([z3.BoolVal(o["load_async"]) for o in offers], r, z3.BoolVal(False))
    asks = conj(eq(pick(st.kv[0].load, r), L_NONE), lt(0, hit))     # connector.load_at (which imports this module)
    async_external = imax(V(0), imin(hit, tokens - local))
    sync_external = div_const(imax(V(0), imin(hit, tokens - 1 - local)), bs) * bs
    external = ite(is_async, async_external, sync_external)
    return ite(asks, external, V(0)), conj(asks, is_async, lt(0, external))


@dataclass(frozen=True)
class Hit:
    """A local prefix hit: the blocks hit (T slots, PAD past `num_hit`) and how many."""

    blocks: list
    num_hit: Any


def prefix_hit(layout: Layout, builder: Builder, st: SState, r: Any, q: Any, tokens: Any) -> Hit:
    """spec.schedule._prefix_hit, taken only with nothing computed (a
    promoted load's request asks none): cached blocks of r's known tokens,
    never all of them."""
    if not layout.cfg.prefix_caching:
        return Hit([], V(0))
    bs = layout.cfg.block_size
    labels = [label_at(layout, st, r, i) for i in range(layout.T)]
    num_hit, hit = zb.lookup_hit(layout, builder, st.pool, labels, div_const(tokens, bs), div_const(tokens - 1, bs))
    asked = eq(q.num_computed, 0)
    return Hit([ite(asked, b, V(PAD)) for b in hit], builder.let("kv_num_hit", ite(asked, num_hit, V(0))))


def admission_fits_whole(layout: Layout, st: SState, q: Any, tokens: Any, hit: Hit) -> Any:
    """spec.schedule._fits_whole (vLLM 0.33/0.34 full-sequence admission): the
    blocks r's whole sequence needs beyond its hit and the blocks it holds
    (a promoted load's) fit among the free blocks not being hit."""
    if not layout.cfg.rules.full_sequence_admission:
        return z3.BoolVal(True)
    whole = blocks_for(layout, imin(tokens, V(layout.cfg.max_model_len)))
    return zb.can_allocate(st.pool, imax(V(0), whole - hit.num_hit - q.table_len), hit.blocks, hit.num_hit)


def allocate_with_hit(layout: Layout, builder: Builder, st: SState, r: Any, q: Any, tokens: Any, hit: Hit,
                      total: Any) -> tuple[Any, SState]:
    """spec.schedule._allocate for an admission: (it fits, the state with the
    hit touched, fresh blocks popped after it, r's table holding both, and
    every full block up to `total` tokens cached)."""
    num_fresh = builder.let("kv_num_fresh", imax(V(0), blocks_for(layout, total) - q.table_len - hit.num_hit))
    fits = zb.can_allocate(st.pool, num_fresh, hit.blocks, hit.num_hit)
    pool = zb.touch(layout, builder, st.pool, hit.blocks, hit.num_hit) if hit.blocks else st.pool
    pool, fresh = zb.pop_fresh(layout, pool, num_fresh, layout.T)
    new_blocks = concat(layout, hit.blocks, hit.num_hit, fresh, num_fresh) if hit.blocks else fresh
    table, table_len = zb.append_blocks(layout, q.table, q.table_len, new_blocks, hit.num_hit + num_fresh)
    pool = cache_full_blocks(layout, candidate(st, r, q, tokens), pool, table, table_len, total)
    out = clone(st)
    out.pool = pool
    return fits, with_req(out, r, table_len=table_len, table=table)


# --- a sync load's entry and the blocks its failure makes invalid --------------------

@dataclass(frozen=True)
class LoadEntry:
    """Request r's entry in flight carrying its sync load (one at most: the
    offer is made once, and a reported failure zeroes it, `_report_taken`)."""

    found: Any
    batch: Any          # its batch's index in flight (the carrier)
    start: Any
    external: Any


def load_entry(s: SState, r: int, live_only: bool) -> LoadEntry:
    """kv_reports._load_entry: live while r runs, of any fate once r finished."""
    kv = s.kv[0]
    found, batch, start, external = z3.BoolVal(False), V(-1), V(0), V(0)
    for k, b in enumerate(s.batches):
        for j, e in enumerate(b.entries):
            here = conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r), lt(0, kv.entries[k][j].external))
            if live_only:
                here = conj(here, eq(e.fate, LIVE))
            found = disj(found, here)
            batch, start = ite(here, V(k), batch), ite(here, e.start, start)
            external = ite(here, kv.entries[k][j].external, external)
    return LoadEntry(found, batch, start, external)


def load_blocks(layout: Layout, e: LoadEntry, from_block: Any) -> tuple[Any, Any]:
    """(from_block lies within the load `[(start - external) // bs, cdiv(start, bs))`, the load's end)."""
    bs = layout.cfg.block_size
    end = div_const(e.start + (bs - 1), bs)
    return conj(e.found, le(div_const(e.start - e.external, bs), from_block), lt(from_block, end)), end


def running_invalid(layout: Layout, s: SState, r: int, from_block: Any, end: Any) -> list:
    """kv_reports._invalid_blocks of a running loader: its table's blocks from `from_block` to the load's end."""
    q = s.reqs[r]
    return [disj(*[conj(le(from_block, t), lt(t, end), lt(t, q.table_len), eq(x, b)) for t, x in enumerate(q.table)])
            for b in range(layout.B)]


def finished_invalid(layout: Layout, s: SState, r: int, from_block: Any, end: Any) -> list:
    """kv_reports._invalid_blocks once r finished: the blocks still caching
    the labels of its prompt blocks from `from_block` to the load's end."""
    labels = layout.model.prompts[r].labels if layout.cfg.prefix_caching else ()
    served = [zb.cached_block(layout, s.pool, V(label)) for label in labels]
    return [disj(*[conj(le(from_block, t), lt(t, end), found, eq(block, b)) for t, (found, block) in enumerate(served)])
            for b in range(layout.B)]


def computed_hits(layout: Layout, s: SState, h: int, invalid: list) -> list:
    """Per slot of h's table: a block of its computed prefix that is invalid."""
    q, bs = s.reqs[h], layout.cfg.block_size
    end = div_const(q.num_computed + (bs - 1), bs)
    return [conj(lt(t, end), lt(t, q.table_len), pick(invalid, x, z3.BoolVal(False))) for t, x in enumerate(q.table)]


def running_at(s: SState, h: int) -> tuple[Any, Any]:
    """(h is in `running`, its position there)."""
    here = [conj(lt(i, s.running_len), eq(x, h)) for i, x in enumerate(s.running)]
    pos = V(len(here))
    for i in range(len(here) - 1, -1, -1):
        pos = ite(here[i], V(i), pos)
    return disj(*here), pos


# --- the recompute of a sync load's failure (spec/kv_reports.py) --------------------

def rollback(layout: Layout, s: SState, h: int, valid: Any, when: Any) -> SState:
    """kv_reports.rollback, if `when`: h back to `valid` tokens, every live
    entry of it superseded, the stale counter taking their tokens as dropped
    output (vLLM 0.33's counters; no placeholders in a model this takes)."""
    out = clone(s)
    live_n = []
    for k, b in enumerate(out.batches):
        for j, e in enumerate(b.entries):
            mine = conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, h), eq(e.fate, LIVE))
            live_n.append(ite(mine, e.n, V(0)))
            e.fate = ite(conj(when, mine), V(SUPERSEDED), e.fate)
    out = with_req(out, h, when, num_computed=valid, num_drafts=V(0))
    if out.counters and layout.cfg.rules.stale_output_counters:
        c = out.counters[h]
        out = with_counters(out, h, when, stale=c.stale + sum_terms(live_n), drop=z3.BoolVal(True))
    return out


def revert_to_carrier(layout: Layout, s: SState, h: int, carrier: Any, when: Any) -> SState:
    """kv_reports._revert_to_carrier, if `when`: h keeps its invalid blocks and
    loses its live entry in the carrying batch and every later one."""
    found, start = z3.BoolVal(False), V(0)
    for k, b in enumerate(s.batches):
        for j, e in enumerate(b.entries):
            here = conj(eq(carrier, k), lt(k, s.num_batches), lt(j, b.length), eq(e.req, h), eq(e.fate, LIVE))
            found, start = disj(found, here), ite(here, e.start, start)
    return rollback(layout, s, h, start, conj(when, found))


def _first(flags: list) -> Any:
    """The first slot whose flag holds (len(flags) if none)."""
    out = V(len(flags))
    for t in range(len(flags) - 1, -1, -1):
        out = ite(flags[t], V(t), out)
    return out


def scan_running(layout: Layout, s: SState, invalid: list, carrier: Any, quarantine: bool) -> tuple[SState, list]:
    """kv_reports._scan_invalid_blocks' pass over `running` (no parked load in
    a model this takes): (the state, the blocks it evicts under the fix). Each
    holder recomputes from its first invalid block no earlier holder marked
    (under the fix, from its first); one whose invalid blocks all were marked
    reverts to the carrier. Each request's hits are its own blocks, which no
    other holder's rollback changes, so the holders are taken per request,
    the marks from those before it in `running`."""
    bs, N = layout.cfg.block_size, layout.N
    where = [running_at(s, h) for h in range(N)]
    hits = [computed_hits(layout, s, h, invalid) for h in range(N)]
    evicted = list(invalid) if quarantine else [z3.BoolVal(False)] * layout.B
    st = s
    for h in range(N):
        (inside, pos), q = where[h], s.reqs[h]
        fresh = hits[h]
        if not quarantine:
            marked = [disj(*[conj(where[g][0], lt(where[g][1], pos), hit, eq(s.reqs[g].table[t], b))
                             for g in range(N) if g != h for t, hit in enumerate(hits[g])]) for b in range(layout.B)]
            fresh = [conj(hit, neg(pick(marked, x, z3.BoolVal(False)))) for hit, x in zip(hits[h], q.table)]
            st = revert_to_carrier(layout, st, h, carrier, conj(inside, disj(*hits[h]), neg(disj(*fresh))))
        first, cut = _first(fresh), conj(inside, disj(*fresh))
        st = rollback(layout, st, h, first * bs, cut)
        evicted = [disj(ev, conj(cut, disj(*[conj(le(first, t), lt(t, q.table_len), eq(x, b))
                                                                   for t, x in enumerate(q.table)])))
                   for b, ev in enumerate(evicted)]
    return st, evicted


def uncache(layout: Layout, s: SState, evicted: list) -> SState:
    """blocks.uncache (`BlockPool.evict_blocks`): the blocks leave the prefix
    cache where they are, every later copy of a label moving up one rank."""
    out = clone(s)
    pool = s.pool
    out.pool.label = [ite(ev, V(layout.none_label), lab) for ev, lab in zip(evicted, pool.label)]
    out.pool.copy_rank = [ite(evicted[b], V(0), pool.copy_rank[b] - count(
        conj(evicted[g], eq(pool.label[g], pool.label[b]), lt(pool.copy_rank[g], pool.copy_rank[b]))
        for g in range(layout.B) if g != b)) for b in range(layout.B)]
    return out


def report_taken(layout: Layout, s: SState, r: int) -> SState:
    """kv_reports._report_taken: where KV7 is checked, r's entry carrying its
    sync load brings nothing in from here (a load fails once)."""
    if not layout.cfg.check_invalid_kv:
        return s
    out = clone(s)
    for k, (b, row) in enumerate(zip(s.batches, out.kv[0].entries)):
        for j, (e, ke) in enumerate(zip(b.entries, row)):
            mine = conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r))
            ke.external = ite(mine, V(0), ke.external)
    return out


def mark_invalid(s: SState, invalid: list) -> SState:
    """kv_invalid.mark_invalid: the blocks join `invalid_kv` (where the frame has it)."""
    if not s.kv[0].invalid:
        return s
    out = clone(s)
    out.kv[0].invalid = [disj(old, new) for old, new in zip(s.kv[0].invalid, invalid)]
    return out


def _holds_any(layout: Layout, s: SState, invalid: list) -> Any:
    """Some running request holds an invalid block in its computed prefix."""
    return disj(*[conj(running_at(s, h)[0], disj(*computed_hits(layout, s, h, invalid)))
                  for h in range(layout.N)])


def _fail_running(layout: Layout, s: SState, r: int, from_block: Any) -> tuple[Any, SState]:
    """fail_kv_load of running r's sync load from `from_block` (recompute):
    under the fix every holder cut at its own first invalid block and the
    blocks evicted (`_scan_invalid_blocks`); else the blocks marked, every
    other holder reverted to the carrier, r rolled back."""
    e = load_entry(s, r, live_only=True)
    within, end = load_blocks(layout, e, from_block)
    invalid = running_invalid(layout, s, r, from_block, end)
    if layout.cfg.rules.kv_recompute_quarantines_invalid:
        st, evicted = scan_running(layout, s, invalid, e.batch, True)
        st = uncache(layout, st, evicted)
    else:
        st = s
        for h in range(layout.N):
            if h != r:
                holder = conj(running_at(s, h)[0], disj(*computed_hits(layout, s, h, invalid)))
                st = revert_to_carrier(layout, st, h, e.batch, holder)
        st = rollback(layout, st, r, from_block * layout.cfg.block_size, z3.BoolVal(True))
    guard = conj(eq(s.reqs[r].status, RUNNING), within)
    return guard, mark_invalid(report_taken(layout, st, r), invalid)


def _fail_finished(layout: Layout, s: SState, r: int, from_block: Any) -> tuple[Any, SState]:
    """fail_kv_load of finished (aborted) r's sync load, its carrier still in
    flight (`_fail_holders_of_finished`): the holders scanned as one
    output's failures are; with none, the report still marks the blocks
    (KV7's models) and under the fix evicts them. Any table index names a
    block (out of the load's range: no block)."""
    e = load_entry(s, r, live_only=False)
    within, end = load_blocks(layout, e, from_block)
    invalid = [conj(within, x) for x in finished_invalid(layout, s, r, from_block, end)]
    quarantine = layout.cfg.rules.kv_recompute_quarantines_invalid
    st, evicted = scan_running(layout, s, invalid, e.batch, quarantine)
    if quarantine:
        st = uncache(layout, st, evicted)
    acts = z3.BoolVal(quarantine or layout.cfg.check_invalid_kv)
    max_blocks = -(-layout.cfg.max_model_len // layout.cfg.block_size)
    guard = conj(disj(*[eq(s.reqs[r].status, c) for c in (F_STOPPED, F_LENGTH, F_ABORTED, F_ERROR)]), e.found, le(0, from_block),
                 lt(from_block, max_blocks), disj(acts, _holds_any(layout, s, invalid)))
    return guard, mark_invalid(report_taken(layout, st, r), invalid)


def sync_failure(layout: Layout, s: SState, r: Any, from_block: Any) -> tuple[Any, SState]:
    """(enabled, successor) of a sync load's failure of request r (a term),
    running or finished; r's own circuit per request, merged."""
    guard, out = z3.BoolVal(False), s
    for k in range(layout.N):
        for fail in (_fail_running, _fail_finished):
            g, st = fail(layout, s, k, from_block)
            here = conj(eq(r, k), g)
            guard, out = disj(guard, here), merge(here, st, out)
    return guard, out

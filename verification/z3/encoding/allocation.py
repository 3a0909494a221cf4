"""What one allocation in `schedule` takes and records (spec.schedule's
_allocate and _add_entry in Z3): the blocks it needs and pops (with vLLM
0.8.4's preallocation), the labels it caches, and the entry's snapshot, for
the request a loop iteration considers (`Candidate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec.profiles import num_preallocate_blocks
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.drafts import uncached_drafts
from flightcheck.verification.z3.encoding.requests import async_at, label_at
from flightcheck.verification.z3.encoding.state import LIVE, PAD, Layout, SEntry, SReq, SState
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    disj,
    div_const,
    eq,
    imax,
    imin,
    ite,
    le,
    lt,
    neg,
)


def placeholders_of(st: SState, r: Any) -> Any:
    """r's output placeholders (0 in a frame without them): tokens in flight
    that count as known (`num_new_tokens`, `_add_entry`)."""
    return async_at(st, r).placeholders if st.asyncs else V(0)


def blocks_for(layout: Layout, total: Any) -> Any:
    """The blocks `total` tokens occupy (cdiv)."""
    bs = layout.cfg.block_size
    if layout.is_mutant("no_block_for_last_token"):
        return div_const(total, bs)
    return div_const(total + (bs - 1), bs)


def with_preallocation(layout: Layout, num_fresh: Any, free_len: Any, held: Any) -> Any:
    """The blocks an allocation pops: spec.schedule._allocate's preallocation
    (vLLM 0.8.4), num_preallocate_blocks more when any are needed at all,
    capped by the free blocks and by the table's room below max_model_len
    (T slots). Preallocating more than T is the same as T, which keeps the
    sum inside the bit-vectors' range."""
    cfg = layout.cfg
    extra = min(num_preallocate_blocks(cfg.num_preallocate_tokens, cfg.block_size), layout.T)
    if extra == 0:
        return num_fresh
    return ite(lt(0, num_fresh), imin(num_fresh + extra, imin(free_len, layout.T - held)), num_fresh)


@dataclass(frozen=True)
class Candidate:
    """The request a loop iteration considers, in the state `st` being
    scheduled (its batches are the ones in flight): its id `r`, its snapshot
    `q`, its tokens, and the tokens it knows (its tokens plus, under async
    scheduling, its output placeholders)."""

    st: SState
    r: Any
    q: SReq
    tokens: Any
    known: Any


def candidate(st: SState, r: Any, q: SReq, tokens: Any) -> Candidate:
    return Candidate(st, r, q, tokens, tokens + placeholders_of(st, r) if st.asyncs else tokens)


def cache_full_blocks(layout: Layout, c: Candidate, pool, table: list, table_len: Any, total: Any):
    """_allocate's label caching: the full blocks of known tokens (drafts
    left out: under vLLM 0.8.x every draft held, drafts.uncached_drafts)."""
    if not layout.cfg.prefix_caching:
        return pool
    drafts = uncached_drafts(layout, c.q.num_drafts, imax(V(0), total - c.tokens))
    num_full = div_const(imax(V(0), total - drafts), layout.cfg.block_size)
    labels = [label_at(layout, c.st, c.r, i) for i in range(layout.T)]
    return zb.cache_labels(layout, pool, table, table_len, labels, num_full)


def snapshot_entry(layout: Layout, c: Candidate, num_computed: Any, num_new: Any, cached: Any, budget: Any):
    """_add_entry's snapshot: (entry, drafts kept by the request). `budget` is
    the token budget left before this entry."""
    cfg, q, r = layout.cfg, c.q, c.r
    drafts = imin(q.num_drafts, imax(V(0), num_computed + num_new - c.known))
    start = num_computed
    if layout.is_mutant("snapshot_omits_prefix_hit"):
        start = ite(lt(0, cached), V(0), num_computed)
    samples = start + num_new - drafts >= c.known
    recorded = drafts
    if layout.is_mutant("stale_drafts_on_prefill_chunk") and cfg.num_spec_tokens:
        recorded = ite(samples, drafts, V(1))
    entry = SEntry(r, start, num_new, samples, recorded, V(LIVE))
    if layout.is_mutant("overlapping_chunks"):
        live_in_flight = disj(*[conj(lt(j, b.length), eq(e.req, r), eq(e.fate, LIVE))
                                for b in c.st.batches for j, e in enumerate(b.entries)])
        capped = z3.BoolVal(False) if cfg.long_prefill_token_threshold <= 0 else \
            le(cfg.long_prefill_token_threshold, num_new)
        overlap = conj(live_in_flight, lt(num_new, budget), lt(0, start), neg(capped))
        entry = SEntry(r, ite(overlap, start - 1, start), ite(overlap, num_new + 1, num_new),
                       samples, recorded, V(LIVE))
    return entry, drafts


def concat(layout: Layout, xs: list, nx: Any, ys: list, ny: Any) -> list:
    """xs[:nx] + ys[:ny], PAD-padded to T slots."""
    out = []
    for s in range(layout.T):
        v = V(PAD)
        for base in range(min(s, len(xs)), -1, -1):
            if s - base < len(ys):
                v = ite(eq(nx, base), ite(lt(s - base, ny), ys[s - base], V(PAD)), v)
        out.append(ite(lt(s, nx), xs[s], v) if s < len(xs) else v)
    return out

"""KV7's history variable in Z3 (spec/kv_invalid.py): `invalid_kv` as one
Bool per block in a KV7 model's frame (kv_state.`tracks_invalid_kv`), set by
a sync load's failures (kv_sync.py `mark_invalid`) and cleared by
`schedule` (`forget_rewritten`): a block an entry of the batch rewrites
(`[start - external, start + n)` of its table), or one out of the prefix
cache once the call is done, is no longer invalid."""

from __future__ import annotations

from typing import Any

from flightcheck.verification.z3.encoding.requests import req_at
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.terms import clone, conj, disj, eq, le, lt, neg


def rewritten(layout: Layout, st: SState, entries: list, count: Any, externals: list) -> list:
    """kv_invalid.rewritten, per block: some entry of the batch (the first
    `count` of `entries`, each with the tokens its sync load brings) computes
    the block's first token or its load writes it (its request's table in `st`)."""
    bs, out = layout.cfg.block_size, [[] for _ in range(layout.B)]
    for j, (e, external) in enumerate(zip(entries, externals)):
        q = req_at(st, e.req)
        for t, x in enumerate(q.table):
            written = conj(lt(j, count), lt(t, q.table_len), le(e.start - external, t * bs), lt(t * bs, e.start + e.n))
            for b in range(layout.B):
                out[b].append(conj(written, eq(x, b)))
    return [disj(*xs) for xs in out]


def forget_rewritten(layout: Layout, st: SState, entries: list, count: Any, externals: list) -> SState:
    """kv_invalid.forget_rewritten after a call (`st`: its state, the batch's
    entries): the blocks it rewrites and those uncached leave `invalid_kv`."""
    if not st.kv or not st.kv[0].invalid:
        return st
    gone = rewritten(layout, st, entries, count, externals)
    out = clone(st)
    out.kv[0].invalid = [conj(x, neg(g), neg(eq(label, layout.none_label)))
                         for x, g, label in zip(st.kv[0].invalid, gone, st.pool.label)]
    return out

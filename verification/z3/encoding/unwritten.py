"""KV8 in Z3 (spec/kv_unwritten.py): the history variable `State.unwritten_kv`
as a frame part, its updates in `schedule`, KV8 as a step formula of
`schedule`, and its auxiliary invariant under finding 1's fix.

A frame has the part only where a model checks KV8
(`Config.check_unwritten_kv`); every other frame is as it was
(`SState.unw` is []), so no state count, proof or cross-check changes.

* `SState.unw`: one label per block (`Layout.none_label`: not in
  `unwritten_kv`), the label the block was cached with when a priority
  victim was handed back. A block holds at most one pair at a call's
  boundary (`forget_written` drops the pairs whose label the block lost),
  and no action but `schedule` changes a label in the models it is built
  for (`refuse_unencoded_unwritten`: no connector, no reset).
* marked at the victim's choice (priority.py `victim_to_tail`), on the
  blocks spec `cached_past_computed` names (`handed_back_blocks`), under
  either rule; under the fix they are then uncached;
* cleared after the call's launch (`forget_written`): a block an entry of
  the batch writes a token of, or whose label is no longer the pair's.

KV8 (`kv8_no_hit_on_unwritten_kv`) reads the batch `schedule` queued with
the tables after the call and the pairs before it, as spec
`schedule_unwritten_reads`. Under the fix every pair a call adds loses
its block's label in the same call, so `forget_written` drops it:
`KVU1_nothing_unwritten` (every block's pair none at a call's boundary)
is inductive and KV8 follows from it in one step.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.requests import req_at
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, ite, lt, neg


def handed_back_blocks(layout, acc, st, victim: Any) -> list:
    """A Bool per block: spec `cached_past_computed` of a victim with an
    entry in the batch so far (spec `hand_back_blocks`' guard): its labelled
    blocks holding a token at or past its num_computed."""
    in_batch = disj(*[conj(lt(j, acc.count), eq(e.req, victim)) for j, e in enumerate(acc.entries)])
    v, bs = req_at(st, victim), layout.cfg.block_size
    return [conj(in_batch, neg(eq(st.pool.label[b], layout.none_label)),
                 disj(*[conj(lt(i, v.table_len), eq(x, b), lt(v.num_computed, V((i + 1) * bs)))
                        for i, x in enumerate(v.table)]))
            for b in range(layout.B)]


def mark(layout, st, marked: list) -> list:
    """`st.unw` with each marked block paired with its label now."""
    return [[ite(marked[b], st.pool.label[b], x) for b, x in enumerate(st.unw[0])]]


def written(layout, st, entries: list, count: Any) -> list:
    """A Bool per block: an entry of the batch (`entries[:count]`, tables in
    `st`) writes a token of it (spec `written`; no connector: external 0)."""
    bs, out = layout.cfg.block_size, [z3.BoolVal(False)] * layout.B
    for j, e in enumerate(entries):
        q = req_at(st, e.req)
        for i, x in enumerate(q.table):
            hit = conj(lt(j, count), lt(i, q.table_len), lt(e.start, V((i + 1) * bs)), lt(V(i * bs), e.start + e.n))
            out = [disj(out[b], conj(hit, eq(x, b))) for b in range(layout.B)]
    return out


def forget_written(layout, st, acc):
    """spec `forget_written` after the launch (`st`, the tables after the
    call): a pair leaves when the batch writes its block or the block's
    label is no longer its."""
    if not st.unw:
        return st
    gone = written(layout, st, acc.entries, acc.count)
    st.unw = [[ite(disj(gone[b], neg(eq(st.pool.label[b], x))), V(layout.none_label), x)
               for b, x in enumerate(st.unw[0])]]
    return st

"""KV7 as a step formula of `schedule` and its strengthening (KVA10, KVA11)
in Z3, over kv_invalid.py's frame part: apart from it because they read
the actions and the base invariants, which import the relation."""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.invariants import kv_ownership_clauses
from flightcheck.verification.z3.encoding.kv_invalid import rewritten
from flightcheck.verification.z3.encoding.requests import req_at
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, ite, lt, neg


# --- KV7 as a step formula, and its strengthening ------------------------------------

def _schedules(st) -> Any:
    """The step is a `schedule` that returns a Scheduled (spec: not None)."""
    return conj(eq(st.choices.act, SCHEDULE), st.sched.result)


def kv7_reads(layout: Layout, st) -> Any:
    """kv_invalid.schedule_reads is not empty: some entry of the batch the step
    queues (at slot `num_batches` of the state before; each entry with its
    request's table after the call and the tokens its sync load brings) holds
    in its computed prefix (its table's blocks below cdiv(start, bs)) a block
    invalid before the call that the batch does not rewrite."""
    before, after, sch, bs = st.before, st.after, st.sched, layout.cfg.block_size
    externals = [_external_at(after.kv[0].entries, before.num_batches, j) for j in range(len(sch.entries))]
    gone = rewritten(layout, after, sch.entries, sch.count, externals)
    stale = [conj(x, neg(g)) for x, g in zip(before.kv[0].invalid, gone)]
    reads = []
    for j, e in enumerate(sch.entries):
        q = req_at(after, e.req)
        for t, x in enumerate(q.table):
            prefix = conj(lt(j, sch.count), lt(t, q.table_len), lt(t * bs, e.start))
            reads += [conj(prefix, eq(x, b), stale[b]) for b in range(layout.B)]
    return disj(*reads)


def _external_at(rows: list, k: Any, j: int) -> Any:
    """rows[k][j].external for a symbolic batch slot k (0 past the slots)."""
    out = V(0)
    for i in range(len(rows) - 1, -1, -1):
        out = ite(eq(k, i), rows[i][j].external, out)
    return out


def kv7_no_compute_on_invalid_kv(layout: Layout, st) -> Any:
    """KV7 (spec.transitions.kv7_no_compute_on_invalid_kv): a `schedule` step
    queues no entry that computes on a block invalid before the call which
    its batch does not recompute; every other action keeps it by its first clause."""
    if not st.before.kv or not st.before.kv[0].invalid:
        return z3.BoolVal(True)
    return z3.Implies(_schedules(st), neg(kv7_reads(layout, st)))


def kva10_invalid_kv_quarantined(layout: Layout, s: SState) -> Any:
    """kv_invalid.quarantined, KV7's strengthening under finding 7's fix: every
    block of `invalid_kv` is out of the prefix cache and in no request's
    computed prefix (its table's blocks below cdiv(num_computed, bs))."""
    if not s.kv or not s.kv[0].invalid:
        return z3.BoolVal(True)
    bs, out = layout.cfg.block_size, []
    for b, invalid in enumerate(s.kv[0].invalid):
        held = [conj(lt(t * bs, q.num_computed), lt(t, q.table_len), eq(x, b)) for q in s.reqs
                for t, x in enumerate(q.table)]
        out.append(z3.Implies(invalid, conj(eq(s.pool.label[b], layout.none_label), neg(disj(*held)))))
    return conj(*out)


def kva11_cached_labels(layout: Layout, s: SState) -> Any:
    """S9's caching clauses read beside the connector (invariants.kv_ownership_clauses
    less those the fence's deferred frees and held tables change, which KVA1
    and KVA2 restate): a table holds each block once, unlabelled or caching
    its slot's content, and covers a running request's counter; the copies
    of a label carry the ranks 0 .. copies - 1; the free queue lists blocks once."""
    changed = ("held_only_when_running", "ref_is_holders", "free_iff_unheld")
    out = [f for name, f in kv_ownership_clauses(layout, s).items() if not name.endswith(changed)]
    # a block two tables hold came from a prefix hit: at the same slot, of the
    # same content (an unlabelled one too: the fix uncaches a shared block)
    for r, q in enumerate(s.reqs):
        for r2 in range(r + 1, layout.N):
            q2 = s.reqs[r2]
            for t, x in enumerate(q.table):
                for t2, y in enumerate(q2.table):
                    shared = conj(lt(t, q.table_len), lt(t2, q2.table_len), eq(x, y))
                    same = t == t2 and layout.content[r][t] == layout.content[r2][t2]
                    out.append(z3.Implies(shared, conj(z3.BoolVal(same), neg(eq(q.status, 0)), neg(eq(q2.status, 0)))))
    return conj(*out)


KV7_STEP_FORMULAS = {"KV7_no_compute_on_invalid_kv": kv7_no_compute_on_invalid_kv}
KV7_AUXILIARY = {"KVA10_invalid_kv_quarantined": kva10_invalid_kv_quarantined,
                 "KVA11_cached_labels": kva11_cached_labels}

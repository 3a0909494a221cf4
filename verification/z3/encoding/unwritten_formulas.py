"""KV8 as a step formula of `schedule` and its auxiliary invariants
(KVU1, KVU2) in Z3: unwritten.py's docstring says how they are proved."""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.requests import req_at
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, lt, neg, sum_terms
from flightcheck.verification.z3.encoding.unwritten import written
from flightcheck.verification.z3.encoding.unwritten_frame import TRUE


def kv8_no_hit_on_unwritten_kv(layout, stp) -> Any:
    """KV8 on a schedule step (spec `schedule_unwritten_reads`): no entry of
    the queued batch has in its computed prefix (its table after the call
    below its start) a block paired before the call with the label it had
    then, unless the batch writes it."""
    before, after, sch = stp.before, stp.after, stp.sched
    if not before.unw:
        return TRUE
    bs = layout.cfg.block_size
    gone = written(layout, after, sch.entries, sch.count)
    unwritten = [conj(neg(eq(x, layout.none_label)), eq(before.pool.label[b], x), neg(gone[b]))
                 for b, x in enumerate(before.unw[0])]
    out = []
    for j, e in enumerate(sch.entries):
        q = req_at(after, e.req)
        for i, x in enumerate(q.table):
            read = conj(lt(j, sch.count), lt(i, q.table_len), lt(V(i * bs), e.start))
            out += [z3.Implies(conj(read, eq(x, b)), neg(unwritten[b])) for b in range(layout.B)]
    return z3.Implies(conj(eq(stp.choices.act, SCHEDULE), sch.result), conj(*out))


def kvu1_nothing_unwritten(layout, s) -> Any:
    """KVU1 (auxiliary, under the fix): no block is paired."""
    return conj(*[eq(x, layout.none_label) for x in s.unw[0]]) if s.unw else TRUE


def kvu2_cached_blocks_computed(layout, s) -> Any:
    """KVU2 (auxiliary): at a call's boundary every labelled block of a
    request's table is within its computed tokens (an allocation caches
    through num_computed + num_new, where launch takes the counter; a hit
    through the hit). So a block a victim's allocation cached in the call is
    held by it alone: no one else could have hit it."""
    bs, out = layout.cfg.block_size, []
    for q in s.reqs:
        for i, x in enumerate(q.table):
            labelled = disj(*[conj(eq(x, b), neg(eq(s.pool.label[b], layout.none_label))) for b in range(layout.B)])
            out.append(z3.Implies(conj(lt(i, q.table_len), labelled), z3.Not(lt(q.num_computed, V((i + 1) * bs)))))
    return conj(*out)


# KV8's step formula and its auxiliary invariants (z3/unwritten_engines.py)
UNWRITTEN_STEP_FORMULAS = {"KV8_no_hit_on_unwritten_kv": kv8_no_hit_on_unwritten_kv}
UNWRITTEN_AUXILIARY = {"KVU1_nothing_unwritten": kvu1_nothing_unwritten,
                       "KVU2_cached_blocks_computed": kvu2_cached_blocks_computed}


# --- KVU1 and KVU2 inside `schedule`, as z3.induction.microsteps tracks a call:
# between the hand-back that pairs a block and the launch that forgets the pair,
# and between an allocation that caches a block and the launch that advances the
# counter, neither holds; these do, and give both back at the launch.

def unwritten_batch_facts(layout, acc) -> dict[str, Any]:
    """Facts of the batch under construction (`acc`, z3.encoding.schedule.
    BatchInProgress) where the frame has KV8's history: every pair's block
    has lost the pair's label or is written by an entry so far (so the
    launch's `forget_written` drops it: KVU1 after the call), and every
    labelled block of a table lies within its request's computed tokens
    plus its entry's (the launch's counter: KVU2 after the call)."""
    st = acc.state
    if not st.unw:
        return {}
    bs = layout.cfg.block_size
    gone = written(layout, st, acc.entries, acc.count)
    facts = {"batch.unwritten.pairs_lose_their_label": conj(*[
        disj(eq(x, layout.none_label), conj(neg(eq(st.pool.label[b], x)), eq(st.pool.ref[b], 0)), gone[b])
        for b, x in enumerate(st.unw[0])])}
    out, private = [], []
    for r, q in enumerate(st.reqs):
        for i, x in enumerate(q.table):
            labelled = disj(*[conj(eq(x, b), neg(eq(st.pool.label[b], layout.none_label))) for b in range(layout.B)])
            past = conj(lt(i, q.table_len), labelled, lt(q.num_computed, V((i + 1) * bs)))
            private += [z3.Implies(conj(past, eq(x, b)), eq(st.pool.ref[b], 1)) for b in range(layout.B)]
        scheduled = [conj(lt(j, acc.count), eq(e.req, r)) for j, e in enumerate(acc.entries)]
        ahead = q.num_computed + sum_terms([z3.If(c, e.n, V(0)) for c, e in zip(scheduled, acc.entries)])
        for i, x in enumerate(q.table):
            labelled = disj(*[conj(eq(x, b), neg(eq(st.pool.label[b], layout.none_label))) for b in range(layout.B)])
            out.append(z3.Implies(conj(lt(i, q.table_len), labelled), z3.Not(lt(ahead, V((i + 1) * bs)))))
    facts["batch.unwritten.cached_blocks_computed_or_scheduled"] = conj(*out)
    # a pair is made at a hand-back only (the frame has none: KVU1), and a call
    # that preempts admits no one: the waiting loop's hits find no pair
    facts["batch.unwritten.pairs_only_after_a_preemption"] = disj(
        acc.any_preempted, *[conj(*[eq(x, layout.none_label) for x in st.unw[0]])])
    # what a hand-back pairs is held by the victim alone: it leaves every table
    # (until the waiting loop admits someone, who may hit a block the running
    # loop cached in this call; no hand-back comes after an admission)
    facts["batch.unwritten.cached_past_computed_is_private"] = disj(*acc.admitted, conj(*private))
    return facts

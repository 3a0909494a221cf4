"""KV8 as a step formula of `schedule` and its auxiliary invariants
(KVU1, KVU2) in Z3: unwritten.py's docstring says how they are proved."""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.requests import req_at
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, lt, neg
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

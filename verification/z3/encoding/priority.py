"""spec/priority.py in Z3: the priority policy's changes to `arrive` and to
`schedule`'s running loop, each a hook that is the identity under FCFS (the
frame then has no `SPrio`, and every circuit is the one it was).

* `arrive`: the request's place in the arrival order is the number of
  arrivals so far, and it joins `waiting` at its rank's place.
* the running loop's victim is the running request of the largest
  (priority, arrival): the first such slot, as Python's `max` takes it
  (`victim_to_tail` moves it last, so `schedule._preempt_last` takes it, as
  spec.priority.to_tail does; `requeue` puts it at its place in `waiting`).
* a victim already in the batch is handed back (`running_result`): its
  entry leaves the batch, its tokens return to the budget; the loop's
  position moves back by one when the victim sat before it (vLLM
  `victim_index < req_index`), and a request that preempts itself does not
  stop the loop.
* a retry after a preemption is of the same request with the `num_new` of
  its first try (`BatchInProgress.retried`, `pending`): the spec computes
  it once, before its inner `while not _allocate` loop, and a hand-back
  raises the budget in between; the position is not read (under #49097's
  mutant it need not point at the request any more).

The unrolled running loop takes 2N micro-steps under the policy: an
advance moves the position up by one, a preemption shrinks `running` by
one and moves the position back by at most one, and the position never
passes `running`'s length, so advances <= initial length and preemptions
<= initial length.

The three historical bugs of verification/mutants/priority.py are encoded
as the spec's edits are (`Layout.is_mutant`): #23347 hands nothing back,
#28558 leaves the victim's drafts in the batch on an entry of no tokens
moved last, #49097 moves the position back only for a victim in the batch;
and of verification/mutants/priority_kv.py the synthetic
`parked_load_joins_tail_under_priority` (a parked load joins `kv_holding`'s
tail) and #57841's (`holder_looked_at_first`: a waiting request of a better
rank is looked at before the landed loads).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding.priority_state import (
    PAD,
    SPrio,
    has_priority,
    insert_at_place,
    rank_below,
)
from flightcheck.verification.z3.encoding import blocks as zb
from flightcheck.verification.z3.encoding.unwritten import handed_back_blocks, mark
from flightcheck.verification.z3.encoding.state import pad_entry
from flightcheck.verification.z3.encoding.terms import (
    V,
    clone,
    conj,
    disj,
    eq,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    put,
    sum_terms,
)


def arrive_with_priority(layout, before, after, r: Any):
    """`arrive`'s effect under the policy: r's place is the arrivals so far,
    and r joins `waiting` at its rank's place (FCFS: `after` as it is)."""
    if not has_priority(layout):
        return after
    p = before.prio[0]
    st = clone(after)
    st.prio = [SPrio(put(p.place, r, p.num_arrivals), p.num_arrivals + 1, p.stamps)]
    st.waiting = insert_at_place(layout, st, before.waiting, before.waiting_len, r)
    return st


def join_kv_holding(layout, s, holding: list, length: Any, r: Any) -> list:
    """`kv_holding` with a parked load r joined (spec.kv_loads.park): at its
    rank's place under the policy (`PriorityRequestQueue.add_request`; the
    spec sorts the whole queue, PR4 keeps it sorted, so the two agree), at
    the tail under FCFS. The waiting loop parks only once every holder is
    passed over, so the passed-over holders stay a prefix (kv_schedule.py)."""
    if not has_priority(layout) or layout.is_mutant("parked_load_joins_tail_under_priority"):
        return put(holding, length, r)
    return insert_at_place(layout, s, holding, length, r)


def holder_looked_at_first(layout, s, held: Any, plain: Any, plain_left: Any) -> Any:
    """Whether the connector's waiting loop looks at `kv_holding`'s next
    holder before `waiting`'s next request: always (vLLM 0.33 and 0.34 drain
    `kv_holding_waiting` first); under the mutant
    `load_ranked_behind_new_request_pr57841` only when `waiting` has none
    left (`plain_left` false) or the holder ranks first (its edit of
    spec.kv_loads.next_candidate; without the load limit no waiting request
    belongs to `async_kv_waiting`, so `waiting`'s next is the edit's `better`)."""
    if not layout.is_mutant("load_ranked_behind_new_request_pr57841"):
        return z3.BoolVal(True)
    return disj(neg(plain_left), rank_below(layout, s, held, plain))


def running_micro_steps(layout) -> int:
    """The running loop's unrolled micro-steps (module docstring)."""
    return 2 * layout.N if has_priority(layout) else layout.N


def victim_to_tail(layout, builder, st, acc=None) -> tuple[Any, Any]:
    """(st with the victim moved last in `running`, the victim's slot):
    spec.priority.choose_victim and to_tail; a handed-back victim's blocks
    cached past its computed tokens paired in KV8's history where the frame
    has it (unwritten.py), then uncached under the unwritten-KV fix.
    FCFS: st and its last slot."""
    if not has_priority(layout):
        return st, st.running_len - 1
    run, n = st.running, st.running_len
    # a slot holds the maximum: no running request outranks it (max keeps the first of equals)
    is_max = [conj(lt(j, n), *[disj(neg(lt(k, n)), neg(rank_below(layout, st, x, y)))
                               for k, y in enumerate(run) if k != j]) for j, x in enumerate(run)]
    index = n - 1
    for j in range(len(run) - 1, -1, -1):
        index = ite(is_max[j], V(j), index)
    index = builder.let("victim_index", index)
    victim = pick(run, index, V(PAD))
    out = clone(st)
    out.running = [ite(lt(j, index), x, ite(lt(j, n - 1), run[j + 1] if j + 1 < len(run) else V(PAD),
                                             ite(eq(j, n - 1), victim, V(PAD))))
                   for j, x in enumerate(run)]
    if acc is not None and (out.unw or uncaches_handed_back(layout)):
        cached = handed_back_blocks(layout, acc, st, victim)       # spec.kv_unwritten.hand_back_blocks
        if out.unw:
            out.unw = mark(layout, st, cached)
        if uncaches_handed_back(layout):
            out.pool = zb.uncache(layout, st.pool, cached)
    return out, index


def uncaches_handed_back(layout) -> bool:
    """spec.kv_unwritten.uncaches_handed_back (`Profile.hand_back_uncaches_unwritten`),
    where there is a prefix cache to uncache from."""
    return has_priority(layout) and layout.cfg.prefix_caching and layout.cfg.rules.hand_back_uncaches_unwritten


def requeue(layout, before, preempted, victim: Any):
    """The preempted state with the victim at its rank's place in `waiting`
    (spec.priority.in_priority_order after the preemption's push to the
    head). FCFS: `preempted` as it is."""
    if not has_priority(layout):
        return preempted
    out = clone(preempted)
    out.waiting = insert_at_place(layout, before, before.waiting, before.waiting_len, victim)
    return out


def retry_or(layout, acc, term: Any, retried: Any = None) -> Any:
    """The running micro-step's `active` (retried None) or request: during a
    retry, active as long as the loop goes on, and the retried request (the
    spec's inner loop reads neither the position nor the budget); FCFS: term."""
    if not has_priority(layout):
        return term
    retrying = lt(0, acc.pending)
    return ite(retrying, retried, term) if retried is not None else disj(term, conj(retrying, neg(acc.done)))


def retried_num_new(layout, acc, num_new: Any) -> Any:
    """A retry keeps its first try's num_new (FCFS: num_new)."""
    if not has_priority(layout):
        return num_new
    return ite(lt(0, acc.pending), acc.pending, num_new)


def running_result(layout, builder, acc, out, moves: dict):
    """The running micro-step's result under the policy: `out` (what FCFS
    would give) with the victim handed back, the position moved back when
    the victim sat before it, the loop going on after a self-preemption
    (stopping at a victim the step fence keeps, with a connector), and a
    retry's num_new kept. `moves`: preempt, victim, index, r, num_new, fenced.
    FCFS: `out`."""
    if not has_priority(layout):
        return out
    do_pre, victim, index = moves["preempt"], moves["victim"], moves["index"]
    held = [conj(lt(j, acc.count), eq(e.req, victim)) for j, e in enumerate(acc.entries)]
    in_batch = builder.let("victim_in_batch", conj(do_pre, disj(*held)))
    h = builder.let("victim_entry", sum_terms([ite(c, V(j), V(0)) for j, c in enumerate(held)]))
    handed = pick([e.n for e in acc.entries], h, V(0))
    entries, count, budget = _hand_back(layout, acc, out, in_batch, h, handed)
    moved_back = conj(do_pre, lt(index, acc.position))
    if layout.is_mutant("victim_index_not_adjusted_pr49097"):
        moved_back = conj(moved_back, in_batch)
    retrying = conj(do_pre, neg(eq(victim, moves["r"])))
    done = disj(acc.done, moves["fenced"]) if acc.state.kv else acc.done    # a fenced victim stops the loop
    return replace(out, entries=entries, count=count, budget=budget,
                   position=ite(moved_back, acc.position - 1, out.position), done=done,
                   pending=ite(retrying, moves["num_new"], V(0)), retried=ite(retrying, moves["r"], V(PAD)))


def _hand_back(layout, acc, out, in_batch: Any, h: Any, handed: Any) -> tuple[list, Any, Any]:
    """spec.priority.hand_back: the victim's entry (slot h) leaves the batch,
    the later ones move up by one, its tokens return to the budget."""
    if layout.is_mutant("victim_kept_in_batch_pr23347"):
        return out.entries, out.count, out.budget
    es = acc.entries
    shifted = [es[j + 1] if j + 1 < len(es) else pad_entry() for j in range(len(es))]
    budget = ite(in_batch, acc.budget + handed, out.budget)
    if layout.is_mutant("preempted_drafts_kept_pr28558"):
        # the entry moves last with no tokens, keeping its drafts (the spec's edit); without drafts it leaves
        victim_entry = _entry_at(es, h)
        with_drafts = conj(in_batch, lt(0, victim_entry.drafts))
        last = replace(victim_entry, n=V(0), samples=z3.BoolVal(False))
        entries = [merge(conj(in_batch, le(h, j)),
                         merge(conj(with_drafts, eq(j, acc.count - 1)), last, shifted[j]), out.entries[j])
                   for j in range(len(es))]
        return entries, ite(conj(in_batch, neg(with_drafts)), acc.count - 1, out.count), budget
    entries = [merge(conj(in_batch, le(h, j)), shifted[j], out.entries[j]) for j in range(len(es))]
    return entries, ite(in_batch, acc.count - 1, out.count), budget


def _entry_at(es: list, h: Any):
    """es[h] for a symbolic slot h (leafwise)."""
    out = es[-1]
    for j in range(len(es) - 2, -1, -1):
        out = merge(eq(h, j), es[j], out)
    return out

"""spec/priority_invariants.py in Z3: PR1 and PR4 as formulas of a frame, PR2 and
PR3 as formulas of one step, each clause for clause after the spec's
predicate, and the auxiliary invariants that make PR1 inductive on the
priority model (verification/z3/priority_models.py). Each is True on a
frame without the policy (`SState.prio` is []).

PR1's "every queued request's arrival is known" reads the request's place
(`priority_state.SPrio`: not PAD is "in `State.arrivals`" on well-formed
frames); its order compares (priority, place) of neighbours, the spec's
`keys == sorted(keys)`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.priority_state import PAD, place_of, prio_well_formed, rank_below
from flightcheck.verification.z3.encoding.requests import at, num_tokens
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.state import NEW, PREEMPTED, RUNNING, WAITING, Layout, SState, initial
from flightcheck.verification.z3.encoding.terms import V, conj, disj, eq, le, lt, neg, sum_terms

TRUE = z3.BoolVal(True)


def pr1_waiting_in_priority_order(layout: Layout, s: SState) -> Any:
    """PR1: every waiting or running request's arrival recorded, and
    `waiting` in (priority, arrival) order (each key <= the next)."""
    if not s.prio:
        return TRUE
    out = []
    for xs, n in ((s.waiting, s.waiting_len), (s.running, s.running_len)):
        out += [z3.Implies(lt(j, n), neg(eq(place_of(s, x), PAD))) for j, x in enumerate(xs)]
    w = s.waiting
    out += [z3.Implies(lt(j + 1, s.waiting_len), neg(rank_below(layout, s, w[j + 1], w[j])))
            for j in range(len(w) - 1)]
    return conj(out)


def pr4_kv_holding_in_priority_order(layout: Layout, s: SState) -> Any:
    """PR4: with a KV connector whose `kv_holding` is a heap under the
    policy, every holder's arrival recorded, and `kv_holding` in
    (priority, arrival) order (each key <= the next)."""
    if not s.prio or not s.kv or not layout.cfg.rules.priority_orders_kv_holding:
        return TRUE
    kv = s.kv[0]
    h, n = kv.holding, kv.holding_len
    out = [z3.Implies(lt(j, n), neg(eq(place_of(s, x), PAD))) for j, x in enumerate(h)]
    out += [z3.Implies(lt(j + 1, n), neg(rank_below(layout, s, h[j + 1], h[j]))) for j in range(len(h) - 1)]
    return conj(out)


# --- the auxiliary invariants: the queues' shape, which PR1's proof needs and
# which, unlike WF_encoding, does not read the block pool (whose own
# well-formedness needs the pool's invariants, S9 and A9, to be inductive).

def pa1_arrived_iff_placed(layout: Layout, s: SState) -> Any:
    """PA1 (auxiliary): a request has a place in the arrival order iff it has arrived (status not NEW)."""
    if not s.prio:
        return TRUE
    return conj([eq(q.status, NEW) == eq(x, PAD) for q, x in zip(s.reqs, s.prio[0].place)])


def pa2_well_formed_but_the_blocks(layout: Layout, s: SState) -> Any:
    """PA2 (auxiliary): WF_encoding's clauses on everything but the blocks
    (the pool taken as the initial one's and every table as empty, whose
    clauses fold to True): statuses, queues, batches, arrival places."""
    if not s.prio:
        return TRUE
    no_tables = [replace(q, table_len=V(0), table=[V(PAD)] * len(q.table)) for q in s.reqs]
    return well_formed(layout, replace(s, pool=initial(layout).pool, reqs=no_tables))


def pa4_well_formed_but_every_block(layout: Layout, s: SState) -> Any:
    """PA4 (auxiliary, with a connector): PA2 with the connector's blocks
    left out too (each in-flight entry's recorded table and each deferred
    free taken as empty), whose clauses, under the step fence, would need
    the pool's invariants as well: the frame's shape, PR4's proof needs no more."""
    if not s.prio or not s.kv:
        return TRUE
    kv = s.kv[0]
    entries = [[replace(e, blocks_len=V(0), blocks=[V(PAD)] * len(e.blocks)) for e in row] for row in kv.entries]
    deferred = [replace(d, length=V(0), blocks=[V(PAD)] * len(d.blocks)) for d in kv.deferred]
    return pa2_well_formed_but_the_blocks(layout, replace(s, kv=[replace(kv, entries=entries, deferred=deferred)]))


def pa5_places_numbered_once(layout: Layout, s: SState) -> Any:
    """PA5 (auxiliary): the arrived requests' places are 0 .. num_arrivals - 1,
    each once, every other place PAD (priority_state.prio_well_formed, the
    part of WF_encoding that `arrive` needs: the next place is a new one)."""
    if not s.prio:
        return TRUE
    return prio_well_formed(layout, s)


def pa6_queues_within_their_slots(layout: Layout, s: SState) -> Any:
    """PA6 (auxiliary, with a connector): `waiting`, `running` and
    `kv_holding` each have a length between 0 and their slots, and each
    used slot names a request (WF_encoding's bounds on the queues, which
    unlike the rest of it read no block and no batch)."""
    if not s.prio or not s.kv:
        return TRUE
    kv, out = s.kv[0], []
    for xs, n in ((s.waiting, s.waiting_len), (s.running, s.running_len), (kv.holding, kv.holding_len)):
        out += [le(0, n), le(n, len(xs))]
        out += [z3.Implies(lt(j, n), conj(le(0, x), lt(x, layout.N))) for j, x in enumerate(xs)]
    return conj(out)


def _queued(s: SState, r: int, xs: list, n: Any) -> Any:
    return disj(*[conj(lt(j, n), eq(x, r)) for j, x in enumerate(xs)])


def pa3_queues_match_statuses(layout: Layout, s: SState) -> Any:
    """PA3 (auxiliary): no request twice in `waiting` and `running`
    together; a request is in `waiting` iff WAITING or PREEMPTED, in
    `running` iff RUNNING."""
    if not s.prio:
        return TRUE
    slots = [(x, lt(j, s.waiting_len)) for j, x in enumerate(s.waiting)] + \
        [(x, lt(j, s.running_len)) for j, x in enumerate(s.running)]
    out = [z3.Implies(conj(u, v), neg(eq(x, y))) for i, (x, u) in enumerate(slots) for y, v in slots[i + 1:]]
    for r, q in enumerate(s.reqs):
        out.append(_queued(s, r, s.waiting, s.waiting_len) == disj(eq(q.status, WAITING), eq(q.status, PREEMPTED)))
        out.append(_queued(s, r, s.running, s.running_len) == eq(q.status, RUNNING))
    return conj(out)


PRIORITY_FORMULAS = {"PR1_waiting_in_priority_order": pr1_waiting_in_priority_order,
                     "PR4_kv_holding_in_priority_order": pr4_kv_holding_in_priority_order}
PRIORITY_AUXILIARY = {"PA1_arrived_iff_placed": pa1_arrived_iff_placed,
                      "PA2_well_formed_but_the_blocks": pa2_well_formed_but_the_blocks,
                      "PA3_queues_match_statuses": pa3_queues_match_statuses}
# PR4's (with a connector; priority_engines.priority_kv_auxiliary)
PRIORITY_KV_AUXILIARY = {"PA4_well_formed_but_every_block": pa4_well_formed_but_every_block,
                         "PA5_places_numbered_once": pa5_places_numbered_once,
                         "PA6_queues_within_their_slots": pa6_queues_within_their_slots}


# --- PR2, PR3: formulas of a step (st.before, st.after, st.choices, st.sched) -------

def _batch(st) -> tuple[list, Any]:
    """(slot j holds an entry of the step's batch, the batch's token sum)."""
    sch = st.sched
    used = [lt(j, sch.count) for j in range(len(sch.entries))]
    return used, sum_terms([z3.If(u, e.n, V(0)) for u, e in zip(used, sch.entries)])


def _schedules(st) -> Any:
    """The step is a schedule that returns a Scheduled (spec: not None)."""
    return conj(eq(st.choices.act, SCHEDULE), st.sched.result)


def pr2_victim_leaves_no_trace(layout: Layout, st) -> Any:
    """PR2: a request the step preempted has no entry in its batch, holds no
    block unless running again, and the batch is within the token budget."""
    if not st.before.prio:
        return TRUE
    sch, after = st.sched, st.after
    used, total = _batch(st)
    out = []
    for v in range(layout.N):
        victim = sch.preempted[v]
        out += [z3.Implies(victim, neg(conj(u, eq(e.req, v)))) for u, e in zip(used, sch.entries)]
        running = disj(*[conj(lt(j, after.running_len), eq(x, v)) for j, x in enumerate(after.running)])
        out.append(z3.Implies(conj(victim, neg(running)), eq(after.reqs[v].table_len, 0)))
    out.append(z3.Implies(disj(*sch.preempted), le(total, layout.cfg.max_num_batched_tokens)))
    return z3.Implies(_schedules(st), conj(out))


def _nothing_to_schedule(layout: Layout, st, r: Any) -> Any:
    """spec.priority_invariants._nothing_to_schedule on r's record after the step."""
    cfg, after = layout.cfg, st.after
    reasons = []
    if after.asyncs:
        ph = at(layout, after, r, lambda q, k: after.asyncs[k].placeholders)
        limit = at(layout, after, r, lambda q, k: V(layout.prompt_len(k) + layout.max_tokens(k)))
        computed = at(layout, after, r, lambda q, k: q.num_computed)
        reasons += [conj(lt(0, ph), le(limit, computed + 2 - ph)),
                    lt(0, at(layout, after, r, lambda q, k: after.asyncs[k].countdown))]
    if not cfg.continue_prefill:
        reasons.append(at(layout, st.before, r, lambda q, k: st.before.scheduled[k]))
    placeholders = (lambda k: after.asyncs[k].placeholders) if after.asyncs else (lambda k: V(0))
    new_tokens = at(layout, after, r, lambda q, k: num_tokens(layout, q, k) + q.num_drafts + placeholders(k)
                    - q.num_computed)
    room = at(layout, after, r, lambda q, k: V(cfg.max_model_len - cfg.rules.sampled_token_slot) - q.num_computed)
    return disj(*reasons, le(new_tokens, 0), le(room, 0))


def pr3_running_loop_skips_nothing(layout: Layout, st) -> Any:
    """PR3: every request still running that the batch left out had nothing
    to schedule, or the batch spent the token budget."""
    if not st.before.prio or layout.cfg.kv_connector is not None:
        return TRUE
    sch, after = st.sched, st.after
    used, total = _batch(st)
    left_out = []
    for j, r in enumerate(after.running):
        in_batch = disj(*[conj(u, eq(e.req, r)) for u, e in zip(used, sch.entries)])
        left_out.append(z3.Implies(conj(lt(j, after.running_len), neg(in_batch)), _nothing_to_schedule(layout, st, r)))
    return z3.Implies(_schedules(st), disj(le(layout.cfg.max_num_batched_tokens, total), conj(left_out)))


PRIORITY_STEP_FORMULAS = {"PR2_victim_leaves_no_trace": pr2_victim_leaves_no_trace,
                          "PR3_running_loop_skips_nothing": pr3_running_loop_skips_nothing}

"""The prefill cadence's properties in Z3 (spec/cadence_properties.py,
spec/transitions.py): CAD1-CAD3, each a formula of one step (`st.before`,
the step's action and the schedule of its frame, `st.sched`) clause for
clause after the spec's predicate, and two auxiliary state invariants of
the cadence's flags, each with its concrete predicate beside it (formulas
and predicates are compared on the model's states and steps, and on
perturbed and mutated ones: tests/test_z3_cadence.py).

As in the spec, CAD1-CAD3 are stated against second computations, not the
encoding's hooks (encoding/cadence.py): CAD1 and CAD3 recompute whether the
call was held and whether its batch carried a prefill from the frame and
the batch (a running request's entry by membership of `running`, not by
the loop's admission flags); CAD2 builds the whole schedule of the frame a
second time, with `prefill_schedule_interval` set to 1 (`plain_schedule`).

Where the encoding's batch holds less than the spec's `ScheduledEntry`:
an admission's `cached` is its entry's start (the counter it was admitted
with is its prefix hit), and CAD2 compares `new_blocks` through what they
become, every request's block table after the call. It compares the
preempted requests as a set: under FCFS the victims leave from the tail of
`running` in order, so two calls on one frame with the same victims
preempted them in the same order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import z3
from flightcheck.spec import State, Status
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.requests import tokens_at
from flightcheck.verification.z3.encoding.state import NEW, RUNNING, Layout, SState
from flightcheck.verification.z3.encoding.terms import Builder, V, conj, disj, eq, ite, lt, member, neg, pick

# --- the auxiliary state invariants: formulas and concrete predicates


def cada1_new_request_unmarked(layout: Layout, s: SState) -> Any:
    """CADA1: a request that has not arrived is neither a prefill chunk nor
    deferred (only a schedule call marks a request, and only one it met)."""
    c = s.cad[0]
    return conj([z3.Implies(eq(q.status, NEW), conj(neg(c.chunk[r]), neg(c.deferred[r]))) for r, q in enumerate(s.reqs)])


def cada1_holds(state: State) -> bool:
    return all(not (q.is_prefill_chunk or q.deferred_waiting) for q in state.requests if q.status is Status.NEW)


def cada2_running_request_not_deferred(layout: Layout, s: SState) -> Any:
    """CADA2: a running request is not in `deferred_waiting` (its admission
    took it out, spec cadence.mark_prefill_chunk)."""
    c = s.cad[0]
    return conj([z3.Implies(eq(q.status, RUNNING), neg(c.deferred[r])) for r, q in enumerate(s.reqs)])


def cada2_holds(state: State) -> bool:
    return all(not q.deferred_waiting for q in state.requests if q.status is Status.RUNNING)


def cada3_entries_within_the_model_length(layout: Layout, s: SState) -> Any:
    """CADA3: every entry in flight, whatever its fate, starts at most at
    max_model_len and holds at most max_model_len tokens: async scheduling's
    A12 (z3.induction.strengthening), which the sync profiles' proofs do
    not offer, needed on cadence-z3-k2 as RPA2 is on the reset-pause model.
    S2 and S10 bound sums of starts and lengths, and in bit-vectors a start
    and a length near the top of the range wrap round to a small sum:
    without CADA3 the Houdini loop's first counterexample to induction was
    a schedule step resuming a preempted request (drop mode) beside its
    orphaned entry of 127 tokens, its in-flight counter of 127 pushed to
    -128 by the new entry (IF0 and IF2 broken), and every other conjunct
    fell after them."""
    from flightcheck.verification.z3.induction.strengthening import a12_snapshots_within_the_model_length
    return a12_snapshots_within_the_model_length(layout, s)


def cada3_holds(state: State, max_model_len: int) -> bool:
    return all(e.start <= max_model_len and e.n <= max_model_len for b in state.in_flight for e in b)


CAD_AUXILIARY: dict[str, Callable[[Layout, SState], Any]] = {
    "CADA1_new_request_unmarked": cada1_new_request_unmarked,
    "CADA2_running_request_not_deferred": cada2_running_request_not_deferred,
    "CADA3_entries_within_the_model_length": cada3_entries_within_the_model_length,
}
CAD_AUXILIARY_PREDICATES: dict[str, Callable[[State, Any], bool]] = {
    "CADA1_new_request_unmarked": lambda s, cfg: cada1_holds(s),
    "CADA2_running_request_not_deferred": lambda s, cfg: cada2_holds(s),
    "CADA3_entries_within_the_model_length": lambda s, cfg: cada3_holds(s, cfg.max_model_len),
}

# --- CAD1-CAD3 on one step


def _scheduled(st) -> Any:
    """The step schedules (spec transitions._on_schedule: a Schedule whose `schedule` is not None)."""
    return conj(eq(st.choices.act, SCHEDULE), st.sched.result)


def _was_running(st, e) -> Any:
    return member(e.req, st.before.running, st.before.running_len)


def _short(layout: Layout, st, e) -> Any:
    """An admission's entry with more than one token left to compute past its cached prefix (its start)."""
    return lt(e.start, tokens_at(layout, st.before, e.req) - 1)


def cad1_deferred_call_carries_no_prefill(layout: Layout, st) -> Any:
    """CAD1: a call made within the interval, with a running request that is
    not a prefill chunk and the queue not backed up, schedules no running
    prefill chunk and admits no request with more than one token left."""
    before, sch = st.before, st.sched
    c = before.cad[0]
    decode = [conj(lt(j, before.running_len), neg(pick(c.chunk, r, z3.BoolVal(True))))
              for j, r in enumerate(before.running)]
    held = conj(lt(0, c.hold), neg(c.bound), disj(*decode))
    out = []
    for j, e in enumerate(sch.entries):
        running, chunk = _was_running(st, e), pick(c.chunk, e.req, z3.BoolVal(False))
        out.append(z3.Implies(lt(j, sch.count), conj(neg(conj(running, chunk)),
                                                     neg(conj(neg(running), _short(layout, st, e))))))
    return z3.Implies(conj(_scheduled(st), held), conj(out))


def plain_schedule(layout: Layout, s: SState) -> tuple[Any, list]:
    """spec `schedule(before, replace(cfg, prefill_schedule_interval=1))` on
    frame s: the encoding's schedule under a layout whose cadence is off
    (the frame's cadence part is carried along, unread), and the
    definitions of its auxiliary variables, named after the frame."""
    from flightcheck.verification.z3.encoding.schedule import schedule
    plain = replace(layout, model=replace(layout.model, cfg=replace(layout.cfg, prefill_schedule_interval=1)))
    builder = Builder(f"plain[{s.num_batches}]")
    return schedule(plain, builder, s), builder.defs


def cad2_backed_up_queue_not_held(layout: Layout, st) -> Any:
    """CAD2: a call made while the last release left the waiting queue
    backed up forms the batch (entries and preemptions) the same call forms
    without the cadence. The second schedule's definitions are the
    antecedent: they fix its auxiliary variables, so the formula, negated,
    asks for a frame where the two calls differ."""
    before, sch = st.before, st.sched
    plain, defs = plain_schedule(layout, before)
    same = [eq(sch.count, plain.count)] + [a == b for a, b in zip(sch.preempted, plain.preempted)]
    for j, (e, f) in enumerate(zip(sch.entries, plain.entries)):
        fields = conj(eq(e.req, f.req), eq(e.start, f.start), eq(e.n, f.n), e.samples == f.samples,
                      eq(e.drafts, f.drafts))
        same.append(z3.Implies(lt(j, sch.count), fields))
    for q, p in zip(sch.state.reqs, plain.state.reqs):      # new_blocks, by the tables they end in
        same += [eq(q.table_len, p.table_len)] + [eq(x, y) for x, y in zip(q.table, p.table)]
    body = ite(plain.result, conj(same), conj(eq(sch.count, 0), neg(sch.any_preempted)))
    return z3.Implies(conj(*defs), z3.Implies(conj(_scheduled(st), before.cad[0].bound), body))


def cad3_hold_restarts_after_prefill(layout: Layout, st) -> Any:
    """CAD3: after a call the hold is interval - 1 if it scheduled a
    prefill (a running prefill chunk, or an admission with more than one
    token left), else one less after a call that scheduled tokens (floored
    at 0), else unchanged. The spec's predicate also counts a running chunk
    a priority preemption took back out of the batch (`Scheduled.taken_back`);
    the encoding's batch keeps no such record, and needs none: the cadence's
    encoding refuses the priority policy (`refuse_unencoded_cadence`, in
    `Layout.of`), and under FCFS the victim is the tail of `running`, at or
    past the loop's position, never a request the call already scheduled,
    so every request the call scheduled is in its batch (on cadence-k2 no
    step takes anything back: tests/test_prefill_cadence.py). Lifting the
    refusal needs the hand-back's chunk here and in encoding/cadence.py's
    `carried_prefill`."""
    before, sch = st.before, st.sched
    c = before.cad[0]
    carried = disj(*[conj(lt(j, sch.count), ite(_was_running(st, e), pick(c.chunk, e.req, z3.BoolVal(False)),
                                                   _short(layout, st, e)))
                     for j, e in enumerate(sch.entries)])
    aged = ite(lt(0, sch.count), ite(lt(0, c.hold), c.hold - 1, V(0)), c.hold)
    want = ite(carried, V(layout.cfg.prefill_schedule_interval - 1), aged)
    return z3.Implies(_scheduled(st), eq(sch.state.cad[0].hold, want))


CAD_TRANSITION_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "CAD1_deferred_call_carries_no_prefill": cad1_deferred_call_carries_no_prefill,
    "CAD2_backed_up_queue_not_held": cad2_backed_up_queue_not_held,
    "CAD3_hold_restarts_after_prefill": cad3_hold_restarts_after_prefill,
}

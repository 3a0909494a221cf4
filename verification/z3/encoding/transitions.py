"""spec/transitions.py in Z3: each transition property a formula of one step
(`st.before`, `st.after`, the step's choices and schedule), of the same name,
clause for clause after the Python one; `tests/test_z3_invariants.py` checks
that each formula and its predicate agree on sampled steps. Also the list of
every spec property the engines prove: the state invariants
(invariants.py), then these."""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import Config
from flightcheck.verification.z3.encoding.actions import ARRIVE, COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.invariants import INVARIANT_FORMULAS, invariant_formulas_for
from flightcheck.verification.z3.encoding.requests import at
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_LENGTH,
    F_STOPPED,
    NEW,
    RUNNING,
    Layout,
)
from flightcheck.verification.z3.encoding.terms import conj, disj, eq, ite, le, lt, neg, pick


def _kept(st, shift: int):
    return st.before.batches[shift:], st.before.num_batches - shift


def s4_snapshot_immutability(layout: Layout, st) -> Any:
    def holds(shift: int) -> Any:
        kept, n = _kept(st, shift)
        after = st.after
        out = [le(n, after.num_batches)]
        for kk, (x, y) in enumerate(zip(kept, after.batches)):
            both = conj(lt(kk, n), lt(kk, after.num_batches))
            same = [eq(x.length, y.length)]
            for j, (a, b) in enumerate(zip(x.entries, y.entries)):
                snap = conj(eq(a.req, b.req), eq(a.start, b.start), eq(a.n, b.n), a.samples == b.samples,
                            eq(a.drafts, b.drafts))
                same.append(z3.Implies(lt(j, x.length), snap))
            out.append(z3.Implies(both, conj(same)))
        return conj(out)
    return ite(eq(st.choices.act, COMPLETE), holds(1), holds(0))


def s13_fates_only_age(layout: Layout, st) -> Any:
    def holds(shift: int) -> Any:
        kept, n = _kept(st, shift)
        after, out = st.after, []
        for kk, (x, y) in enumerate(zip(kept, after.batches)):
            both = conj(lt(kk, n), lt(kk, after.num_batches))
            for j, (a, b) in enumerate(zip(x.entries, y.entries)):
                out.append(z3.Implies(conj(both, lt(j, x.length), lt(j, y.length)), le(a.fate, b.fate)))
        return conj(out)
    return ite(eq(st.choices.act, COMPLETE), holds(1), holds(0))


def s12_status_monotonicity(layout: Layout, st) -> Any:
    before, after, act, sch = st.before, st.after, st.choices.act, st.sched
    out = []
    for b, a in zip(before.reqs, after.reqs):
        fin = disj(eq(b.status, F_STOPPED), eq(b.status, F_LENGTH), eq(b.status, F_ABORTED))
        out.append(z3.Implies(fin, conj(eq(a.status, b.status), eq(a.num_output, b.num_output))))
        out.append(z3.Implies(conj(eq(b.status, NEW), neg(eq(a.status, NEW))), eq(act, ARRIVE)))
        out.append(z3.Implies(conj(eq(a.status, RUNNING), neg(eq(b.status, RUNNING))), eq(act, SCHEDULE)))
    admitted = [conj(lt(j, sch.count),
                     disj(neg(eq(at(layout, before, e.req, lambda q, k: q.status), RUNNING)),
                          pick(sch.preempted, e.req, z3.BoolVal(False))))
                for j, e in enumerate(sch.entries)]
    out.append(z3.Implies(conj(eq(act, SCHEDULE), sch.result, sch.any_preempted), neg(disj(*admitted))))
    return conj(out)


TRANSITION_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "S4_snapshot_immutability": s4_snapshot_immutability,
    "S13_fates_only_age": s13_fates_only_age,
    "S12_status_monotonicity": s12_status_monotonicity,
}

# Every spec property the engines prove: the state invariants, then the transition properties.
SPEC_PROPERTIES: tuple[str, ...] = (*INVARIANT_FORMULAS, *TRANSITION_FORMULAS)


def spec_properties_for(cfg: Config) -> tuple[str, ...]:
    """Every spec property the engines prove for cfg's profile: its state
    invariants, then the transition properties."""
    return (*invariant_formulas_for(cfg), *TRANSITION_FORMULAS)

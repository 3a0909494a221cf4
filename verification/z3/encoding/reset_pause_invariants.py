"""Reset and pause's properties in Z3 (spec/reset_pause.py, spec/transitions.py):
RP1-RP4 (and RP5 beside a KV connector), each a formula of one step (`st.before`, `st.after`, the step's
choices and schedule) clause for clause after the spec's predicate, and the
auxiliary state invariant that makes RP3 a one-step consequence of an
inductive invariant, with its concrete predicate beside it (the two are
compared on every reachable state of the model and on perturbed ones:
tests/test_z3_reset_pause.py).

The spec has no state invariant of its own for reset and pause: RP1-RP4
are transition properties. What a completion needs to drop a reset
request's output is a fact about states, derived from RP2 (what a reset
leaves) and the spec's completion (`actions._output_applied`: an output
whose request has stale output in drop mode is dropped):

* `RPA1_reset_entries_dropped`: an entry in flight marked by a reset is
  not LIVE, and while its request is unfinished the request is in drop
  mode. With IF2 (the stale counter is the tokens of the request's entries
  no longer live) and A5 (an entry holds >= 1 token) the request's stale
  output is then > 0 and in drop mode, so the completion drops the entry's
  output: RP3.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.spec import Fate, State
from flightcheck.spec.state import Load
from flightcheck.verification.z3.encoding.actions import COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.connector import in_transfer
from flightcheck.verification.z3.encoding.kv_state import L_DONE, L_NONE
from flightcheck.verification.z3.encoding.reset_pause import is_reset
from flightcheck.verification.z3.encoding.reset_pause_state import PAUSED_ALL, PAUSED_NEW, is_paused
from flightcheck.verification.z3.encoding.state import LIVE, PREEMPTED, RUNNING, WAITING, Layout, SState
from flightcheck.verification.z3.encoding.terms import conj, disj, eq, lt, neg, pick

# --- the auxiliary state invariant: formula and concrete predicate


def _used_entries(s: SState):
    """(batch, slot, entry, reset mark, used) for every entry slot of the frame."""
    flags = s.rp[0].reset
    for k, b in enumerate(s.batches):
        for j, e in enumerate(b.entries):
            yield k, j, e, flags[k][j], conj(lt(k, s.num_batches), lt(j, b.length))


def _unfinished(status: Any) -> Any:
    return disj(eq(status, WAITING), eq(status, RUNNING), eq(status, PREEMPTED))


def rpa1_reset_entries_dropped(layout: Layout, s: SState) -> Any:
    """RPA1: an entry marked by a reset is not LIVE, and its request, while
    unfinished, is in drop mode."""
    out = []
    for _, _, e, mark, used in _used_entries(s):
        drop = pick([c.drop for c in s.counters], e.req, z3.BoolVal(False))
        unfinished = pick([_unfinished(q.status) for q in s.reqs], e.req, z3.BoolVal(False))
        out.append(z3.Implies(conj(used, mark), conj(neg(eq(e.fate, LIVE)), z3.Implies(unfinished, drop))))
    return conj(out)


def rpa1_holds(state: State) -> bool:
    """RPA1 on a concrete state."""
    for batch in state.in_flight:
        for e in batch:
            if not e.reset:
                continue
            q = state.requests[e.req]
            if e.fate is Fate.LIVE or (q.status.is_active and not q.drop_stale):
                return False
    return True


def rpa2_entries_within_the_model_length(layout: Layout, s: SState) -> Any:
    """RPA2: async scheduling's A12 (z3.induction.strengthening), needed here
    under sync scheduling: a reset request is resumed while its old entries
    are still in flight (drop mode defers nothing), which a sync profile in
    deliver mode never does, so its in-flight counter adds a new entry's
    tokens to old ones, and only bounds on each entry keep that bit-vector
    sum from wrapping round (the first counterexample to induction without
    it: entries of 7 and 127 tokens, IF2 broken by the resumption)."""
    from flightcheck.verification.z3.induction.strengthening import a12_snapshots_within_the_model_length
    return a12_snapshots_within_the_model_length(layout, s)


def rpa2_holds(state: State, max_model_len: int) -> bool:
    """RPA2 on a concrete state."""
    return all(e.start <= max_model_len and e.n <= max_model_len for b in state.in_flight for e in b)


RP_AUXILIARY: dict[str, Callable[[Layout, SState], Any]] = {
    "RPA1_reset_entries_dropped": rpa1_reset_entries_dropped,
    "RPA2_entries_within_the_model_length": rpa2_entries_within_the_model_length,
}
# Their concrete predicates, on a state and the model's configuration.
RP_AUXILIARY_PREDICATES: dict[str, Callable[[State, Any], bool]] = {
    "RPA1_reset_entries_dropped": lambda state, cfg: rpa1_holds(state),
    "RPA2_entries_within_the_model_length": lambda state, cfg: rpa2_holds(state, cfg.max_model_len),
}


def rpa3_forgotten_offers_stay_unloaded(layout: Layout, s: SState) -> Any:
    """RPA3 (beside a connector): a request whose offer a reset of the
    connector's cache forgot is offered 0 (`forgotten`) and has no load
    parked, in transfer or landed (NONE, or DONE once admitted): what makes
    RP5 a one-step consequence (a schedule then offers it 0 tokens, so it
    parks for none)."""
    rp, kv = s.rp[0], s.kv[0]
    return conj([z3.Implies(ghost, conj(gone, disj(eq(kv.load[r], L_NONE), eq(kv.load[r], L_DONE))))
                 for r, (ghost, gone) in enumerate(zip(rp.offer_reset, rp.forgotten))])


def rpa3_holds(state: State) -> bool:
    """RPA3 on a concrete state."""
    return all(q.external_hit == 0 and q.load in (Load.NONE, Load.DONE) for q in state.requests if q.offer_reset)


RP_KV_AUXILIARY: dict[str, Callable[[Layout, SState], Any]] = {
    "RPA3_forgotten_offers_stay_unloaded": rpa3_forgotten_offers_stay_unloaded,
}
RP_KV_AUXILIARY_PREDICATES: dict[str, Callable[[State, Any], bool]] = {
    "RPA3_forgotten_offers_stay_unloaded": lambda state, cfg: rpa3_holds(state),
}


# --- RP1-RP5 as formulas of one step


def rp1_paused_schedules_nothing(layout: Layout, st) -> Any:
    """RP1: under PAUSED_ALL a schedule forms no entry and preempts nobody;
    under PAUSED_NEW it schedules only requests that were RUNNING before it
    or (beside a connector) in `kv_holding`."""
    before, sch = st.before, st.sched
    holding = before.kv[0].holding[:layout.N] if before.kv else []      # kv_holding's slots (PAD past its length)
    held = [disj(*[conj(lt(i, before.kv[0].holding_len), eq(x, r)) for i, x in enumerate(holding)])
            for r in range(layout.N)] if before.kv else [z3.BoolVal(False)] * layout.N
    running_before = [conj(lt(j, sch.count), neg(eq(pick([q.status for q in before.reqs], e.req), RUNNING)),
                           neg(pick(held, e.req, z3.BoolVal(False)))) for j, e in enumerate(sch.entries)]
    holds = conj(z3.Implies(is_paused(before, PAUSED_ALL), conj(eq(sch.count, 0), neg(sch.any_preempted))),
                 z3.Implies(is_paused(before, PAUSED_NEW), neg(disj(*running_before))))
    return z3.Implies(eq(st.choices.act, SCHEDULE), holds)


def rp2_reset_drops_in_flight(layout: Layout, st) -> Any:
    """RP2: after a reset of the running requests none runs, and each one
    reset has every entry in flight marked and not live, drop mode on (if it
    has one), stale = in flight and no placeholders."""
    before, after = st.before, st.after
    out = [eq(after.running_len, 0)]
    for r in range(layout.N):
        was_running = disj(*[conj(lt(i, before.running_len), eq(x, r)) for i, x in enumerate(before.running)])
        mine = [(e, mark, conj(used, eq(e.req, r))) for _, _, e, mark, used in _used_entries(after)]
        c = after.counters[r]
        clauses = [z3.Implies(m, conj(neg(eq(e.fate, LIVE)), mark)) for e, mark, m in mine]
        clauses.append(z3.Implies(disj(*[m for _, _, m in mine]), c.drop))
        clauses.append(eq(c.stale, c.in_flight))
        if after.asyncs:
            clauses.append(eq(after.asyncs[r].placeholders, 0))
        out.append(z3.Implies(was_running, conj(clauses)))
    return z3.Implies(is_reset(layout, st.choices.act, True), conj(out))


def rp3_reset_output_never_applied(layout: Layout, st) -> Any:
    """RP3: a completion applies no output of an entry in flight at its
    request's reset: that request's outputs do not change by it."""
    before, after = st.before, st.after
    b0, flags = before.batches[0], before.rp[0].reset[0]
    out = []
    for j, e in enumerate(b0.entries):
        same = eq(pick([q.num_output for q in after.reqs], e.req), pick([q.num_output for q in before.reqs], e.req))
        out.append(z3.Implies(conj(lt(0, before.num_batches), lt(j, b0.length), flags[j]), same))
    return z3.Implies(eq(st.choices.act, COMPLETE), conj(out))


def rp4_prefix_cache_reset(layout: Layout, st) -> Any:
    """RP4: after a reset of the running requests no block is held and no
    label cached; without them, every label cleared or (a block was held)
    nothing changed."""
    before, after = st.before, st.after
    cleared = conj(*[eq(c, 0) for c in after.pool.ref], *[eq(x, layout.none_label) for x in after.pool.label])
    held = disj(*[lt(0, c) for c in before.pool.ref])
    unchanged = conj(*[eq(x, y) for x, y in zip(after.pool.label, before.pool.label)])
    return conj(z3.Implies(is_reset(layout, st.choices.act, True), cleared),
                z3.Implies(is_reset(layout, st.choices.act, False), disj(cleared, conj(held, unchanged))))


def rp5_connector_reset_forgets_offers(layout: Layout, st) -> Any:
    """RP5 (beside a connector): a schedule gives no request whose offer a
    reset of the connector's cache forgot (the ghost `offer_reset` before
    it) an entry with external tokens, nor leaves its load in transfer. The
    batch the schedule launches is the after-frame's slot `num_batches`
    before it (kv_schedule.kv_launch)."""
    before, after, sch = st.before, st.after, st.sched
    forgot, kv = before.rp[0].offer_reset, after.kv[0]
    out = []
    for k, row in enumerate(kv.entries):
        for j, e in enumerate(sch.entries):
            launched = conj(eq(before.num_batches, k), lt(j, sch.count), pick(forgot, e.req, z3.BoolVal(False)))
            out.append(z3.Implies(launched, eq(row[j].external, 0)))
    out += [z3.Implies(forgot[r], neg(in_transfer(kv.load[r]))) for r in range(layout.N)]
    return z3.Implies(eq(st.choices.act, SCHEDULE), conj(out))


RP_TRANSITION_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "RP1_paused_schedules_nothing": rp1_paused_schedules_nothing,
    "RP2_reset_drops_in_flight": rp2_reset_drops_in_flight,
    "RP3_reset_output_never_applied": rp3_reset_output_never_applied,
    "RP4_prefix_cache_reset": rp4_prefix_cache_reset,
}
# Beside a KV connector (spec.transitions.CONNECTOR_RESET_PROPERTY).
RP5_FORMULA: dict[str, Callable[[Layout, Any], Any]] = {
    "RP5_connector_reset_forgets_offers": rp5_connector_reset_forgets_offers,
}


def rp_transition_formulas(cfg) -> dict[str, Callable[[Layout, Any], Any]]:
    """RP1-RP4, and RP5 beside a connector: the spec's (transition_properties_for)."""
    return {**RP_TRANSITION_FORMULAS, **(RP5_FORMULA if cfg.kv_connector is not None else {})}

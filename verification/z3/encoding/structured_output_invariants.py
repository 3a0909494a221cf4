"""Structured output's invariants in Z3 (spec/grammar.py G1-G3, clause for
clause after the spec's predicates), and the auxiliary invariants that make
them inductive on the grammar model (verification/z3/grammar_models.py).

Registered with one line in feature_formulas.py: the feature engines
(z3/kv_engines.py) bound them by BMC and prove them by k-induction.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_ERROR,
    F_LENGTH,
    F_STOPPED,
    G_WAIT,
    LIVE,
    NEW,
    ORPHANED,
    PREEMPTED,
    REMOTE_KVS,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.structured_output_state import (
    G_COMPILING,
    G_FAILED,
    G_NONE,
    G_READY,
    G_REJECTED,
    NO_MASK,
    structured,
)
from flightcheck.verification.z3.encoding.terms import V, conj, count, disj, eq, le, lt, member, neg, pick

GrammarFormula = Callable[[Layout, SState], Any]


def _active(status: Any) -> Any:
    """spec Status.is_active, over every code a frame with structured output holds."""
    return disj(*[eq(status, c) for c in (WAITING, RUNNING, PREEMPTED, REMOTE_KVS, G_WAIT)])


def _entries(s: SState) -> list[tuple[Any, Any, Any]]:
    """(entry, its mask, slot in use) over every in-flight slot."""
    g = s.grammar[0]
    return [(e, g.masks[k][j], conj(lt(k, s.num_batches), lt(j, b.length)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]


def g1_no_run_while_compiling(layout: Layout, s: SState) -> Any:
    """G1: an unfinished request whose grammar compiles or failed is not
    RUNNING, has no computed token, no table and no live entry in flight;
    one waiting for its grammar is in `waiting`."""
    g, out = s.grammar[0], []
    for r, q in enumerate(s.reqs):
        unready = conj(disj(eq(g.grammar[r], G_COMPILING), eq(g.grammar[r], G_FAILED)), _active(q.status))
        live = disj(*[conj(used, eq(e.req, r), eq(e.fate, LIVE)) for e, _, used in _entries(s)])
        ran = disj(eq(q.status, RUNNING), neg(eq(q.num_computed, 0)), neg(eq(q.table_len, 0)), live)
        out.append(z3.Implies(unready, neg(ran)))
        out.append(z3.Implies(eq(q.status, G_WAIT), member(V(r), s.waiting, s.waiting_len)))
    return conj(out)


def g2_fsm_tracks_output(layout: Layout, s: SState) -> Any:
    """G2: a compiled grammar's FSM has accepted exactly the request's output
    tokens; one compiling or failed, none, and the request has no output."""
    g, out = s.grammar[0], []
    for r, q in enumerate(s.reqs):
        out.append(z3.Implies(eq(g.grammar[r], G_READY), eq(g.fsm[r], q.num_output)))
        out.append(z3.Implies(disj(eq(g.grammar[r], G_COMPILING), eq(g.grammar[r], G_FAILED)),
                              conj(eq(g.fsm[r], 0), eq(q.num_output, 0))))
    return conj(out)


def g3_fsm_never_refuses(layout: Layout, s: SState) -> Any:
    """G3: no grammar has refused a token."""
    return conj([neg(eq(code, G_REJECTED)) for code in s.grammar[0].grammar])


GRAMMAR_FORMULAS: dict[str, GrammarFormula] = {
    "G1_no_run_while_compiling": g1_no_run_while_compiling,
    "G2_fsm_tracks_output": g2_fsm_tracks_output,
    "G3_fsm_never_refuses": g3_fsm_never_refuses,
}


# --- auxiliary invariants: what makes G1-G3 inductive ------------------------------

_FINISHED = (F_STOPPED, F_LENGTH, F_ABORTED, F_ERROR)


def ga1_grammar_by_status(layout: Layout, s: SState) -> Any:
    """A structured request has no grammar before it arrives and one after;
    an unfinished one whose grammar compiles or failed waits for it (G_WAIT),
    and one that waits has a grammar (compiled, until the waiting loop
    meets it: then WAITING) and has never run; a failed grammar is recorded only for a request
    whose grammar failed; no frame holds a connector's status."""
    g, out = s.grammar[0], []
    for r, q in enumerate(s.reqs):
        code = g.grammar[r]
        out.append(neg(eq(q.status, REMOTE_KVS)))
        out.append(z3.Implies(eq(q.status, NEW), conj(eq(code, G_NONE), eq(g.fsm[r], 0), neg(g.errors[r]))))
        if structured(layout, r):
            out.append(z3.Implies(neg(eq(q.status, NEW)), neg(eq(code, G_NONE))))
        unready = disj(eq(code, G_COMPILING), eq(code, G_FAILED))
        out.append(z3.Implies(conj(_active(q.status), unready), eq(q.status, G_WAIT)))
        out.append(z3.Implies(eq(q.status, G_WAIT), conj(disj(unready, eq(code, G_READY)), eq(q.num_output, 0),
                                                         eq(q.num_computed, 0), eq(q.num_drafts, 0),
                                                         eq(q.table_len, 0))))
        out.append(z3.Implies(g.errors[r], eq(code, G_FAILED)))
        out.append(z3.Implies(eq(code, G_REJECTED), eq(q.status, F_ERROR)))
    return conj(out)


def ga2_queues(layout: Layout, s: SState) -> Any:
    """S10's queues with structured output: a RUNNING request is once in
    `running`, a WAITING, PREEMPTED or grammar-waiting one once in `waiting`,
    any other in neither."""
    out = []
    for r, q in enumerate(s.reqs):
        running = count(conj(lt(j, s.running_len), eq(x, r)) for j, x in enumerate(s.running))
        waiting = count(conj(lt(j, s.waiting_len), eq(x, r)) for j, x in enumerate(s.waiting))
        queued = disj(eq(q.status, WAITING), eq(q.status, PREEMPTED), eq(q.status, G_WAIT))
        out.append(eq(running, z3.If(eq(q.status, RUNNING), V(1), V(0))))
        out.append(eq(waiting, z3.If(queued, V(1), V(0))))
    return conj(out)


def ga3_masks_at_the_fsm(layout: Layout, s: SState) -> Any:
    """Each in-flight entry's mask: none for an entry that does not sample
    or whose request's grammar was not compiled when it was scheduled; the
    FSM's position now for a sampling entry of an unfinished request whose
    grammar is compiled and whose output will be applied (under vLLM 0.33's
    counters an output is looked up by name, its fate not read: a
    superseded entry's stale output is applied too, unless in drop mode),
    since the FSM has not moved since: no other output of the request is
    applied before it."""
    g, out = s.grammar[0], []
    for e, mask, used in _entries(s):
        code = pick(g.grammar, e.req, V(G_NONE))
        unready = disj(eq(code, G_NONE), eq(code, G_COMPILING), eq(code, G_FAILED))
        out.append(z3.Implies(conj(used, disj(neg(e.samples), unready)), eq(mask, NO_MASK)))
        status = pick([q.status for q in s.reqs], e.req, V(NEW))
        delivered = disj(neg(eq(e.fate, SUPERSEDED)), neg(pick([c.drop for c in s.counters], e.req)))
        pending = conj(used, e.samples, _active(status), eq(code, G_READY), delivered)
        out.append(z3.Implies(pending, eq(mask, pick(g.fsm, e.req, V(0)))))
    return conj(out)


def ga4_entries_and_counters(layout: Layout, s: SState) -> Any:
    """Each in-flight entry's start, n and end within max_model_len, each
    bounded alone first (so the bit-vector sum cannot wrap); an unfinished
    request's counters are its entries' tokens in flight (IF1, IF2 with the
    grammar-waiting status among the unfinished), bounded."""
    from flightcheck.verification.z3.encoding.terms import sum_terms
    cfg, out = layout.cfg, []
    mml = cfg.max_model_len
    for e, _, used in _entries(s):
        bounds = [le(0, e.start), le(e.start, mml), le(1, e.n), le(e.n, mml), le(e.start + e.n, mml)]
        if not cfg.num_spec_tokens:
            bounds.append(eq(e.drafts, 0))
        out.append(z3.Implies(used, conj(bounds)))
    for r, (q, c) in enumerate(zip(s.reqs, s.counters)):
        mine = [(e, conj(used, eq(e.req, r))) for e, _, used in _entries(s)]
        tokens = sum_terms([z3.If(m, e.n, V(0)) for e, m in mine])
        stale = sum_terms([z3.If(conj(m, neg(eq(e.fate, LIVE))), e.n, V(0)) for e, m in mine])
        out.append(z3.Implies(_active(q.status), conj(eq(c.in_flight, tokens), eq(c.stale, stale), le(0, c.stale),
                                                      le(c.stale, c.in_flight))))
        out.append(le(c.in_flight, layout.K * layout.E * mml))
    return conj(out)


def ga5_one_sampling_entry(layout: Layout, s: SState) -> Any:
    """An unfinished request has at most one sampling entry in flight that
    is live or orphaned (sync: its next token is scheduled only once the
    previous one is back), and a superseded entry only in drop mode (a
    preempted request in deliver mode resumes only once its stale output
    is back), so no second output moves the FSM under an entry's mask; in
    deliver mode (`Config.stale_mode`) no request is ever in drop mode."""
    out = []
    for r, (q, c) in enumerate(zip(s.reqs, s.counters)):
        mine = [(e, conj(used, eq(e.req, r))) for e, _, used in _entries(s)]
        sampling = count(conj(m, e.samples, neg(eq(e.fate, SUPERSEDED))) for e, m in mine)
        superseded = disj(*[conj(m, eq(e.fate, SUPERSEDED)) for e, m in mine])
        out.append(z3.Implies(_active(q.status), conj(le(sampling, 1), z3.Implies(superseded, c.drop))))
        if layout.cfg.stale_mode != "drop":
            out.append(neg(c.drop))
    return conj(out)


GRAMMAR_AUXILIARY: dict[str, GrammarFormula] = {
    "GA1_grammar_by_status": ga1_grammar_by_status,
    "GA2_queues": ga2_queues,
    "GA3_masks_at_the_fsm": ga3_masks_at_the_fsm,
    "GA4_entries_and_counters": ga4_entries_and_counters,
    "GA5_one_sampling_entry": ga5_one_sampling_entry,
}

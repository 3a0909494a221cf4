"""Streaming sessions' named properties in Z3 (spec/session_invariants.py),
clause for clause after the spec's predicates: SS2-SS4 as state formulas
(`SESSION_FORMULAS`), SS1 as a formula of one step (`ss1_old_output_never_bound`),
and the auxiliary invariants that make them inductive on the session model
(`SESSION_AUXILIARY`, each a fact of every reachable state; kv_engines.py
proves them alongside).

A formula speaks of a session frame (session_state.py); on any other frame
it is true (sessions are off: the spec's predicates hold vacuously).
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.spec.blocks import cdiv
from flightcheck.verification.z3.encoding.actions import COMPLETE, is_active
from flightcheck.verification.z3.encoding.entries import positions
from flightcheck.verification.z3.encoding.requests import num_tokens
from flightcheck.verification.z3.encoding.session_state import is_resumable_slot, session_inputs
from flightcheck.verification.z3.encoding.sessions import parked_count
from flightcheck.verification.z3.encoding.state import LIVE, NEW, PARKED, WAITING, Layout, SState
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    disj,
    div_const,
    eq,
    ite,
    le,
    lt,
    member,
    neg,
    sum_terms,
)


def _is_session(layout: Layout, s: SState, r: int) -> Any:
    """session_invariants._is_session: resumable (arrived, a session prompt) and unfinished."""
    if not is_resumable_slot(layout, r):
        return z3.BoolVal(False)
    return is_active(s.reqs[r].status, parked=True)


def _entries(s: SState) -> list[tuple[Any, Any, Any]]:
    """(entry, slot in use, its turn) over every in-flight slot in FIFO order."""
    turns = [t for row in s.sess[0].entry_turn for t in row]
    return [(e, u, t) for (e, u), t in zip(positions(None, s), turns)]


def _old(s: SState, r: int) -> list[tuple[Any, Any]]:
    """(entry, it is an entry of r of an earlier turn than r's) per slot."""
    turn = s.reqs[r].session[0].turn
    return [(e, conj(u, eq(e.req, r), lt(t, turn))) for e, u, t in _entries(s)]


def _has_live(s: SState, r: int) -> Any:
    return disj(*[conj(u, eq(e.req, r), eq(e.fate, LIVE)) for e, u in positions(None, s)])


def ss2_old_turn_given_up(layout: Layout, s: SState) -> Any:
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for r in range(layout.N):
        old, c = _old(s, r), s.counters[r]
        covered = conj(c.drop, le(sum_terms(ite(o, e.n, V(0)) for e, o in old), c.stale))
        ok = conj(*[z3.Implies(o, neg(eq(e.fate, LIVE))) for e, o in old], z3.Implies(disj(*[o for _, o in old]), covered))
        out.append(z3.Implies(_is_session(layout, s, r), ok))
    return conj(out)


def ss3_waiting_session_holds_blocks(layout: Layout, s: SState) -> Any:
    if not s.sess:
        return z3.BoolVal(True)
    ss, out = s.sess[0], []
    for r, q in enumerate(s.reqs):
        x = q.session[0]
        placeholders = s.asyncs[r].placeholders if s.asyncs else V(0)
        held = member(V(r), ss.holding, ss.holding_len)
        ok = conj(z3.BoolVal(is_resumable_slot(layout, r)), neg(_has_live(s, r)), eq(q.num_drafts, 0),
                  eq(placeholders, 0), eq(x.queued, 0), held == lt(0, q.num_computed),
                  le(div_const(q.num_computed + (layout.cfg.block_size - 1), layout.cfg.block_size), q.table_len),
                  le(q.num_computed, num_tokens(layout, q, r) - 1))
        out.append(z3.Implies(eq(q.status, PARKED), ok))
    return conj(out)


def ss4_waiting_session_keeps_seat(layout: Layout, s: SState) -> Any:
    if not s.sess:
        return z3.BoolVal(True)
    return le(s.running_len + parked_count(s), layout.cfg.max_num_seqs)


SESSION_FORMULAS = {
    "SS2_old_turn_given_up": ss2_old_turn_given_up,
    "SS3_waiting_session_holds_blocks": ss3_waiting_session_holds_blocks,
    "SS4_waiting_session_keeps_seat": ss4_waiting_session_keeps_seat,
}


def ss1_old_output_never_bound(layout: Layout, st) -> Any:
    """SS1 on a step (`st.before`, `st.after`, its choices): when the oldest
    batch returns, an entry of an earlier turn of its session than the
    session's turn leaves its request's num_output, prompt and num_computed
    as they were."""
    before, after = st.before, st.after
    if not before.sess:
        return z3.BoolVal(True)
    out = []
    b0, turns = before.batches[0], before.sess[0].entry_turn[0]
    for j, (e, t) in enumerate(zip(b0.entries, turns)):
        for r in range(layout.N):
            b, a = before.reqs[r], after.reqs[r]
            old = conj(lt(0, before.num_batches), lt(j, b0.length), eq(e.req, r), _is_session(layout, before, r),
                       lt(t, b.session[0].turn))
            same = conj(eq(a.num_output, b.num_output), eq(a.session[0].prompt_len, b.session[0].prompt_len),
                        eq(a.num_computed, b.num_computed))
            out.append(z3.Implies(old, same))
    return z3.Implies(eq(st.choices.act, COMPLETE), conj(out))


# --- the auxiliary invariants ----------------------------------------------------


def sa1_turns_not_ahead(layout: Layout, s: SState) -> Any:
    """Every entry in flight was scheduled in its request's turn or an
    earlier one, a live one in the turn itself (a stop supersedes the rest)."""
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for e, u, t in _entries(s):
        for r in range(layout.N):
            turn = s.reqs[r].session[0].turn
            mine = conj(u, eq(e.req, r))
            out += [z3.Implies(mine, le(t, turn)), z3.Implies(conj(mine, eq(e.fate, LIVE)), eq(t, turn))]
    return conj(out)


def sa2_session_queues(layout: Layout, s: SState) -> Any:
    """Where each request of a session frame waits: kv_holding holds only
    sessions with computed tokens, WAITING or parked, each at most once,
    none also in `waiting` or `running`; a parked session waits in
    kv_holding or `waiting`; queued inputs only while not parked."""
    if not s.sess:
        return z3.BoolVal(True)
    ss, out = s.sess[0], []
    for r, q in enumerate(s.reqs):
        x = q.session[0]
        held = [conj(lt(j, ss.holding_len), eq(h, r)) for j, h in enumerate(ss.holding)]
        in_holding = disj(*held)
        waits = member(V(r), s.waiting, s.waiting_len)
        out += [z3.Implies(in_holding, conj(z3.BoolVal(is_resumable_slot(layout, r)), lt(0, q.num_computed),
                                            disj(eq(q.status, WAITING), eq(q.status, PARKED)),
                                            neg(waits), neg(member(V(r), s.running, s.running_len)))),
                sum_terms(ite(h, V(1), V(0)) for h in held) <= 1,
                z3.Implies(eq(q.status, PARKED), disj(in_holding, waits)),
                z3.Implies(lt(0, x.queued), neg(eq(q.status, PARKED)))]
        if not is_resumable_slot(layout, r):
            out += [neg(in_holding), eq(x.queued, 0), eq(x.to_send, 0), eq(x.turn, 0)]
    return conj(out)


def sa4_turns_count_inputs(layout: Layout, s: SState) -> Any:
    """A NEW request's session fields are pristine, a finished one sends and
    queues nothing, and an unfinished session has stopped once per input it
    took (once more while parked): turn = inputs consumed (+1 parked)."""
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for r, q in enumerate(s.reqs):
        x, n = q.session[0], len(session_inputs(layout, r))
        new = eq(q.status, NEW)
        out.append(z3.Implies(new, conj(eq(x.prompt_len, 0), eq(x.max_tokens, 0), eq(x.turn, 0), eq(x.to_send, 0),
                                        eq(x.queued, 0), eq(q.num_output, 0))))
        out.append(z3.Implies(neg(disj(new, is_active(q.status, parked=True))),
                              conj(eq(x.to_send, 0), eq(x.queued, 0), le(x.turn, n))))
        consumed = n - x.to_send - x.queued
        out.append(z3.Implies(is_active(q.status, parked=True),
                              conj(eq(x.turn, consumed + ite(eq(q.status, PARKED), V(1), V(0))),
                                   lt(0, x.prompt_len), lt(0, x.max_tokens))))
    return conj(out)


def sa3_session_lengths(layout: Layout, s: SState) -> Any:
    """A session's prompt and outputs stay within the model length, a
    WAITING request with computed tokens is a session's next turn (fewer
    computed than known), and the turn counts the inputs taken."""
    if not s.sess:
        return z3.BoolVal(True)
    L, out = layout.cfg.max_model_len, []
    for r, q in enumerate(s.reqs):
        x = q.session[0]
        out += [le(num_tokens(layout, q, r), L), le(0, q.num_output),
                z3.Implies(conj(eq(q.status, WAITING), lt(0, q.num_computed)),
                           conj(z3.BoolVal(is_resumable_slot(layout, r)), lt(q.num_computed, num_tokens(layout, q, r))))]
    return conj(out)


SESSION_AUXILIARY = {
    "SA1_turns_not_ahead": sa1_turns_not_ahead,
    "SA2_session_queues": sa2_session_queues,
    "SA3_session_lengths": sa3_session_lengths,
    "SA4_turns_count_inputs": sa4_turns_count_inputs,
}

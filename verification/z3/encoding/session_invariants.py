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
from flightcheck.spec.session_invariants import sa10_applies
from flightcheck.verification.z3.encoding.actions import COMPLETE, is_active
from flightcheck.verification.z3.encoding.entries import positions
from flightcheck.verification.z3.encoding.requests import num_tokens
from flightcheck.verification.z3.encoding.session_state import is_resumable_slot, session_inputs
from flightcheck.verification.z3.encoding.sessions import parked_count
from flightcheck.verification.z3.encoding.state import LIVE, NEW, PARKED, PREEMPTED, RUNNING, WAITING, Layout, SState
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    count,
    disj,
    div_const,
    eq,
    ite,
    le,
    lt,
    member,
    neg,
    pick,
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
    earlier one, a live one in the turn itself (a stop supersedes the rest);
    a WAITING or parked request has none of its turn (it has not been
    scheduled since its stop, or since it arrived)."""
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for e, u, t in _entries(s):
        for r in range(layout.N):
            q = s.reqs[r]
            turn = q.session[0].turn
            mine = conj(u, eq(e.req, r))
            out += [z3.Implies(mine, le(t, turn)), z3.Implies(conj(mine, eq(e.fate, LIVE)), eq(t, turn)),
                    z3.Implies(conj(mine, disj(eq(q.status, WAITING), eq(q.status, PARKED))), lt(t, turn))]
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


def sa5_one_queue_per_request(layout: Layout, s: SState) -> Any:
    """Each unfinished request sits in exactly one of `running`, `waiting`,
    `kv_holding` (in `running` exactly when RUNNING), a NEW or finished one
    in none (spec S10 with kv_holding and parked sessions)."""
    if not s.sess:
        return z3.BoolVal(True)
    ss, out = s.sess[0], []
    for r, q in enumerate(s.reqs):
        def times(xs: list, n: Any) -> Any:
            return sum_terms(ite(conj(lt(j, n), eq(x, r)), V(1), V(0)) for j, x in enumerate(xs))
        total = times(s.running, s.running_len) + times(s.waiting, s.waiting_len) + times(ss.holding, ss.holding_len)
        active = is_active(q.status, parked=True)
        out += [eq(total, ite(active, V(1), V(0))),
                eq(times(s.running, s.running_len), ite(eq(q.status, RUNNING), V(1), V(0)))]
    return conj(out)


def sa6_session_counters(layout: Layout, s: SState) -> Any:
    """IF0-IF2 with parked sessions among the unfinished requests: the
    in-flight counter is the tokens of the request's entries in flight, the
    stale counter those of its entries no longer live; a NEW or finished
    request has no counters, placeholders or countdown (spec A10)."""
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for r, (q, c) in enumerate(zip(s.reqs, s.counters)):
        mine = [(e, conj(u, eq(e.req, r))) for e, u in positions(None, s)]
        in_flight = sum_terms(ite(m, e.n, V(0)) for e, m in mine)
        stale = sum_terms(ite(conj(m, neg(eq(e.fate, LIVE))), e.n, V(0)) for e, m in mine)
        a = s.asyncs[r] if s.asyncs else None
        idle = conj(eq(c.in_flight, 0), eq(c.stale, 0), neg(c.drop),
                    *([eq(a.placeholders, 0), eq(a.countdown, 0)] if a is not None else []))
        out += [z3.Implies(is_active(q.status, parked=True), conj(eq(c.in_flight, in_flight), eq(c.stale, stale))),
                z3.Implies(neg(is_active(q.status, parked=True)), idle)]
        out += [conj(le(0, e.n), le(e.n, layout.cfg.max_model_len)) for e, m in mine]
    return conj(out)


def _holds_table(layout: Layout, s: SState, r: int) -> Any:
    """Who may hold blocks: a RUNNING request, or a session between turns
    (WAITING or parked) that computed tokens (sessions.session_holds_blocks)."""
    q = s.reqs[r]
    between = conj(z3.BoolVal(is_resumable_slot(layout, r)), disj(eq(q.status, WAITING), eq(q.status, PARKED)),
                   lt(0, q.num_computed))
    return disj(eq(q.status, RUNNING), between)


def sa7_pool_ownership(layout: Layout, s: SState) -> Any:
    """S9's partition read with sessions: a block's reference count is the
    number of tables holding it, at most one, and it is in the free queue,
    once, exactly when nobody holds it; only a running request or a session
    between turns holds a table, which covers its computed tokens; without
    prefix caching no block caches a label."""
    bs, out = layout.cfg.block_size, []
    out += [conj(eq(lab, layout.none_label), eq(rank, 0)) for lab, rank in zip(s.pool.label, s.pool.copy_rank)]
    for b in range(layout.B):
        held = count(conj(lt(t, q.table_len), eq(x, b)) for q in s.reqs for t, x in enumerate(q.table))
        out += [eq(s.pool.ref[b], held), le(held, 1),
                eq(count(conj(lt(j, s.pool.free_len), eq(x, b)) for j, x in enumerate(s.pool.free)),
                   ite(eq(held, 0), V(1), V(0)))]
    for r, q in enumerate(s.reqs):
        out += [z3.Implies(lt(0, q.table_len), _holds_table(layout, s, r)),
                z3.Implies(_holds_table(layout, s, r), le(div_const(q.num_computed + (bs - 1), bs), q.table_len))]
    return conj(out)


def sa8_counters(layout: Layout, s: SState) -> Any:
    """S1 and S2 read with sessions: 0 <= num_computed <= the known tokens
    (and drafts, placeholders), 0 unless the request holds a table;
    0 <= num_output <= max_tokens, below it (and the tokens below
    max_model_len) while unfinished and not parked; no drafts without spec
    decode; every in-flight entry starts at >= 0, holds 1 to max_model_len
    tokens and ends within max_model_len."""
    from flightcheck.verification.z3.encoding.requests import max_tokens
    cfg, out = layout.cfg, []
    for r, q in enumerate(s.reqs):
        known = num_tokens(layout, q, r) + (s.asyncs[r].placeholders if s.asyncs else V(0))
        cap = max_tokens(layout, q, r)
        going = conj(is_active(q.status, parked=True), neg(eq(q.status, PARKED)))
        out += [le(0, q.num_computed), le(q.num_computed, known + q.num_drafts),
                z3.Implies(neg(_holds_table(layout, s, r)), eq(q.num_computed, 0)),
                le(0, q.num_output), le(q.num_output, cap),
                z3.Implies(going, conj(lt(q.num_output, cap), lt(num_tokens(layout, q, r), cfg.max_model_len)))]
        if not cfg.num_spec_tokens:
            out.append(eq(q.num_drafts, 0))
    for e, used in positions(None, s):
        mml = cfg.max_model_len          # each bounded alone first: the bit-vector sum cannot wrap
        bounds = [le(0, e.start), le(e.start, mml), le(1, e.n), le(e.n, mml), le(e.start + e.n, mml)]
        if not cfg.num_spec_tokens:
            bounds.append(eq(e.drafts, 0))
        out.append(z3.Implies(used, conj(bounds)))
    return conj(out)


def _turn_bounds(layout: Layout, r: int) -> tuple[list[int], list[int]]:
    """Request r's max_tokens in each turn (its prompt's, then each input's)
    and the longest prompt it can have in each (what the previous turn kept,
    at most its prompt and max_tokens less the last sampled token, within
    max_model_len, plus the input's new tokens)."""
    p, L = layout.model.prompts[r], layout.cfg.max_model_len
    caps, longest = [p.max_tokens], [p.prompt_len]
    for new, cap in session_inputs(layout, r):
        longest.append(min(longest[-1] + caps[-1], L) - 1 + new)
        caps.append(cap)
    return caps, longest


def sa9_turn_prompts(layout: Layout, s: SState) -> Any:
    """An unfinished request's max_tokens is its current turn's (the
    prompt's in turn 0, then its last input's), and its prompt is at least 1
    and at most the longest that turn can have (turns taken: the turn, less
    one while parked)."""
    if not s.sess:
        return z3.BoolVal(True)
    out = []
    for r, q in enumerate(s.reqs):
        x = q.session[0]
        caps, longest = _turn_bounds(layout, r)
        taken = x.turn - ite(eq(q.status, PARKED), V(1), V(0))
        ok = conj(le(0, taken), lt(taken, len(caps)), eq(x.max_tokens, pick([V(c) for c in caps], taken)),
                  le(1, x.prompt_len), le(x.prompt_len, pick([V(n) for n in longest], taken)))
        out.append(z3.Implies(is_active(q.status, parked=True), ok))
    return conj(out)


def sa10_stale_preemption_leaves_a_seat(layout: Layout, s: SState) -> Any:
    """sa10_stale_preemption_leaves_a_seat of spec/session_invariants.py, with at
    most two batches in flight (`sa10_applies`; true elsewhere): a request
    PREEMPTED with deliver-mode stale output in flight (stale > 0, not
    drop) has the batch queue full, no entry in flight outside the oldest
    batch, and running plus parked below max_num_seqs."""
    if not s.sess or not sa10_applies(layout.cfg) or not s.counters:
        return z3.BoolVal(True)
    out = []
    for r, (q, c) in enumerate(zip(s.reqs, s.counters)):
        later = [conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r))
                 for k, b in enumerate(s.batches) if k > 0 for j, e in enumerate(b.entries)]
        ok = conj(eq(s.num_batches, layout.K), *[neg(x) for x in later],
                  lt(s.running_len + parked_count(s), layout.cfg.max_num_seqs))
        out.append(z3.Implies(conj(eq(q.status, PREEMPTED), lt(0, c.stale), neg(c.drop)), ok))
    return conj(out)


SESSION_AUXILIARY = {
    "SA1_turns_not_ahead": sa1_turns_not_ahead,
    "SA2_session_queues": sa2_session_queues,
    "SA3_session_lengths": sa3_session_lengths,
    "SA4_turns_count_inputs": sa4_turns_count_inputs,
    "SA5_one_queue_per_request": sa5_one_queue_per_request,
    "SA6_session_counters": sa6_session_counters,
    "SA7_pool_ownership": sa7_pool_ownership,
    "SA8_counters": sa8_counters,
    "SA9_turn_prompts": sa9_turn_prompts,
    "SA10_stale_preemption_leaves_a_seat": sa10_stale_preemption_leaves_a_seat,
}

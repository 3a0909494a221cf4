"""Streaming sessions' path through `schedule`'s waiting loop in Z3
(spec.schedule._schedule_waiting with `Config.streaming_sessions`): the loop
walks `kv_holding` (sessions between turns that hold blocks) before
`waiting`, passes over a parked session (it keeps its place) and a deferred
resumption, admits a session's next turn from its computed tokens (no
prefix lookup: session models have prefix caching off), and admits nobody
while running requests plus parked sessions fill max_num_seqs.

As in kv_schedule.py, the passed-over requests of each queue are a prefix
of it, so two counters (`skipped` for `waiting`, `held_skipped` for
`kv_holding`) say where the loop stands. What it encodes is what the
session models need (session_state.refuse_unencoded_sessions names the
rest): no connector, no drafts, chunked prefill on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3
from flightcheck.verification.z3.encoding.allocation import candidate, snapshot_entry
from flightcheck.verification.z3.encoding.kv_schedule import LoopParts, _allocate, _whole_fits
from flightcheck.verification.z3.encoding.requests import put_flag, req_at, tokens_at, with_req
from flightcheck.verification.z3.encoding.sessions import has_free_seat
from flightcheck.verification.z3.encoding.state import PAD, PARKED, PREEMPTED, RUNNING, Layout
from flightcheck.verification.z3.encoding.terms import Builder, V, conj, disj, eq, ite, lt, merge, neg, pick, put, remove


def session_waiting_step(layout: Layout, builder: Builder, acc, phase: Any, threshold_on: Any, pads: Any,
                         parts: LoopParts):
    """One iteration of _schedule_waiting with sessions: pass the candidate
    over (parked, or a deferred resumption), admit it from its computed
    tokens, or stop the loop. `pads` is None: session models have no drafts."""
    BatchInProgress, _add, _clip, _is_resumption_deferred = parts.batch, parts.add, parts.clip, parts.deferred
    st = acc.state
    ss = st.sess[0]
    if isinstance(acc.held_skipped, int):               # the loop's first iteration: a literal
        acc = replace(acc, held_skipped=V(acc.held_skipped))
    from_holding = builder.let("from_holding", lt(acc.held_skipped, ss.holding_len))
    active = builder.let("active", conj(phase, neg(acc.done), lt(0, acc.budget), has_free_seat(layout, st),
                                        disj(from_holding, lt(acc.skipped, st.waiting_len))))
    r = builder.let("r", ite(from_holding, pick(ss.holding, acc.held_skipped, V(PAD)),
                             pick(st.waiting, acc.skipped, V(PAD))))
    q = builder.snap(req_at(st, r), "q")
    tokens = builder.let("tokens", tokens_at(layout, st, r))
    passed = disj(eq(q.status, PARKED), _is_resumption_deferred(layout, builder, st, r, q))
    skip = builder.let("skip", conj(active, passed))
    going = conj(active, neg(skip))
    computed = q.num_computed                           # a session's next turn: what it kept (else 0)
    num_new = builder.let("num_new", _clip(layout, acc.budget, computed, tokens - computed, True, threshold_on))
    fits, admitted = _allocate(layout, st, r, q, computed + num_new)
    admit = builder.let("admit", conj(going, neg(eq(num_new, 0)), _whole_fits(layout, st, q, tokens), fits))
    a = builder.snap(req_at(admitted, r), "a")
    entry, _ = snapshot_entry(layout, candidate(admitted, r, a, tokens), computed, num_new, computed, acc.budget)
    admitted.waiting, admitted.waiting_len = remove(st.waiting, st.waiting_len, r)
    held = admitted.sess[0]
    held.holding, held.holding_len = remove(ss.holding, ss.holding_len, r)
    admitted.running, admitted.running_len = put(st.running, st.running_len, r), st.running_len + 1
    admitted = with_req(admitted, r, status=V(RUNNING))
    entries, cnt, budget = _add(layout, acc, entry, admit)
    return BatchInProgress(merge(admit, admitted, st), budget, cnt, entries, acc.preempted,
                           put_flag(acc.admitted_from_preempted, r, eq(q.status, PREEMPTED), admit),
                           put_flag(acc.admitted, r, z3.BoolVal(True), admit), acc.any_preempted, acc.position,
                           disj(acc.done, conj(going, neg(admit))),
                           ite(conj(skip, neg(from_holding)), acc.skipped + 1, acc.skipped),
                           ite(conj(skip, from_holding), acc.held_skipped + 1, acc.held_skipped))

"""spec/sessions.py in Z3: the client's next input (`send_input`, labelled
`SendInput`), a session's stop (`stop_session`, where `complete_oldest`
would finish a resumable request), its next turn (`_take_input`), and the
hooks the other actions call on a session frame: the arrival that opens a
session, the finish that closes it, the seats parked sessions hold, the
turn `_launch` records on each entry and the shift of those turns when the
oldest batch returns.

Under the priority policy (encoded beside sessions only where every
session's priority is its own) an input also takes its arrival and a
stopped session is pushed at its rank: priority_sessions.py.

Each function is a no-op (or returns its input) on a frame without
sessions, so the hooks in actions.py and schedule.py leave every other
model's formulas as they were. A finish is passed in (`Finish`), as the
spec passes it: actions.py calls into this module, not the other way.
"""

from __future__ import annotations

from typing import Any, Callable

import z3
from flightcheck.verification.z3.encoding.priority_sessions import push_at_rank, stamp_input, take_arrival
from flightcheck.verification.z3.encoding.requests import async_at, at, counters_at, req_at, with_async, with_counters, with_req
from flightcheck.verification.z3.encoding.session_state import PAD, has_sessions, is_resumable_slot, session_inputs
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    LIVE,
    ORPHANED,
    PARKED,
    PREEMPTED,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    V,
    clone,
    conj,
    count,
    disj,
    eq,
    ite,
    le,
    lt,
    merge,
    neg,
    pick,
    put,
    remove,
)

Finish = Callable[..., SState]        # actions.finish(layout, s, r, status)


def resumable(layout: Layout, r: Any) -> Any:
    """Request r (a term, arrived) is a session: its model prompt has inputs."""
    return pick([z3.BoolVal(is_resumable_slot(layout, k)) for k in range(layout.N)], r, z3.BoolVal(False))


def parked_count(s: SState) -> Any:
    """vLLM's `num_waiting_for_streaming_input` (sessions.waiting_for_input)."""
    return count(eq(q.status, PARKED) for q in s.reqs)


def has_free_seat(layout: Layout, st: SState) -> Any:
    """spec.schedule._has_free_seat with sessions: running plus parked sessions below max_num_seqs."""
    seats = lt(st.running_len, layout.cfg.max_num_seqs)
    if layout.is_mutant("waiting_session_seat_freed"):
        return seats
    return conj(lt(st.running_len + parked_count(st), layout.cfg.max_num_seqs), seats)


def _input_at(layout: Layout, s: SState, r: Any, back: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(new tokens, max_tokens) of r's input at index `back(session fields)`
    of its model prompt's inputs (PAD values past them)."""
    def field(i: int):
        def of(q, k):
            xs = session_inputs(layout, k)
            return pick([V(x[i]) for x in xs], back(q.session[0], len(xs)), V(PAD)) if xs else V(PAD)
        return at(layout, s, r, of)
    return field(0), field(1)


def _next_to_send(layout: Layout, s: SState, r: Any) -> tuple[Any, Any]:
    """The input the client sends next: inputs[L - to_send]."""
    return _input_at(layout, s, r, lambda x, n: n - x.to_send)


def _first_queued(layout: Layout, s: SState, r: Any) -> tuple[Any, Any]:
    """queued_inputs[0]: inputs[L - to_send - queued]."""
    return _input_at(layout, s, r, lambda x, n: n - x.to_send - x.queued)


def _is_end(new: Any, cap: Any) -> Any:
    """sessions.END_OF_SESSION, (0, 0)."""
    return conj(eq(new, 0), eq(cap, 0))


def arrival_fields(layout: Layout, r: Any) -> dict:
    """sessions.open_session at `arrive`: r's model prompt and max_tokens, and
    every input still to send ({} without sessions)."""
    if not has_sessions(layout):
        return {}
    prompts = layout.model.prompts
    return dict(prompt_len=pick([V(p.prompt_len) for p in prompts], r),
                max_tokens=pick([V(p.max_tokens) for p in prompts], r),
                to_send=pick([V(len(session_inputs(layout, k))) for k in range(layout.N)], r))


def finish_session(st: SState, r: Any) -> SState:
    """sessions' part of spec.actions._finish: out of `kv_holding`, nothing
    left to send or queued (a frame without sessions is returned as it is)."""
    if not st.sess:
        return st
    out = clone(st)
    ss = out.sess[0]
    ss.holding, ss.holding_len = remove(st.sess[0].holding, st.sess[0].holding_len, r)
    return with_req(out, r, to_send=V(0), queued=V(0))


def send_guard(layout: Layout, s: SState, req: Any) -> Any:
    """sessions.is_send_enabled: r is an unfinished session with inputs left."""
    if not s.sess:
        return z3.BoolVal(False)
    unfinished = at(layout, s, req, lambda q, k: disj(*[eq(q.status, c) for c in (WAITING, RUNNING, PREEMPTED,
                                                                                    PARKED)]))
    left = at(layout, s, req, lambda q, k: lt(0, q.session[0].to_send))
    return conj(le(0, req), lt(req, layout.N), resumable(layout, req), unfinished, left)


def send_input(layout: Layout, s: SState, req: Any, finish: Finish) -> SState:
    """sessions.send_input: taken at once while r is parked (the end of the
    session finishes it), else queued for its next stop."""
    if not s.sess:
        return s
    q = req_at(s, req)
    x = q.session[0]
    new, cap = _next_to_send(layout, s, req)
    st = stamp_input(with_req(s, req, to_send=x.to_send - 1), req, neg(_is_end(new, cap)))   # priority: its arrival
    queued = with_req(st, req, queued=x.queued + 1)
    if layout.is_mutant("continuation_applied_while_running_pr52693"):
        applied = clone(st)
        applied.waiting, applied.waiting_len = put(st.waiting, st.waiting_len, req), st.waiting_len + 1
        applied = with_req(applied, req, prompt_len=x.prompt_len + q.num_output - 1 + new, num_output=V(0),
                           max_tokens=cap)
        queued = merge(conj(eq(q.status, RUNNING), neg(_is_end(new, cap))), applied, queued)
    taken = merge(_is_end(new, cap), finish(layout, st, req, V(F_ABORTED)),
                  _take_input(take_arrival(st, req), req, new, cap))
    return merge(eq(q.status, PARKED), taken, queued)


def _take_input(st: SState, r: Any, new: Any, cap: Any) -> SState:
    """sessions._take_input: the outputs but the last sampled one join the
    prompt with the new tokens; the turn starts with no output under the
    input's max_tokens, WAITING in the queue it already is in."""
    q = req_at(st, r)
    x = q.session[0]
    return with_req(st, r, prompt_len=x.prompt_len + q.num_output - 1 + new, num_output=V(0), max_tokens=cap,
                    status=V(WAITING))


def stop_session(layout: Layout, st: SState, r: Any, stop: Any, finish: Finish) -> SState:
    """sessions.stop_session: r stopped (`stop`); its turn's in-flight work is
    given up (superseded; its tokens in flight stale in drop mode; the
    placeholders taken back from num_computed), then a queued end of the
    session finishes it, a queued input starts its next turn, or it parks;
    either way it is re-enqueued (`_requeue`)."""
    q = req_at(st, r)
    x = q.session[0]
    out = clone(st)
    for b in out.batches:
        for e in b.entries:
            mine = conj(eq(e.req, r), disj(eq(e.fate, LIVE), eq(e.fate, ORPHANED)))
            e.fate = ite(mine, V(SUPERSEDED), e.fate)
    placeholders = async_at(st, r).placeholders if st.asyncs else V(0)
    computed = q.num_computed if layout.is_mutant("stop_keeps_optimistic_tokens_omni5183") else \
        q.num_computed - placeholders
    out = with_req(out, r, num_computed=computed, num_drafts=V(0), turn=x.turn + 1)
    c = counters_at(st, r)
    if layout.is_mutant("turn_output_not_dropped_pr52765"):
        out = with_counters(out, r, drop=c.drop, stale=c.stale)
    else:
        out = with_counters(out, r, drop=z3.BoolVal(True), stale=c.in_flight)
    out = with_async(out, r, placeholders=V(0))
    new, cap = _first_queued(layout, st, r)
    has_queued = lt(0, x.queued)
    dequeued = with_req(out, r, queued=x.queued - 1)
    ended = finish(layout, dequeued, r, stop)
    requeued = _requeue(layout, take_arrival(dequeued, r), r)     # pushed at the input's arrival
    parked = with_req(_requeue(layout, out, r), r, status=V(PARKED))
    return merge(conj(has_queued, _is_end(new, cap)), ended,
                 merge(has_queued, _take_input(requeued, r, new, cap), parked))


def _requeue(layout: Layout, st: SState, r: Any) -> SState:
    """sessions._requeue: out of `running` and the waiting queues, onto the
    tail of `kv_holding` if r computed tokens, else of `waiting` (at r's
    rank under the priority policy: priority_sessions.push_at_rank)."""
    out = clone(st)
    ss = out.sess[0]
    out.running, out.running_len = remove(st.running, st.running_len, r)
    waiting, waiting_len = remove(st.waiting, st.waiting_len, r)
    holding, holding_len = remove(st.sess[0].holding, st.sess[0].holding_len, r)
    holds = lt(0, req_at(st, r).num_computed)
    pushed_holding = push_at_rank(layout, st, holding, holding_len, r, put(holding, holding_len, r))
    pushed_waiting = push_at_rank(layout, st, waiting, waiting_len, r, put(waiting, waiting_len, r))
    ss.holding = [ite(holds, v, h) for v, h in zip(pushed_holding, holding)]
    ss.holding_len = ite(holds, holding_len + 1, holding_len)
    out.waiting = [ite(holds, w, v) for v, w in zip(pushed_waiting, waiting)]
    out.waiting_len = ite(holds, waiting_len, waiting_len + 1)
    return out


def session_launch(layout: Layout, st: SState, acc: Any, put_batch: Any) -> SState:
    """spec.launch.snapshot's `turn`: each entry of the batch `_launch` queues
    (at slot `num_batches` of `st`, before it is counted) records its
    request's turn (a frame without sessions is returned as it is)."""
    if not st.sess:
        return st
    row = [ite(lt(j, acc.count), at(layout, st, e.req, lambda q, k: q.session[0].turn), V(0))
           for j, e in enumerate(acc.entries)]
    out = clone(st)
    ss = out.sess[0]
    ss.entry_turn = [[ite(conj(put_batch, eq(st.num_batches, k)), new, old) for new, old in zip(row, slots)]
                     for k, slots in enumerate(ss.entry_turn)]
    return out


def shift_session_entries(st: SState) -> SState:
    """The oldest batch's entry turns leave with it (complete_oldest)."""
    if not st.sess:
        return st
    out = clone(st)
    ss = out.sess[0]
    ss.entry_turn = [list(row) for row in ss.entry_turn[1:]] + [[V(0)] * len(ss.entry_turn[0])]
    return out


__all__ = ["arrival_fields", "finish_session", "has_free_seat", "parked_count", "resumable",
           "send_guard", "send_input", "session_launch", "shift_session_entries", "stop_session"]

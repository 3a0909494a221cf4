"""The priority policy beside streaming sessions in Z3: SS5 as a formula of
a frame, clause for clause after spec/session_invariants.py's predicate, and
the auxiliary invariant on the arrival order's stamps that keeps the
encoding's well-formedness inductive (priority_sessions.py takes a stamp
when a session takes an input). Each is True on a frame without the policy
or without sessions (`SState.prio` or `SState.sess` is []).

SS5's "every queued request's key" reads the request's place (its first
index in the arrival order: priority_state.SPrio) as PR1 does; its order
compares (priority, place) of neighbours, the spec's `keys == sorted(keys)`,
on `waiting` and on `kv_holding`.
"""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.actions import is_active
from flightcheck.verification.z3.encoding.priority_state import PAD, place_of, rank_below
from flightcheck.verification.z3.encoding.session_state import session_inputs
from flightcheck.verification.z3.encoding.state import Layout, SState
from flightcheck.verification.z3.encoding.terms import conj, count, eq, le, lt, neg

TRUE = z3.BoolVal(True)


def _in_rank_order(layout: Layout, s: SState, xs: list, n: Any) -> list:
    out = [z3.Implies(lt(j, n), neg(eq(place_of(s, x), PAD))) for j, x in enumerate(xs)]
    return out + [z3.Implies(lt(j + 1, n), neg(rank_below(layout, s, xs[j + 1], xs[j]))) for j in range(len(xs) - 1)]


def ss5_session_queues_in_priority_order(layout: Layout, s: SState) -> Any:
    """SS5: under the priority policy, `waiting` and `kv_holding` (the queues
    a session waits in) each in (priority, arrival) order: every queued
    request's arrival recorded, each key <= the next."""
    if not s.prio or not s.sess:
        return TRUE
    ss = s.sess[0]
    return conj(_in_rank_order(layout, s, s.waiting, s.waiting_len) + _in_rank_order(layout, s, ss.holding,
                                                                                        ss.holding_len))


def _queued_inputs_not_the_end(layout: Layout, s: SState, r: int) -> Any:
    """How many of r's queued inputs are not the end of the session: the
    inputs at indices L - to_send - queued .. L - to_send - 1 of its model
    prompt's (session_state.SSessionReq)."""
    inputs = session_inputs(layout, r)
    x, n = s.reqs[r].session[0], len(inputs)
    return count(conj(le(n - x.to_send - x.queued, i), lt(i, n - x.to_send))
                 for i, sent in enumerate(inputs) if sent != (0, 0))


def ps1_stamps_are_queued_inputs(layout: Layout, s: SState) -> Any:
    """PS1 (auxiliary): an unfinished session holds one stamp in the arrival
    order per queued input that is not the end of the session (stamped when
    sent, given up when taken: spec/sessions.py `_stamp_input`,
    `_take_input`); a session waiting for input has none."""
    if not s.prio or not s.sess:
        return TRUE
    out = []
    for r, (q, row) in enumerate(zip(s.reqs, s.prio[0].stamps)):
        if row:
            stamped = count(neg(eq(x, PAD)) for x in row)
            out.append(z3.Implies(is_active(q.status, parked=True),
                                  eq(stamped, _queued_inputs_not_the_end(layout, s, r))))
    return conj(out)


PRIORITY_SESSION_FORMULAS = {"SS5_session_queues_in_priority_order": ss5_session_queues_in_priority_order}
PRIORITY_SESSION_AUXILIARY = {"PS1_stamps_are_queued_inputs": ps1_stamps_are_queued_inputs}

"""spec/sessions.py's arrival order under the priority policy, in Z3: the
stamp an input takes when the client sends it (`_stamp_input`), the first
place a session gives up when it takes the input (`_take_input`), and the
push of a stopped session at its rank (`_requeue`'s `_in_rank_order`).

Each is the identity on a frame without the policy (`SState.prio` is [])
or without sessions, so every FCFS session model and every priority model
without sessions keeps its formulas. The policy beside sessions is encoded
only where every session's priority is its own
(priority_state.sessions_keys_distinct; the module docstring there says
why: an input re-keys a heap in place, and vLLM does not re-sort it).

The arrival order is each request's place and, for a session, its stamps
(priority_state.SPrio): a stamp is the next index (`num_arrivals`); taking
an input drops the session's place, so every later index moves down by one
and the session's first stamp becomes its place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightcheck.verification.z3.encoding.priority_state import PAD, insert_at_place, place_of
from flightcheck.verification.z3.encoding.terms import V, clone, conj, eq, ite, lt, neg


def _ranked(st) -> bool:
    return bool(st.prio) and bool(st.sess)


def stamp_input(st, r: Any, when: Any):
    """sessions._stamp_input: r's input (not the end of the session, `when`)
    is stamped with the next index, in r's first free stamp slot."""
    if not _ranked(st):
        return st
    p = st.prio[0]
    stamps = []
    for k, row in enumerate(p.stamps):
        free = [eq(x, PAD) for x in row]        # the first free slot: free, every slot before it used
        first = [conj(f, *[neg(g) for g in free[:i]]) for i, f in enumerate(free)]
        stamps.append([ite(conj(when, eq(r, k), c), p.num_arrivals, x) for c, x in zip(first, row)])
    out = clone(st)
    out.prio = [replace(p, stamps=stamps, num_arrivals=ite(when, p.num_arrivals + 1, p.num_arrivals))]
    return out


def take_arrival(st, r: Any):
    """sessions._take_input's arrival: r's first place leaves the order (the
    later indices move down by one) and its first stamp becomes its place."""
    if not _ranked(st):
        return st
    p = st.prio[0]
    gone = place_of(st, r)

    def down(x: Any) -> Any:
        return ite(conj(neg(eq(x, PAD)), lt(gone, x)), x - 1, x)

    place, stamps = [], []
    for k, (x, row) in enumerate(zip(p.place, p.stamps)):
        moved = [down(y) for y in row]
        if not row:                             # not a session: never takes an input
            place.append(down(x))
            stamps.append(moved)
            continue
        mine = eq(r, k)
        place.append(ite(mine, moved[0], down(x)))
        stamps.append([ite(mine, nxt, y) for y, nxt in zip(moved, moved[1:] + [V(PAD)])])
    out = clone(st)
    out.prio = [replace(p, place=place, stamps=stamps, num_arrivals=p.num_arrivals - 1)]
    return out


def push_at_rank(layout, st, xs: list, length: Any, r: Any, tail: list) -> list:
    """A stopped session r pushed onto a queue (xs[:length], r not in it):
    at its rank's place under the policy beside sessions (spec sorts the
    queue, `_in_rank_order`; on a queue in rank order, SS5, the two agree),
    else `tail` (the FCFS push, xs with r at `length`)."""
    if not _ranked(st):
        return tail
    return insert_at_place(layout, st, xs, length, r)


__all__ = ["push_at_rank", "stamp_input", "take_arrival"]

"""Reading and writing one request of a symbolic state whose index is itself
a term (the request at running[i], at the head of waiting, of a batch entry),
and the derived quantities of spec/state.py (`num_tokens`, `content_label`).
"""

from __future__ import annotations

from typing import Any

from flightcheck.verification.z3.encoding.state import (
    NEW,
    PAD,
    Layout,
    SAsync,
    SCounters,
    SReq,
    SState,
)
from flightcheck.verification.z3.encoding.session_state import SSessionReq
from flightcheck.verification.z3.encoding.terms import V, eq, ite, pick

SESSION_REQ_FIELDS = ("prompt_len", "max_tokens", "turn", "to_send", "queued")


def prompt_len(layout: Layout, q: SReq, k: int) -> Any:
    """Request k's prompt length: the model's once it has arrived, 0 before
    (with streaming sessions a variable: a session's next input changes it)."""
    if q.session:
        return q.session[0].prompt_len
    return ite(eq(q.status, NEW), V(0), V(layout.prompt_len(k)))


def max_tokens(layout: Layout, q: SReq, k: int) -> Any:
    if q.session:
        return q.session[0].max_tokens
    return ite(eq(q.status, NEW), V(0), V(layout.max_tokens(k)))


def num_tokens(layout: Layout, q: SReq, k: int) -> Any:
    """Known tokens of request k: prompt plus sampled outputs."""
    return prompt_len(layout, q, k) + q.num_output


def content_label(layout: Layout, q: SReq, k: int, i: int) -> Any:
    """spec.state.content_label(k, i): its prompt label if block i is all prompt."""
    unique = -(1 + k + layout.N * i)
    return ite(eq(q.status, NEW), V(unique), V(layout.content[k][i]))


def req_at(s: SState, r: Any) -> SReq:
    """The fields of request r (a term)."""
    qs = s.reqs
    return SReq(pick([q.status for q in qs], r), pick([q.num_output for q in qs], r),
                pick([q.num_computed for q in qs], r), pick([q.num_drafts for q in qs], r),
                pick([q.table_len for q in qs], r),
                [pick([q.table[t] for q in qs], r) for t in range(len(qs[0].table))],
                [SSessionReq(*(pick([getattr(q.session[0], f) for q in qs], r) for f in SESSION_REQ_FIELDS))]
                if qs[0].session else [])


def at(layout: Layout, s: SState, r: Any, fn) -> Any:
    """fn(request k, k) for the request r (a term)."""
    return pick([fn(q, k) for k, q in enumerate(s.reqs)], r)


def tokens_at(layout: Layout, s: SState, r: Any) -> Any:
    return at(layout, s, r, lambda q, k: num_tokens(layout, q, k))


def label_at(layout: Layout, s: SState, r: Any, i: int) -> Any:
    return at(layout, s, r, lambda q, k: content_label(layout, q, k, i))


def with_req(s: SState, r: Any, when: Any = True, **fields: Any) -> SState:
    """s with the given fields of request r (a term) set, if `when`. Only
    those fields get new terms: the others stay the very same terms, so the
    solver sees at once that an action leaves them alone."""
    from flightcheck.verification.z3.encoding.terms import conj
    out = SState(**{f: getattr(s, f) for f in s.__dataclass_fields__})
    reqs = []
    for k, q in enumerate(s.reqs):
        c = conj(when, eq(r, k))
        new = SReq(q.status, q.num_output, q.num_computed, q.num_drafts, q.table_len, list(q.table),
                   [SSessionReq(*(getattr(q.session[0], f) for f in SESSION_REQ_FIELDS))] if q.session else [])
        for name, value in fields.items():
            if name in SESSION_REQ_FIELDS:          # a session field (session_state.SSessionReq)
                setattr(new.session[0], name, ite(c, value, getattr(q.session[0], name)))
                continue
            old = getattr(q, name)
            if isinstance(old, list):
                setattr(new, name, [ite(c, v, o) for v, o in zip(value, old)])
            else:
                setattr(new, name, ite(c, value, old))
        reqs.append(new)
    out.reqs = reqs
    return out


def counters_at(s: SState, r: Any) -> SCounters:
    """Request r's stale-output counters (a term r; the frame must have them)."""
    cs = s.counters
    return SCounters(pick([c.in_flight for c in cs], r), pick([c.stale for c in cs], r),
                     pick([c.drop for c in cs], r))


def with_counters(s: SState, r: Any, when: Any = True, **fields: Any) -> SState:
    """s with the given counters of request r (a term) set, if `when`; a frame
    without counters (0.8.x) is returned as it is."""
    from flightcheck.verification.z3.encoding.terms import conj
    if not s.counters:
        return s
    out = SState(**{f: getattr(s, f) for f in s.__dataclass_fields__})
    counters = []
    for k, c in enumerate(s.counters):
        here = conj(when, eq(r, k))
        counters.append(SCounters(*(ite(here, fields[name], getattr(c, name)) if name in fields else getattr(c, name)
                                    for name in ("in_flight", "stale", "drop"))))
    out.counters = counters
    return out


def async_at(s: SState, r: Any) -> SAsync:
    """Request r's placeholders and decode countdown (a term r; the frame must have them)."""
    return SAsync(pick([a.placeholders for a in s.asyncs], r), pick([a.countdown for a in s.asyncs], r))


def with_async(s: SState, r: Any, when: Any = True, **fields: Any) -> SState:
    """s with the given async fields (placeholders, countdown) of request r (a
    term) set, if `when`; a frame without them (sync profiles) is returned as it is."""
    from flightcheck.verification.z3.encoding.terms import conj
    if not s.asyncs:
        return s
    out = SState(**{f: getattr(s, f) for f in s.__dataclass_fields__})
    out.asyncs = [SAsync(*(ite(conj(when, eq(r, k)), fields[name], getattr(a, name)) if name in fields
                           else getattr(a, name) for name in ("placeholders", "countdown")))
                  for k, a in enumerate(s.asyncs)]
    return out


def put_flag(flags: list, r: Any, value: Any, when: Any = True) -> list:
    from flightcheck.verification.z3.encoding.terms import conj
    return [ite(conj(when, eq(r, k)), value, f) for k, f in enumerate(flags)]


def empty_table(layout: Layout) -> list:
    return [V(PAD)] * layout.T

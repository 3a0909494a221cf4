"""The priority policy's part of a Z3 frame (spec/priority.py): the order of
arrival `State.arrivals`, held as each request's place in it (PAD before
it arrives) and the number of arrivals, and each request's priority, a
constant of its prompt (`Prompt.priority`, given at arrival like its
prompt length, so it needs no variable).

A frame has this part only under `Config.scheduling_policy == "priority"`;
every other frame is as it was (`SState.prio` is []), so no state count,
proof or cross-check of an FCFS model changes.

Places instead of the spec's tuple keep the rank comparison local:
`rank(a) < rank(b)` reads two places, not a search of the tuple. The two
are one bijection on well-formed frames (`prio_well_formed`: the places of
the arrived requests are 0 .. num_arrivals - 1, each once).

With a KV connector `kv_holding` is a heap too (`Profile.priority_orders_kv_holding`):
a parked load joins it at its rank's place (priority.py `join_kv_holding`),
PR4 orders it (priority_invariants.py). `async_kv_waiting`'s ranked head
(`priority_orders_async_kv`) needs vLLM 0.34's load limit, which the
connector's encoding refuses (kv_state.refuse_unencoded_connector).

What the encoding of the policy leaves out is refused, not approximated
(`refuse_unencoded_priority`): a connector whose `kv_holding` is not ranked
under the policy, asynchronous scheduling and the other request states of
issue 39 (structured output, streaming sessions), none cross-checked with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec import State, Status
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, count, disj, eq, ite, le, lt, neg, pick, var

PAD = -1


class PriorityNotRepresentable(NotRepresentable):
    """A concrete state the priority part cannot hold."""


def has_priority(layout) -> bool:
    """Whether the model schedules by priority (the frame has an `SPrio`)."""
    return layout.cfg.scheduling_policy == "priority"


def refuse_unencoded_priority(model) -> None:
    """The combinations the encoding of the priority policy leaves to the
    explicit search: a model that needs one is refused."""
    cfg = model.cfg
    if cfg.scheduling_policy != "priority":
        return
    why = []
    if cfg.kv_connector is not None and not cfg.rules.priority_orders_kv_holding:
        why.append("a KV connector whose kv_holding is not a priority heap")
    if cfg.rules.output_placeholders:
        why.append("asynchronous scheduling")
    if cfg.streaming_sessions or cfg.structured_output:
        why.append("streaming sessions or structured output")
    if not cfg.continue_prefill:
        why.append("one batch per request")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of the priority policy leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


@dataclass
class SPrio:
    place: list               # per request: its index in State.arrivals, PAD before it arrives
    num_arrivals: Any


def prio_frame(layout, tag: str) -> list:
    """[SPrio of fresh variables], or [] under FCFS."""
    if not has_priority(layout):
        return []
    return [SPrio([var(f"prio.place[{r}]@{tag}") for r in range(layout.N)], var(f"prio.num_arrivals@{tag}"))]


def priority_of(layout, r: int, arrived: bool) -> int:
    """Request r's `Request.priority`: its prompt's once it has arrived under
    the policy (spec.priority.arrive_with_priority), else 0."""
    return layout.model.prompts[r].priority if arrived and has_priority(layout) else 0


def prio_constant(layout, state: State) -> list:
    """The priority part of a concrete state, as literals ([] under FCFS)."""
    for r, q in enumerate(state.requests):
        if q.priority != priority_of(layout, r, q.status is not Status.NEW):
            raise PriorityNotRepresentable(f"request {r} has a priority other than its model prompt's")
    if not has_priority(layout):
        return []
    arrivals = state.arrivals
    if len(set(arrivals)) != len(arrivals) or any(not 0 <= r < layout.N for r in arrivals):
        raise PriorityNotRepresentable(f"arrivals {arrivals} repeat a request or name an unknown one")
    return [SPrio([V(arrivals.index(r)) if r in arrivals else V(PAD) for r in range(layout.N)], V(len(arrivals)))]


def prio_request_fields(layout, r: int, arrived: bool) -> dict:
    """Request r's priority as decoded ({} under FCFS: the spec's default 0)."""
    return dict(priority=priority_of(layout, r, arrived)) if has_priority(layout) else {}


def prio_state_fields(prio: list, iv) -> dict:
    """`State.arrivals` decoded from the places ({} under FCFS)."""
    if not prio:
        return {}
    places = {r: iv(x) for r, x in enumerate(prio[0].place) if iv(x) != PAD}
    return dict(arrivals=tuple(sorted(places, key=places.__getitem__)))


def prio_well_formed(layout, s) -> Any:
    """The places of the arrived requests are 0 .. num_arrivals - 1, each
    once; every other place is PAD (True under FCFS)."""
    if not s.prio:
        return z3.BoolVal(True)
    p, out = s.prio[0], []
    out += [le(0, p.num_arrivals), le(p.num_arrivals, layout.N),
            eq(count([neg(eq(x, PAD)) for x in p.place]), p.num_arrivals)]
    for a, x in enumerate(p.place):
        out.append(disj(eq(x, PAD), conj(le(0, x), lt(x, p.num_arrivals))))
        out += [disj(eq(x, PAD), neg(eq(x, y))) for y in p.place[a + 1:]]
    return conj(out)


# --- the rank (`Request.__lt__`) ---------------------------------------------------

def prompt_priority(layout, r: Any) -> Any:
    """The priority of request r (a term): its prompt's."""
    return pick([V(p.priority) for p in layout.model.prompts], r, V(0))


def place_of(s, r: Any) -> Any:
    return pick(s.prio[0].place, r, V(PAD))


def rank_below(layout, s, a: Any, b: Any) -> Any:
    """rank(a) < rank(b): lower priority value first, then earlier arrival."""
    pa, pb = prompt_priority(layout, a), prompt_priority(layout, b)
    return disj(lt(pa, pb), conj(eq(pa, pb), lt(place_of(s, a), place_of(s, b))))


def insert_at_place(layout, s, xs: list, length: Any, r: Any) -> list:
    """xs[:length] (in rank order) with r inserted at its place, PAD-padded:
    the heap push of `PriorityRequestQueue` (spec.priority.in_priority_order
    sorts the whole queue; on a queue in rank order, PR1, the two agree)."""
    place = count([conj(lt(j, length), rank_below(layout, s, x, r)) for j, x in enumerate(xs)])
    out = []
    for j in range(len(xs)):
        shifted = xs[j - 1] if j > 0 else V(PAD)
        out.append(ite(lt(j, place), xs[j], ite(eq(j, place), r, ite(le(j, length), shifted, V(PAD)))))
    return out

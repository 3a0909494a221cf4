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

Beside streaming sessions (spec/sessions.py) a session's input is stamped
when the client sends it, a later place of the session in `State.arrivals`
(the tuple then names it twice), and taking the input drops its first
place (`_take_input`): its rank moves to the stamp's. Each session request
has one stamp slot per input of its model prompt that is not the end of
the session (`SPrio.stamps`, ascending after its place, PAD-padded; other
requests have none), so the places and stamps together are the tuple.
An input taken while the session waits in a queue changes its rank there
(vLLM re-keys its heap entry in place), which leaves the heap out of order
when another request of the session's priority sits beside it (SS5; the
finding of docs/request-states.md): the encoding's push inserts at a rank's
place where the spec sorts the queue, the two agreeing only on queues in
order. So the policy beside sessions is encoded only where every session's
priority is its own (no other prompt of the model has it): the rank of a
session against any other request is then its priority's, which an input
never changes, and two other requests keep their relative places, so no
queue leaves rank order (`sessions_keys_distinct`).

What the encoding of the policy leaves out is refused, not approximated
(`refuse_unencoded_priority`): a connector whose `kv_holding` is not ranked
under the policy, asynchronous scheduling, structured output, and sessions
whose priority another request shares (above), none cross-checked with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    if cfg.structured_output:
        why.append("structured output")
    if cfg.streaming_sessions and not sessions_keys_distinct(model):
        why.append("streaming sessions whose priority another request shares (an input re-keys a heap in place: SS5)")
    if not cfg.continue_prefill:
        why.append("one batch per request")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of the priority policy leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


def sessions_keys_distinct(model) -> bool:
    """Every session's priority is its own: no other prompt of the model has
    it (module docstring: then no input reorders a queue)."""
    prios = [p.priority for p in model.prompts]
    return all(prios.count(p.priority) == 1 for p in model.prompts if p.session)


def stamp_slots(layout, r: int) -> int:
    """How many later places request r may hold in the arrival order: its
    session's inputs that are not the end of the session (0 without sessions)."""
    if not layout.cfg.streaming_sessions:
        return 0
    return sum(1 for x in layout.model.prompts[r].session if x != (0, 0))


@dataclass
class SPrio:
    place: list               # per request: its first index in State.arrivals, PAD before it arrives
    num_arrivals: Any
    stamps: list = field(default_factory=list)    # per request: its later indices (sessions' stamped inputs), PAD-padded


def prio_frame(layout, tag: str) -> list:
    """[SPrio of fresh variables], or [] under FCFS."""
    if not has_priority(layout):
        return []
    return [SPrio([var(f"prio.place[{r}]@{tag}") for r in range(layout.N)], var(f"prio.num_arrivals@{tag}"),
                  [[var(f"prio.stamp[{r}][{i}]@{tag}") for i in range(stamp_slots(layout, r))]
                   for r in range(layout.N)])]


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
    if any(not 0 <= r < layout.N or arrivals.count(r) > 1 + stamp_slots(layout, r) for r in arrivals):
        raise PriorityNotRepresentable(f"arrivals {arrivals} repeat a request past its stamps or name an unknown one")
    at = {r: [j for j, x in enumerate(arrivals) if x == r] for r in range(layout.N)}
    stamps = [[V(j) for j in at[r][1:]] + [V(PAD)] * (stamp_slots(layout, r) - len(at[r][1:])) for r in range(layout.N)]
    return [SPrio([V(at[r][0]) if at[r] else V(PAD) for r in range(layout.N)], V(len(arrivals)), stamps)]


def prio_request_fields(layout, r: int, arrived: bool) -> dict:
    """Request r's priority as decoded ({} under FCFS: the spec's default 0)."""
    return dict(priority=priority_of(layout, r, arrived)) if has_priority(layout) else {}


def prio_state_fields(prio: list, iv) -> dict:
    """`State.arrivals` decoded from the places ({} under FCFS)."""
    if not prio:
        return {}
    p = prio[0]
    places = [(iv(x), r) for r, x in enumerate(p.place) if iv(x) != PAD]
    places += [(iv(x), r) for r, row in enumerate(p.stamps) for x in row if iv(x) != PAD]
    return dict(arrivals=tuple(r for _, r in sorted(places)))


def prio_well_formed(layout, s) -> Any:
    """The places (and stamps) of the arrived requests are 0 .. num_arrivals
    - 1, each once; every other place is PAD (True under FCFS). A request's
    stamps follow its place in ascending order, the unused ones last."""
    if not s.prio:
        return z3.BoolVal(True)
    p, out = s.prio[0], []
    stamps = [x for row in p.stamps for x in row]
    every = p.place + stamps
    out += [le(0, p.num_arrivals), le(p.num_arrivals, layout.N + len(stamps)),
            eq(count([neg(eq(x, PAD)) for x in every]), p.num_arrivals)]
    for a, x in enumerate(every):
        out.append(disj(eq(x, PAD), conj(le(0, x), lt(x, p.num_arrivals))))
        out += [disj(eq(x, PAD), neg(eq(x, y))) for y in every[a + 1:]]
    for x, row in zip(p.place, p.stamps):
        for before, y in zip([x] + row, row):
            out.append(disj(eq(y, PAD), conj(neg(eq(before, PAD)), lt(before, y))))
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

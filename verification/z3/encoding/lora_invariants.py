"""LoRA's cap and the prompt-logprobs limit: their properties in Z3
(spec/lora.py, spec/lora_properties.py), clause for clause after the spec's
predicates, and the auxiliary invariants LORAA1-LORAA3 that make LORA1
inductive, with their concrete predicates beside them (formulas and predicates are compared
on the models' states and steps, perturbed and mutated ones included:
tests/test_z3_lora.py).

* LORA1 (a state invariant): the running requests, and each batch in
  flight, hold at most `max_loras` distinct LoRAs.
* LORA2 (a step): each request the cap holds for the whole call stays
  waiting, and the call admits what a second `schedule` of the same frame
  without that request in the waiting queue admits (`alone_schedule`: the
  encoding's whole schedule a second time, as CAD2's second computation is).
* PL1 (a step): an entry of a waiting prompt-logprobs request starts at
  token 0 and counts nothing cached (the encoding's batch keeps no `cached`:
  a waiting-loop entry's start is the counter it was admitted with, its
  prefix hit, so the two clauses are one).

Where the encoding's batch holds less than the spec's `ScheduledEntry`,
LORA2 compares (request, tokens, start) for (request, tokens, cached): the
same on a waiting-loop entry, for the reason above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import z3
from flightcheck.spec import State, Status
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.lora import (
    NEW,
    among,
    has_lora_cap,
    holds_lora,
    lora_count,
    reads_prefix_cache,
)
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.state import PAD, PREEMPTED, RUNNING, WAITING, Layout, SState, initial
from flightcheck.verification.z3.encoding.terms import (
    V,
    Builder,
    clone,
    conj,
    count,
    disj,
    eq,
    ite,
    le,
    lt,
    member,
    neg,
)

# --- LORA1 and its auxiliary invariant


def lora1_loras_within_cap(layout: Layout, s: SState) -> Any:
    """LORA1: the running requests hold at most max_loras distinct LoRAs, and
    so does every batch in flight (True without a cap)."""
    if not has_lora_cap(layout):
        return z3.BoolVal(True)
    cap = layout.cfg.max_loras
    out = [le(lora_count(layout, s, s.running, s.running_len), cap)]
    for k, b in enumerate(s.batches):
        out.append(z3.Implies(lt(k, s.num_batches), le(lora_count(layout, s, [e.req for e in b.entries], b.length),
                                                       cap)))
    return conj(out)


def loraa1_holders_have_arrived(layout: Layout, s: SState) -> Any:
    """LORAA1: every request waiting or running, and every request with an
    entry in flight, has arrived (a NEW request holds no LoRA: were one
    among them, its arrival or admission would add a LoRA behind the cap's
    back)."""
    queued = [(x, lt(j, n)) for xs, n in ((s.waiting, s.waiting_len), (s.running, s.running_len))
              for j, x in enumerate(xs)]
    queued += [(e.req, conj(lt(k, s.num_batches), lt(j, b.length)))
               for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]
    return conj([z3.Implies(conj(used, eq(x, r)), neg(eq(q.status, NEW))) for x, used in queued
                 for r, q in enumerate(s.reqs)])


def loraa1_holds(state: State) -> bool:
    holders = [*state.waiting, *state.running, *(e.req for b in state.in_flight for e in b)]
    return all(state.requests[r].status is not Status.NEW for r in holders)


def loraa2_well_formed_but_the_blocks(layout: Layout, s: SState) -> Any:
    """LORAA2: WF_encoding's clauses on everything but the blocks (the pool
    taken as the initial one's and every table as empty, whose clauses fold
    to True): statuses, queues and batches in range and padded (priority's
    PA2, on every model; WF itself needs the pool's invariants to be inductive)."""
    no_tables = [replace(q, table_len=V(0), table=[V(PAD)] * len(q.table)) for q in s.reqs]
    return well_formed(layout, replace(s, pool=initial(layout).pool, reqs=no_tables))


def loraa3_queues_match_statuses(layout: Layout, s: SState) -> Any:
    """LORAA3: no request twice in `waiting` and `running` together; a
    request is in `waiting` iff WAITING or PREEMPTED, in `running` iff
    RUNNING (priority's PA3, on every model)."""
    slots = [(x, lt(j, n)) for xs, n in ((s.waiting, s.waiting_len), (s.running, s.running_len))
             for j, x in enumerate(xs)]
    out = [z3.Implies(conj(u, v), neg(eq(x, y))) for i, (x, u) in enumerate(slots) for y, v in slots[i + 1:]]
    for r, q in enumerate(s.reqs):
        out.append(member(V(r), s.waiting, s.waiting_len) == disj(eq(q.status, WAITING), eq(q.status, PREEMPTED)))
        out.append(member(V(r), s.running, s.running_len) == eq(q.status, RUNNING))
    return conj(out)


def loraa3_holds(state: State) -> bool:
    queued = [*state.waiting, *state.running]
    return len(set(queued)) == len(queued) and all(
        (r in state.waiting) == (q.status in (Status.WAITING, Status.PREEMPTED))
        and (r in state.running) == (q.status is Status.RUNNING) for r, q in enumerate(state.requests))


LORA_FORMULAS: dict[str, Callable[[Layout, SState], Any]] = {"LORA1_loras_within_cap": lora1_loras_within_cap}
LORA_AUXILIARY: dict[str, Callable[[Layout, SState], Any]] = {
    "LORAA1_holders_have_arrived": loraa1_holders_have_arrived,
    "LORAA2_well_formed_but_the_blocks": loraa2_well_formed_but_the_blocks,
    "LORAA3_queues_match_statuses": loraa3_queues_match_statuses}
# The concrete predicates of the auxiliary invariants (LORAA2 is WF's: the decoding's own checks).
LORA_AUXILIARY_PREDICATES: dict[str, Callable[[State, Any], bool]] = {
    "LORAA1_holders_have_arrived": lambda s, cfg: loraa1_holds(s),
    "LORAA3_queues_match_statuses": lambda s, cfg: loraa3_holds(s)}

# --- LORA2 and PL1 on one step


def _scheduled(st) -> Any:
    """The step schedules (spec transitions._on_schedule: a Schedule whose `schedule` is not None)."""
    return conj(eq(st.choices.act, SCHEDULE), st.sched.result)


def held_request(layout: Layout, s: SState, w: int) -> Any:
    """w is among spec.lora.held_requests(s): the running requests hold
    max_loras LoRAs or more, and w waits with a LoRA none of them holds."""
    full = le(layout.cfg.max_loras, lora_count(layout, s, s.running, s.running_len))
    lora = layout.model.prompts[w].lora
    return conj(full, member(V(w), s.waiting, s.waiting_len), holds_lora(layout, s, lora, V(w)),
                neg(among(layout, s, lora, s.running, s.running_len)))


def without_waiting(layout: Layout, s: SState, w: int) -> SState:
    """spec.lora.without_waiting: frame s with w left out of the waiting queue (every slot of it)."""
    keep = [conj(lt(j, s.waiting_len), neg(eq(x, w))) for j, x in enumerate(s.waiting)]
    place = [count(keep[:j]) for j in range(len(keep))]
    out = clone(s)
    out.waiting = []
    for slot in range(len(s.waiting)):
        v = V(PAD)
        for j in range(slot, len(s.waiting)):
            v = ite(conj(keep[j], eq(place[j], slot)), s.waiting[j], v)
        out.waiting.append(v)
    out.waiting_len = count(keep)
    return out


def alone_schedule(layout: Layout, s: SState, w: int) -> tuple[Any, list]:
    """spec `schedule(without_waiting(before, w))` on frame s, and the
    definitions of its auxiliary variables (named after the frame and w)."""
    from flightcheck.verification.z3.encoding.schedule import schedule
    builder = Builder(f"lora2[{w}][{s.num_batches}]")
    return schedule(layout, builder, without_waiting(layout, s, w)), builder.defs


def _admitted(before: SState, sch) -> tuple[Any, list]:
    """spec lora_properties._admitted: how many entries of `sch` are of
    requests waiting in `before`, and the k-th of them as (request, tokens,
    start), k < E (PAD past the count)."""
    flags = [conj(lt(j, sch.count), member(e.req, before.waiting, before.waiting_len))
             for j, e in enumerate(sch.entries)]
    out = []
    for k in range(len(sch.entries)):
        picked = (V(-1), V(0), V(0))
        for j in range(len(sch.entries) - 1, k - 1, -1):
            e, nth = sch.entries[j], conj(flags[j], eq(count(flags[:j]), k))
            picked = tuple(ite(nth, x, y) for x, y in zip((e.req, e.n, e.start), picked))
        out.append(picked)
    return count(flags), out


def lora2_held_request_is_passed_over(layout: Layout, st) -> Any:
    """LORA2: a waiting request whose LoRA the cap cannot take is passed
    over, not a stop: it stays waiting, and the call admits exactly what it
    admits with that request out of the queue (a clause per request with a
    LoRA, the only ones the cap can hold). The second schedules'
    definitions are the antecedent: they fix their auxiliary variables."""
    if not has_lora_cap(layout):
        return z3.BoolVal(True)
    before, sch = st.before, st.sched
    formed = disj(lt(0, sch.count), sch.any_preempted)
    num, admitted = _admitted(before, sch)
    defs, out = [], []
    for w in (r for r, p in enumerate(layout.model.prompts) if p.lora > 0):
        alone, alone_defs = alone_schedule(layout, before, w)
        defs += alone_defs
        alone_num, alone_admitted = _admitted(before, alone)
        same = conj(eq(num, alone_num), *[z3.Implies(lt(k, num), conj([eq(x, y) for x, y in zip(a, b)]))
                                          for k, (a, b) in enumerate(zip(admitted, alone_admitted))])
        stays = member(V(w), sch.state.waiting, sch.state.waiting_len)
        out.append(z3.Implies(held_request(layout, before, w), conj(stays, ite(alone.result, same, eq(num, 0)))))
    return z3.Implies(conj(*defs), z3.Implies(conj(_scheduled(st), formed), conj(out)))


def pl1_prompt_logprobs_read_no_cache(layout: Layout, st) -> Any:
    """PL1: a request that asks for prompt logprobs is admitted with no
    prefix-cache hit: its entry starts at token 0 (and counts nothing cached:
    its start, in the encoding)."""
    before, sch = st.before, st.sched
    out = [z3.Implies(conj(lt(j, sch.count), neg(reads_prefix_cache(layout, before, e.req)),
                           member(e.req, before.waiting, before.waiting_len)), eq(e.start, 0))
           for j, e in enumerate(sch.entries)]
    return z3.Implies(_scheduled(st), conj(out))


LORA_STEP_FORMULAS: dict[str, Callable[[Layout, Any], Any]] = {
    "LORA2_held_request_is_passed_over": lora2_held_request_is_passed_over,
    "PL1_prompt_logprobs_read_no_cache": pl1_prompt_logprobs_read_no_cache,
}

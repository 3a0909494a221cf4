"""Reset and pause's part of a Z3 frame (spec/reset_pause.py,
docs/request-states.md "Reset and pause"): spec State's `pause` and each
in-flight entry's ghost `reset` (it was in flight when a reset of the
running requests preempted its request), with `encode`/`decode` for them
and their well-formedness; beside a KV connector, each request's ghost
`offer_reset` and whether a reset of the connector's cache took its offer
(`external_hit` 0 from then on: `forgotten`; spec reset_pause._forget_offers).

A frame has this part only when the model configures reset and pause
(`Config.reset_and_pause`); every other frame is as it was, so no state
count, proof or cross-check of a model without it changes. The drop mode
of a reset request's output needs nothing here: it is vLLM 0.33's
stale-output counters (`state.SCounters`), which the frame already has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.state import Pause, Status
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable, has_kv, kv_offer, kv_offer_of
from flightcheck.verification.z3.encoding.terms import V, clone, conj, eq, le, lt, neg, var

PAUSE: tuple[Pause, ...] = (Pause.UNPAUSED, Pause.PAUSED_NEW, Pause.PAUSED_ALL)
UNPAUSED, PAUSED_NEW, PAUSED_ALL = range(3)


@dataclass
class SResetPause:
    pause: Any                # PAUSE code
    reset: list               # [K][E] Bool, parallel to the frame's batches: spec Entry.reset
    offer_reset: list = field(default_factory=list)   # Bool per request beside a connector: Request.offer_reset
    forgotten: list = field(default_factory=list)     # Bool per request: its prompt's offer taken (external_hit 0)


def has_reset_pause(layout) -> bool:
    """Whether the model configures reset and pause (the frame has an `SResetPause`)."""
    return layout.cfg.reset_and_pause


def refuse_unencoded_reset_pause(model) -> None:
    """What the encoding of reset and pause leaves out, refused: a model
    that needs it is the explicit search's, never checked by a partial
    relation. Beside the other request features (the priority policy's
    preemption order, sessions' parked requests in the pause's count,
    grammars, a KV connector's held tables and fenced frees) the reset is
    not encoded; beside a connector, only a consumer that recomputes a
    failed load without the step fence (one batch in flight) is: what the
    cross-check compares with the spec (tests/test_z3_reset_pause_kv.py)."""
    cfg = model.cfg
    if not cfg.reset_and_pause:
        return
    why = []
    if cfg.scheduling_policy != "fcfs":
        why.append("the priority policy")
    if cfg.streaming_sessions:
        why.append("streaming sessions")
    if cfg.structured_output:
        why.append("structured output")
    kv = cfg.kv_connector
    if kv is not None and (kv.producer or kv.load_failure_policy != "recompute" or cfg.fences_freed_blocks):
        why.append("a KV connector that sends, fails its requests or fences its frees (held tables and "
                   "fenced frees across a reset)")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of reset and pause leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


def rp_frame(layout, tag: str) -> list:
    """[SResetPause of fresh variables], or [] without reset and pause."""
    if not has_reset_pause(layout):
        return []
    flags = [[z3.Bool(f"rp.b{k}.e{j}.reset@{tag}") for j in range(layout.E)] for k in range(layout.K)]
    forgets = has_kv(layout)
    offer_reset = [z3.Bool(f"rp.offer_reset[{r}]@{tag}") for r in range(layout.N)] if forgets else []
    forgotten = [z3.Bool(f"rp.forgotten[{r}]@{tag}") for r in range(layout.N)] if forgets else []
    return [SResetPause(var(f"rp.pause@{tag}"), flags, offer_reset, forgotten)]


def rp_constant(layout, state: State) -> list:
    """The reset-and-pause part of a concrete state, as literals ([] without it)."""
    if not has_reset_pause(layout):
        if state.pause is not Pause.UNPAUSED or any(e.reset for b in state.in_flight for e in b) or \
                any(q.offer_reset for q in state.requests):
            raise NotRepresentable("a pause, a reset entry or a forgotten offer in a model without reset and pause")
        return []
    flags = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        flags.append([z3.BoolVal(e.reset) for e in batch] + [z3.BoolVal(False)] * (layout.E - len(batch)))
    offer_reset, forgotten = [], []
    if has_kv(layout):
        offer_reset = [z3.BoolVal(q.offer_reset) for q in state.requests]
        forgotten = [z3.BoolVal(_forgotten(layout, r, q)) for r, q in enumerate(state.requests)]
    elif any(q.offer_reset for q in state.requests):
        raise NotRepresentable("a forgotten offer without a KV connector")
    return [SResetPause(V(PAUSE.index(state.pause)), flags, offer_reset, forgotten)]


def _forgotten(layout, r: int, q) -> bool:
    """Whether request r's offer was taken by a reset: its prompt's hit
    (kv_state.kv_offer) is > 0 and the request is offered 0; any other
    offer than those two is not the model's."""
    offered = kv_offer(layout, r, q.status is not Status.NEW)
    if dict(offered, external_hit=q.external_hit) != kv_offer_of(q) or \
            q.external_hit not in (0, offered["external_hit"]):
        raise NotRepresentable(f"request {r} is offered other than its model prompt's KV")
    return q.external_hit != offered["external_hit"]


def rp_request_fields(rp: list, r: int, bv) -> dict:
    """Request r's ghost `offer_reset` decoded, and its offer 0 once a reset
    took it ({} without reset and pause beside a connector)."""
    if not rp or not rp[0].offer_reset:
        return {}
    return dict(offer_reset=bv(rp[0].offer_reset[r]), **(dict(external_hit=0) if bv(rp[0].forgotten[r]) else {}))


def offered_by_prompt(layout, s, r: int):
    """Whether request r is still offered its prompt's hit (no reset of the
    connector's cache took it): True without reset and pause."""
    return neg(s.rp[0].forgotten[r]) if s.rp and s.rp[0].forgotten else z3.BoolVal(True)


def rp_entry_fields(rp: list, k: int, j: int, bv) -> dict:
    """Entry (k, j)'s ghost `reset` decoded from a model ({} without reset and pause)."""
    return dict(reset=bv(rp[0].reset[k][j])) if rp else {}


def rp_state_fields(rp: list, iv) -> dict:
    """The State's `pause` decoded from a model ({} without reset and pause)."""
    if not rp:
        return {}
    code = iv(rp[0].pause)
    if not 0 <= code < len(PAUSE):
        raise NotRepresentable(f"pause code {code} out of range")
    return dict(pause=PAUSE[code])


def rp_well_formed(layout, s) -> Any:
    """The pause code in range; an unused entry slot carries no reset mark."""
    if not s.rp:
        return z3.BoolVal(True)
    rp, out = s.rp[0], []
    out += [le(0, rp.pause), lt(rp.pause, len(PAUSE))]
    for k, (b, row) in enumerate(zip(s.batches, rp.reset)):
        for j, flag in enumerate(row):
            out.append(z3.Implies(neg(conj(lt(k, s.num_batches), lt(j, b.length))), neg(flag)))
    for r, (ghost, gone) in enumerate(zip(rp.offer_reset, rp.forgotten)):
        hit = kv_offer(layout, r, True)["external_hit"] > 0
        out += [z3.Implies(gone, conj(ghost, z3.BoolVal(hit))), z3.Implies(ghost, neg(eq(s.reqs[r].status, 0)))]
    return conj(out)


def pause_of(s) -> Any:
    return s.rp[0].pause


def is_paused(s, code: int) -> Any:
    return eq(pause_of(s), code)


def takes_waiting_queue(layout, s) -> Any:
    """spec reset_pause.takes_waiting_queue: the connector's waiting loop goes
    on from `kv_holding` to `waiting` only UNPAUSED (under the mutant
    paused_new_admits_waiting, PAUSED_NEW too); True without reset and pause."""
    if not s.rp:
        return z3.BoolVal(True)
    if layout.is_mutant("paused_new_admits_waiting"):
        return neg(is_paused(s, PAUSED_ALL))
    return is_paused(s, UNPAUSED)


def shift_reset_flags(layout, st) -> Any:
    """complete_oldest: the oldest batch's marks leave with it (the frame's
    batches move up one slot; the last comes in unmarked)."""
    out = clone(st)
    rp = out.rp[0]
    rp.reset = [list(row) for row in rp.reset[1:]] + [[z3.BoolVal(False)] * layout.E]
    return out

"""Reset and pause's part of a Z3 frame (spec/reset_pause.py,
docs/request-states.md "Reset and pause"): spec State's `pause` and each
in-flight entry's ghost `reset` (it was in flight when a reset of the
running requests preempted its request), with `encode`/`decode` for them
and their well-formedness.

A frame has this part only when the model configures reset and pause
(`Config.reset_and_pause`); every other frame is as it was, so no state
count, proof or cross-check of a model without it changes. The drop mode
of a reset request's output needs nothing here: it is vLLM 0.33's
stale-output counters (`state.SCounters`), which the frame already has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.state import Pause
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, clone, conj, eq, le, lt, neg, var

PAUSE: tuple[Pause, ...] = (Pause.UNPAUSED, Pause.PAUSED_NEW, Pause.PAUSED_ALL)
UNPAUSED, PAUSED_NEW, PAUSED_ALL = range(3)


@dataclass
class SResetPause:
    pause: Any                # PAUSE code
    reset: list               # [K][E] Bool, parallel to the frame's batches: spec Entry.reset


def has_reset_pause(layout) -> bool:
    """Whether the model configures reset and pause (the frame has an `SResetPause`)."""
    return layout.cfg.reset_and_pause


def refuse_unencoded_reset_pause(model) -> None:
    """What the encoding of reset and pause leaves out, refused: a model
    that needs it is the explicit search's, never checked by a partial
    relation. Beside the other request features (the priority policy's
    preemption order, sessions' parked requests in the pause's count,
    grammars, a KV connector's held tables and fenced frees) the reset is
    not encoded."""
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
    if cfg.kv_connector is not None:
        why.append("a KV connector (loads held across a reset, the fence on its frees, PAUSED_NEW's loads)")
    if why:
        raise ValueError(f"model {model.name}: the Z3 encoding of reset and pause leaves out "
                         f"{'; '.join(why)}; the explicit search covers them")


def rp_frame(layout, tag: str) -> list:
    """[SResetPause of fresh variables], or [] without reset and pause."""
    if not has_reset_pause(layout):
        return []
    flags = [[z3.Bool(f"rp.b{k}.e{j}.reset@{tag}") for j in range(layout.E)] for k in range(layout.K)]
    return [SResetPause(var(f"rp.pause@{tag}"), flags)]


def rp_constant(layout, state: State) -> list:
    """The reset-and-pause part of a concrete state, as literals ([] without it)."""
    if not has_reset_pause(layout):
        if state.pause is not Pause.UNPAUSED or any(e.reset for b in state.in_flight for e in b):
            raise NotRepresentable("a pause or a reset entry in a model without reset and pause")
        return []
    flags = []
    for k in range(layout.K):
        batch = state.in_flight[k] if k < len(state.in_flight) else ()
        flags.append([z3.BoolVal(e.reset) for e in batch] + [z3.BoolVal(False)] * (layout.E - len(batch)))
    return [SResetPause(V(PAUSE.index(state.pause)), flags)]


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
    return conj(out)


def pause_of(s) -> Any:
    return s.rp[0].pause


def is_paused(s, code: int) -> Any:
    return eq(pause_of(s), code)


def shift_reset_flags(layout, st) -> Any:
    """complete_oldest: the oldest batch's marks leave with it (the frame's
    batches move up one slot; the last comes in unmarked)."""
    out = clone(st)
    rp = out.rp[0]
    rp.reset = [list(row) for row in rp.reset[1:]] + [[z3.BoolVal(False)] * layout.E]
    return out

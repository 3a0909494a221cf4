"""The prefill cadence's part of a Z3 frame (spec/cadence.py,
docs/request-states.md "Prefill cadence"): spec State's `prefill_hold` and
`prefill_capacity_bound`, and each request's `is_prefill_chunk` and
`deferred_waiting`, with `encode`/`decode` for them and their
well-formedness.

A frame has this part when the cadence is in force
(`spec.cadence.is_on`: a profile with the cadence and
`Config.prefill_schedule_interval` > 1), or when the padding rule reads the
flag (`spec.drafts.keeps_prefill_chunk_flag`: a profile that pads
admissions, with drafts; then only the flags move, the hold, the bound and
`deferred_waiting` stay 0 and False: `cad_well_formed`); every other frame
is as it was (`SState.cad` is []), so no state count, proof or cross-check
of a model without either changes. The hooks test the layout, not the frame, so that
CAD2's second computation (the same frame scheduled with the interval set
to 1: cadence_properties.py) runs with the cadence off on a frame that has
the part.

What the encoding of the cadence leaves out is refused, not approximated
(`refuse_unencoded_cadence`). `Config` already refuses the cadence beside
a KV connector; beside the priority policy (its victim handed back from
the batch, which the cadence's `carried prefill` would have to forget),
structured output, streaming sessions, and reset and pause it is not
encoded (the explicit search covers those pairs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3
from flightcheck.spec import State
from flightcheck.spec.cadence import is_on
from flightcheck.spec.drafts import keeps_prefill_chunk_flag
from flightcheck.verification.z3.encoding.kv_state import NotRepresentable
from flightcheck.verification.z3.encoding.terms import V, conj, eq, le, neg, var


@dataclass
class SCadence:
    hold: Any                 # State.prefill_hold: the executed steps the hold still lasts
    bound: Any                # Bool: State.prefill_capacity_bound
    chunk: list               # Bool per request: Request.is_prefill_chunk
    deferred: list            # Bool per request: Request.deferred_waiting


def has_cadence(layout) -> bool:
    """Whether the model's cadence is in force (the frame has an `SCadence`
    and the schedule's hooks act)."""
    return is_on(layout.cfg)


def has_chunk_flags(layout) -> bool:
    """Whether the frame has an `SCadence` (with the cadence, or where the
    padding rule reads `is_prefill_chunk`)."""
    return is_on(layout.cfg) or keeps_prefill_chunk_flag(layout.cfg)


def refuse_unencoded_cadence(model) -> None:
    """The combinations the encoding of the cadence leaves to the explicit
    search: a model that needs one is refused."""
    cfg = model.cfg
    if not is_on(cfg):
        return
    if cfg.scheduling_policy != "fcfs":
        raise ValueError(f"model {model.name}: the Z3 encoding of the prefill cadence leaves out the priority "
                         "policy; the explicit search covers it")
    if cfg.reset_and_pause or cfg.structured_output or cfg.streaming_sessions or cfg.kv_connector is not None:
        raise ValueError(f"model {model.name}: the Z3 encoding of the prefill cadence leaves out reset and pause, "
                         "structured output, streaming sessions and the KV connector; the explicit search covers them")


def cad_frame(layout, tag: str) -> list:
    """[SCadence of fresh variables], or [] without the cadence or the flags."""
    if not has_chunk_flags(layout):
        return []
    return [SCadence(var(f"cad.hold@{tag}"), z3.Bool(f"cad.bound@{tag}"),
                     [z3.Bool(f"cad.chunk[{r}]@{tag}") for r in range(layout.N)],
                     [z3.Bool(f"cad.deferred[{r}]@{tag}") for r in range(layout.N)])]


def cad_constant(layout, state: State) -> list:
    """The cadence part of a concrete state, as literals ([] without it)."""
    if not has_cadence(layout):
        if state.prefill_hold or state.prefill_capacity_bound or any(q.deferred_waiting for q in state.requests):
            raise NotRepresentable("a prefill cadence's hold or flags in a model without the cadence")
        if not has_chunk_flags(layout):
            if any(q.is_prefill_chunk for q in state.requests):
                raise NotRepresentable("an is_prefill_chunk flag in a model that keeps none")
            return []
    return [SCadence(V(state.prefill_hold), z3.BoolVal(state.prefill_capacity_bound),
                     [z3.BoolVal(q.is_prefill_chunk) for q in state.requests],
                     [z3.BoolVal(q.deferred_waiting) for q in state.requests])]


def cad_request_fields(cad: list, r: int, bv) -> dict:
    """Request r's `is_prefill_chunk` and `deferred_waiting` decoded ({} without the cadence)."""
    return dict(is_prefill_chunk=bv(cad[0].chunk[r]), deferred_waiting=bv(cad[0].deferred[r])) if cad else {}


def cad_state_fields(cad: list, iv, bv) -> dict:
    """The State's hold and capacity bound decoded ({} without the cadence)."""
    if not cad:
        return {}
    return dict(prefill_hold=iv(cad[0].hold), prefill_capacity_bound=bv(cad[0].bound))


def cad_well_formed(layout, s) -> Any:
    """The hold within [0, interval - 1] (what spec.cadence.after_schedule
    can set; True without the part); with the flags alone, the cadence's
    other fields at their defaults."""
    if not s.cad:
        return z3.BoolVal(True)
    c = s.cad[0]
    if not has_cadence(layout):
        return conj(eq(c.hold, 0), neg(c.bound), *[neg(d) for d in c.deferred])
    return conj(le(0, c.hold), le(c.hold, layout.cfg.prefill_schedule_interval - 1))

"""Where a request's entries sit in a Z3 frame's batches in flight: the
queries the invariant formulas, the "sometimes" formulas and the inferred
invariants' grammar share. A frame's batches are fixed arrays padded past
`num_batches` and each batch's `length`; these name the slots in use."""

from __future__ import annotations

from typing import Any

import z3
from flightcheck.verification.z3.encoding.state import LIVE, Layout, SState
from flightcheck.verification.z3.encoding.terms import conj, disj, eq, ite, lt


def positions(layout: Layout, s: SState) -> list[tuple[Any, Any]]:
    """Every in-flight entry slot in FIFO order: (entry, slot in use)."""
    return [(e, conj(lt(k, s.num_batches), lt(j, b.length)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]


def live(e, used: Any, r: int) -> Any:
    return conj(used, eq(e.req, r), eq(e.fate, LIVE))


def has_live(layout: Layout, s: SState, r: int) -> Any:
    return disj(*[live(e, u, r) for e, u in positions(layout, s)])


def last_live(layout: Layout, s: SState, r: int, field: str, default: Any) -> Any:
    """A field of r's last live entry in flight (`default` without one)."""
    out = default
    for e, u in positions(layout, s):
        out = ite(live(e, u, r), getattr(e, field), out)
    return out


def last_live_samples(layout: Layout, s: SState, r: int) -> Any:
    """r's last live entry samples (False without one)."""
    return last_live(layout, s, r, "samples", z3.BoolVal(False))



def live_entries(layout: Layout, s: SState, r: int) -> list[tuple[int, Any, Any]]:
    """(batch index, entry, is a live entry of r) over every slot in FIFO order."""
    return [(k, e, conj(lt(k, s.num_batches), lt(j, b.length), eq(e.req, r), eq(e.fate, LIVE)))
            for k, b in enumerate(s.batches) for j, e in enumerate(b.entries)]

"""The grammar of inferred invariants: 208 candidate facts stated from the
shape of the state alone, each a name whose meaning `predicate` builds as a
Z3 formula over a symbolic state (verification/z3/induction/inferred.py
proves with them; kinduction.py builds them as auxiliary invariants)."""

from __future__ import annotations

import functools
import re
from typing import Any

import z3
from flightcheck.verification.z3.encoding.entries import has_live, last_live, live, positions
from flightcheck.verification.z3.encoding.state import (
    F_ABORTED,
    F_LENGTH,
    F_STOPPED,
    NEW,
    PREEMPTED,
    RUNNING,
    WAITING,
    Layout,
    SState,
)
from flightcheck.verification.z3.encoding.terms import (
    V,
    conj,
    count,
    disj,
    eq,
    le,
    lt,
    member,
    neg,
)
from flightcheck.verification.z3.induction.strengthening import AuxiliaryInvariant

STATUSES = {"NEW": NEW, "WAITING": WAITING, "RUNNING": RUNNING, "PREEMPTED": PREEMPTED,
            "FINISHED_STOPPED": F_STOPPED, "FINISHED_LENGTH": F_LENGTH, "FINISHED_ABORTED": F_ABORTED}
REQUEST_FIELDS = ("num_output", "num_computed", "num_drafts", "table_len")
ENTRY_FIELDS = ("start", "n", "drafts")
PREFIX = "inferred "     # every candidate's name starts with it (the engines tell them from the spec's)


def _request_atoms() -> list[str]:
    atoms = [f"{f}{op}" for f in REQUEST_FIELDS for op in ("=0", ">=0", ">=1")]
    return atoms + ["idle", "no_live", "live<=1", "entries<=1"]


def candidates() -> list[str]:
    """Every candidate's name, in a fixed order (the name is the fact: see `predicate`)."""
    guards = ["any", *(f"status={s}" for s in STATUSES), "in_flight", "live"]
    out = [f"req[{g}]: {a}" for g in guards for a in _request_atoms()]
    out += [f"req[live]: {f}=last.{g}" for f in REQUEST_FIELDS for g in ENTRY_FIELDS]
    out += [f"entry: {g}{op}{c}" for g in ENTRY_FIELDS for op in (">=", "<=") for c in ("0", "1", "k")]
    out += [f"entry: {g}{op}{h}" for g in ENTRY_FIELDS for h in ENTRY_FIELDS if g != h for op in ("<", "<=")]
    out += ["block[unlabelled]: ref<=1", "block[unlabelled]: ref=0", "block[any]: ref>=0",
            "held: not_free", "held: ref>=1", "free: ref=0"]
    return [PREFIX + c for c in out]


@functools.cache
def _known() -> frozenset[str]:
    return frozenset(candidates())


def is_candidate(name: str) -> bool:
    return name.startswith(PREFIX)


# -- the meaning of a name ----------------------------------------------------

def _entries_of(layout: Layout, s: SState, r: int, live_only: bool) -> list[Any]:
    """For each entry slot: it holds one of r's entries (a live one, if `live_only`)."""
    return [live(e, u, r) if live_only else conj(u, eq(e.req, r)) for e, u in positions(layout, s)]


_COMPARE = {"=": eq, ">=": lambda x, y: le(y, x), "<=": le, "<": lt}


def _compare(x: Any, op: str, y: Any) -> Any:
    return _COMPARE[op](x, y)


def _request_guard(layout: Layout, s: SState, r: int, guard: str) -> Any:
    if guard == "any":
        return z3.BoolVal(True)
    if guard == "in_flight":
        return disj(*_entries_of(layout, s, r, False))
    if guard == "live":
        return has_live(layout, s, r)
    return eq(s.reqs[r].status, STATUSES[guard.removeprefix("status=")])


def _request_atom(layout: Layout, s: SState, r: int, atom: str) -> Any:
    q = s.reqs[r]
    if atom == "idle":
        return neg(disj(*_entries_of(layout, s, r, False)))
    if atom == "no_live":
        return neg(has_live(layout, s, r))
    if atom in ("live<=1", "entries<=1"):
        return le(count(_entries_of(layout, s, r, atom == "live<=1")), 1)
    f, op, rhs = re.fullmatch(r"(\w+)(=|>=)(.+)", atom).groups()
    other = last_live(layout, s, r, rhs.removeprefix("last."), V(0)) if rhs.startswith("last.") else V(int(rhs))
    return _compare(getattr(q, f), op, other)


def _entry_fact(layout: Layout, s: SState, fact: str) -> Any:
    g, op, h = re.fullmatch(r"(\w+)(>=|<=|<)(\w+)", fact).groups()
    k = layout.cfg.num_spec_tokens
    out = []
    for e, u in positions(layout, s):
        rhs = V(k) if h == "k" else V(int(h)) if h.isdigit() else getattr(e, h)
        out.append(z3.Implies(u, _compare(getattr(e, g), op, rhs)))
    return conj(out)


def _pool_fact(layout: Layout, s: SState, scope: str, fact: str) -> Any:
    pool = s.pool
    where = {"block[unlabelled]": lambda b: eq(pool.label[b], layout.none_label),
             "block[any]": lambda b: z3.BoolVal(True),
             "held": lambda b: disj(*[member(b, q.table, q.table_len) for q in s.reqs]),
             "free": lambda b: member(b, pool.free, pool.free_len)}[scope]
    what = {"ref<=1": lambda b: le(pool.ref[b], 1), "ref=0": lambda b: eq(pool.ref[b], 0),
            "ref>=0": lambda b: le(0, pool.ref[b]), "ref>=1": lambda b: le(1, pool.ref[b]),
            "not_free": lambda b: neg(member(b, pool.free, pool.free_len))}[fact]
    return conj([z3.Implies(where(b), what(b)) for b in range(layout.B)])


def predicate(name: str) -> AuxiliaryInvariant:
    """The candidate a name states, as a predicate over one frame."""
    if name not in _known():
        raise ValueError(f"not a candidate of the grammar: {name!r}")
    scope, fact = name.removeprefix(PREFIX).split(": ")
    if scope.startswith("req["):
        guard = scope[4:-1]
        return lambda layout, s: conj([z3.Implies(_request_guard(layout, s, r, guard),
                                                  _request_atom(layout, s, r, fact))
                                       for r in range(layout.N)])
    if scope == "entry":
        return lambda layout, s: _entry_fact(layout, s, fact)
    return lambda layout, s: _pool_fact(layout, s, scope, fact)

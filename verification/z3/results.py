"""What the Z3 engines return: plain dataclasses the suite renders, and the
replay that confirms every trace a solver produces on the concrete spec."""

from __future__ import annotations

from dataclasses import dataclass, field

from flightcheck.spec import INVARIANTS, TRANSITION_PROPERTIES, Action, State, step
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied

STATUSES = ("proved", "bounded", "reached", "violated", "unknown")


@dataclass
class EngineVerdict:
    """One engine's verdict on one property, with its evidence (a trace, a
    counterexample to induction); the suite keeps only its row (PropertyResult)."""
    name: str
    kind: str                    # invariant | liveness | transition | sometimes | auxiliary
    status: str                  # proved | bounded | reached | violated | unknown
    method: str                  # "bmc", "k-induction (k=1)", "spacer"
    depth: int | None            # bounded/reached/violated: the depth; proved: k
    seconds: float
    trace: list[Action] | None = None          # violated/reached: from the initial state
    states: list[State] | None = None          # the trace's states, states[0] initial
    cti: tuple[State, Action, State] | None = None   # unknown (induction): a counterexample to induction
    message: str = ""


@dataclass
class EngineResult:
    model: str
    method: str
    seconds: float
    depth: int                   # deepest depth completed (BMC) or k (induction)
    properties: list[EngineVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def by_name(self) -> dict[str, EngineVerdict]:
        return {p.name: p for p in self.properties}

    @property
    def ok(self) -> bool:
        return all(p.status in ("proved", "bounded", "reached") for p in self.properties)


class ReplayMismatch(AssertionError):
    """A Z3 trace that the concrete spec does not reproduce: an encoding bug."""


def replay(model: Model, actions: list[Action], states: list[State] | None = None) -> list[State]:
    """Re-run a trace on the concrete spec; if `states` are given (decoded from
    the solver), every one must be what the spec computes."""
    got = [explicit.initial(model)]
    for i, a in enumerate(actions):
        with applied(model.mutant):
            nxt = step(got[-1], model.cfg, a)
        if nxt is None:
            raise ReplayMismatch(f"step {i + 1} ({a}) is disabled in the concrete spec")
        got.append(nxt)
        if states is not None and states[i + 1] != nxt:
            raise ReplayMismatch(f"step {i + 1} ({a}): the solver's state differs from the spec's\n"
                                 f"  solver: {states[i + 1]}\n  spec:   {nxt}")
    return got


def concrete_check(model: Model, name: str, states: list[State], actions: list[Action]) -> bool:
    """The spec's own predicate `name` fails at the end of the trace."""
    cfg = model.cfg
    with applied(model.mutant):     # L2 and L3 run the spec's actions
        for inv in INVARIANTS:
            if inv.name == name:
                return not inv.holds(states[-1], cfg)
        for p in TRANSITION_PROPERTIES:
            if p.name == name:
                return not p.holds(states[-2], states[-1], actions[-1], cfg)
    raise KeyError(name)

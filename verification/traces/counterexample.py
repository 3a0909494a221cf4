"""Counterexamples as traces of spec actions: replayed on the concrete spec,
printed as a step table (state before, action, what broke), and written as
JSON (in the spirit of the ITF traces Apalache and Quint emit).

Whatever engine found a counterexample (explicit search, Z3 BMC), it is a
list of labelled actions from the initial state; `replay` re-executes it on
the concrete spec, so a counterexample is only reported if the spec itself
agrees that the last step breaks the property. A mutant model's trace is
replayed, and its properties evaluated, with the mutant applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum

from flightcheck.spec import (
    Action,
    State,
    describe,
    invariants_for,
    step,
    transition_properties_for,
)
from flightcheck.verification.explicit.search import initial
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from rich.console import Console
from rich.table import Table
from rich.text import Text


@dataclass
class Counterexample:
    model: Model
    property: str
    actions: list[Action]
    states: list[State]          # states[0] is initial; states[i+1] follows actions[i]
    message: str

    @property
    def length(self) -> int:
        return len(self.actions)


class ReplayError(AssertionError):
    """The trace does not replay on the concrete spec."""


def replay(model: Model, actions: list[Action]) -> list[State]:
    """Run `actions` on the concrete spec from the initial state."""
    states = [initial(model)]
    with applied(model.mutant):
        for i, action in enumerate(actions):
            nxt = step(states[-1], model.cfg, action)
            if nxt is None:
                raise ReplayError(f"step {i + 1} ({action}) is not enabled in the concrete spec")
            states.append(nxt)
    return states


def broken_at(model: Model, states: list[State], actions: list[Action], i: int) -> list[str]:
    """Names of the properties step i (1-based, into states[i]) breaks."""
    cfg, s = model.cfg, states[i]
    with applied(model.mutant):     # L2 and L3 run the spec's actions
        names = [inv.name for inv in invariants_for(cfg, auxiliary=False) if not inv.holds(s, cfg)]
        names += [p.name for p in transition_properties_for(cfg)
                  if not p.holds(states[i - 1], s, actions[i - 1], cfg)]
    return names


def from_actions(model: Model, prop: str, actions: list[Action], message: str = "") -> Counterexample:
    states = replay(model, actions)
    return Counterexample(model, prop, list(actions), states, message)


def render(cx: Counterexample, console: Console | None = None) -> None:
    """Print the step table."""
    console = console or Console()
    table = Table(title=f"{cx.property} violated after {cx.length} steps on model {cx.model.name}"
                        + (f" (mutant {cx.model.mutant})" if cx.model.mutant else ""),
                  show_lines=True)
    table.add_column("step", justify="right")
    table.add_column("state before")
    table.add_column("action")
    table.add_column("broke")
    for i, action in enumerate(cx.actions, start=1):
        broke = broken_at(cx.model, cx.states, cx.actions, i)
        table.add_row(str(i), Text(describe(cx.states[i - 1])), Text(str(action)),
                      Text(", ".join(broke)))
    console.print(table)
    console.print(Text(f"final state: {describe(cx.states[-1])}"))
    if cx.message:
        console.print(f"[bold]{cx.property}[/bold]: {cx.message}")


def _plain(value):
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {"#type": type(value).__name__} | {f.name: _plain(getattr(value, f.name))
                                                  for f in fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    return value


def to_json(cx: Counterexample) -> dict:
    """A self-describing trace: model, property, actions and the states they pass through."""
    return {
        "#meta": {"format": "flightcheck-counterexample", "version": 1},
        "model": cx.model.name, "mutant": cx.model.mutant, "property": cx.property,
        "message": cx.message,
        "actions": [{"action": str(a), **_plain(a)} for a in cx.actions],
        "states": [_plain(s) for s in cx.states],
    }


def dumps(cx: Counterexample) -> str:
    return json.dumps(to_json(cx), indent=1)

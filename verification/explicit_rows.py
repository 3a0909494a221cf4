"""The explicit-state search's rows for `flightcheck verify` (suite.py):
one row per property from an exhaustive search of a model, and a mutant
hunted to its shortest counterexample (breadth-first, so the first kill
found is a shortest one; liveness needs the whole graph).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flightcheck.spec import INVARIANTS, SOMETIMES, TRANSITION_PROPERTIES, Config, invariants_for, transition_properties_for
from flightcheck.spec.profiles import DEFAULT_PROFILE
from flightcheck.spec.sometimes import sometimes_for
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model, mutant_model
from flightcheck.verification.results import LIVENESS_GRAPH, SOMETIMES_NAMES, PropertyResult, kind_of
from flightcheck.verification.traces.counterexample import Counterexample, from_actions


@dataclass
class MutantResult:
    name: str
    killed: bool
    trace_length: int | None
    seconds: float
    property: str | None = None
    model: str = ""
    method: str = "exhaustive"
    counterexample: Counterexample | None = field(default=None, repr=False)



def all_property_names(cfg: Config | None = None) -> list[str]:
    """Every property's name; with `cfg`, those of its profile (IF1-IF3 and
    S7' only where vLLM keeps stale-output counters)."""
    invariants = INVARIANTS if cfg is None else invariants_for(cfg)
    transitions = TRANSITION_PROPERTIES if cfg is None else transition_properties_for(cfg)
    return ([i.name for i in invariants] + [t.name for t in transitions]
            + list(LIVENESS_GRAPH) + [s.name for s in (SOMETIMES if cfg is None else sometimes_for(cfg))])


def exhaustive_rows(model: Model, counterexamples: list[Counterexample] | None = None) -> list[PropertyResult]:
    """One row per property from an exhaustive search of `model`; with
    `counterexamples`, the shortest counterexample of each violated safety or
    liveness property is appended to it (a step table for the report)."""
    r = explicit.search(model)
    if counterexamples is not None:
        for v in sorted(r.violations, key=lambda v: len(v.path)):
            if v.property not in SOMETIMES_NAMES and v.path:
                counterexamples.append(from_actions(model, v.property, [a for a, _ in v.path], v.message))
    method = f"exhaustive {model.name} ({r.num_states} states, depth {r.max_depth})"
    broken = {v.property for v in r.violations}
    rows = []
    applicable = {s.name for s in sometimes_for(model.cfg)
                  if s.is_applicable(model.cfg, model.shares_prefix) and s.name not in model.skip_targets}
    for name in all_property_names(model.cfg):
        if name in SOMETIMES_NAMES:
            if name not in applicable:
                continue
            status = "reached" if name in r.reached else "violated"
            depth = r.reached.get(name)
        else:
            status = "violated" if name in broken else ("proved" if r.complete else "bounded")
            depth = None if r.complete else r.max_depth
        rows.append(PropertyResult(name, kind_of(name), status, method, depth, r.seconds))
    return rows


def hunt_mutant(name: str, model: Model | None = None, profile: str = DEFAULT_PROFILE) -> MutantResult:
    """Shortest counterexample for a mutant by breadth-first search, on `model`
    or, by default, on the mutant's own model under `profile`."""
    model = (model.with_mutant(name) if model else mutant_model(name, profile))
    t0 = time.perf_counter()
    r = explicit.search(model, stop_at_first=True, check_liveness=False)
    kills = [v for v in r.violations if v.property not in SOMETIMES_NAMES]
    if not kills and r.complete:
        r = explicit.search(model, check_liveness=True)      # liveness needs the whole graph
        kills = [v for v in r.violations if v.property not in SOMETIMES_NAMES]
    return _shortest_kill(name, model, kills, time.perf_counter() - t0)


def hunt_mutant_against_base(name: str, model: Model, broken_on_base: set[str]) -> MutantResult:
    """Shortest counterexample for a mutant on `model` (a name-reuse model,
    where the correct spec itself breaks `broken_on_base`): only a property
    the base keeps counts as a kill. The whole graph is searched, liveness
    included, since the first violation found is likely one the base shares."""
    model = model.with_mutant(name)
    t0 = time.perf_counter()
    r = explicit.search(model, check_liveness=True)
    kills = [v for v in r.violations if v.property not in SOMETIMES_NAMES and v.property not in broken_on_base]
    return _shortest_kill(name, model, kills, time.perf_counter() - t0)


def _shortest_kill(name: str, model: Model, kills: list[explicit.Violation], seconds: float) -> MutantResult:
    """The mutant's result from the violations that count as kills: the
    shortest one, replayed as a counterexample, or survived."""
    if not kills:
        return MutantResult(name, False, None, seconds, model=model.name)
    v = min(kills, key=lambda v: len(v.path))
    cx = from_actions(model, v.property, [a for a, _ in v.path], v.message)
    return MutantResult(name, True, cx.length, seconds, v.property, model.name, counterexample=cx)

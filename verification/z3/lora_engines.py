"""LORA1, LORA2 and PL1 (spec/lora.py, spec/lora_properties.py) on the Z3
encoding (encoding/lora.py, lora_invariants.py), on the models of
z3/lora_models.py.

* LORA1 (a state invariant) and LORAA1 (its auxiliary invariant):
  `kv_engines.kv_induction` (k-induction, the Houdini way) over WF_encoding,
  LORA1 and LORAA1.
* LORA2 and PL1 (properties of a schedule step) as one-step consequences of
  what an inductive invariant I keeps (`kv_engines.step_consequences`'
  query, each in a fresh solver: `_one_step`):

      I(s) AND guard_schedule(s) AND s' = schedule(s) AND NOT P(s, s')     unsat

  I is what the Houdini loop keeps of WF_encoding and LORAA1 (and LORA1
  on a model with a cap): each kept conjunct holds in every reachable state,
  so every schedule step from a reachable state satisfies P, and every other
  step does, by P's first clause.
* BMC (`lora_bmc`): WF and LORA1 on every frame, LORA2 and PL1 on every
  step, to a depth; a violation (a mutant's) is decoded into spec actions,
  replayed on the concrete spec state for state, and must break the spec's
  own predicate (z3.results.replay), so the encoding cannot report a bug the
  spec does not have.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.results import PropertyResult
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.lora_invariants import (
    LORA_AUXILIARY,
    LORA_STEP_FORMULAS,
)
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import (
    WF,
    _on,
    _spec_breaks,
    kv_bmc,
    kv_induction,
)
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

STATE_PROPERTIES = ("LORA1_loras_within_cap",)
STEP_PROPERTIES = tuple(LORA_STEP_FORMULAS)


def lora_kind(name: str) -> str:
    """LORA1, LORA2 and PL1 are the spec's invariants (LORA2 and PL1 of steps); the rest auxiliary."""
    return "invariant" if name in (*STATE_PROPERTIES, *STEP_PROPERTIES) else "auxiliary"


def lora_properties(model: Model) -> tuple[list[str], list[str]]:
    """The model's LoRA properties (spec.invariants_for, transition_properties_for): (state, step)."""
    cfg = model.cfg
    state = list(STATE_PROPERTIES) if cfg.max_loras else []
    steps = [p.name for p in transition_properties_for(cfg) if p.name in LORA_STEP_FORMULAS]
    return state, steps


def lora_auxiliary(model: Model) -> list[str]:
    """The conjuncts offered to the Houdini loop: LORAA1-LORAA3 only, as
    the priority proof offers its own only (the encoding's S-formulas and
    strengthening invariants as candidates: more conjuncts, more queries).
    WF_encoding, always offered, needs the pool's invariants to be
    inductive: LORA1, LORA2 and PL1 need none of them."""
    return list(LORA_AUXILIARY)


def lora_induction(model: Model, k: int = 1, time_budget: float | None = None) -> EngineResult:
    """LORA1 (with a cap) and LORAA1 by k-induction (kv_engines.kv_induction),
    then the model's step properties (LORA2, PL1) as one-step consequences
    of the conjuncts it proved."""
    started = time.perf_counter()
    state, steps = lora_properties(model)
    res = kv_induction(model, k, state, lora_auxiliary(model), time_budget)
    kept = [p.name for p in res.properties if p.status == "proved"]
    rows = [_one_step(model, kept, n) for n in steps]
    seconds = time.perf_counter() - started
    return EngineResult(model.name, res.method, seconds, k, [*res.properties, *rows],
                        notes=[f"inductive invariant: {len(kept)} conjuncts kept"])


def _one_step(model: Model, kept: list[str], name: str) -> EngineVerdict:
    """`name` one step from the invariant `kept` (kv_engines.step_consequences'
    query, each in a solver of its own: asked after a first check, as there,
    the solver works incrementally, and LORA2's query, with its second
    schedules, had no answer in 10 minutes where a fresh solver answers in
    about one; docs/proofs.md)."""
    from types import SimpleNamespace
    started = time.perf_counter()
    method = "one step from the k-induction invariant"

    def query(goal: Callable | None) -> tuple[z3.CheckSatResult, System, z3.Solver]:
        system = System(model)
        s, tr = system.frame(0), system.transitions(0)
        solver = z3.SolverFor("QF_BV")
        solver.add(tr.sched_defs + tr.defs + tr.legal + [_on(system, n, s) for n in kept])
        solver.add(tr.guards[SCHEDULE], tr.choices.act == SCHEDULE)
        if goal is not None:
            st = SimpleNamespace(before=s, after=tr.effects[SCHEDULE], choices=tr.choices, sched=tr.sched)
            solver.add(z3.Not(system.build(goal, st)))
        return solver.check(), system, solver

    if query(None)[0] != z3.sat:
        return EngineVerdict(name, lora_kind(name), "unknown", method, 1, time.perf_counter() - started,
                             message="I(s) admits no schedule step")
    answer, system, solver = query(LORA_STEP_FORMULAS[name])
    message = "" if answer == z3.unsat else "solver gave up" if answer == z3.unknown else \
        f"I(s) and a schedule step do not imply it: from {system.decode_or_dump(solver.model(), 0)}"
    return EngineVerdict(name, lora_kind(name), "proved" if answer == z3.unsat else "unknown", method, 1,
                         time.perf_counter() - started, message=message)


def lora_bmc(model: Model, depth: int, properties: Iterable[str] | None = None,
             time_budget: float | None = None) -> EngineResult:
    """WF and LORA1 on every frame, LORA2 and PL1 on every step, to `depth`
    steps from the initial state, or each violated at its smallest depth
    (kv_engines.kv_bmc with the step properties' goals)."""
    names = [*lora_properties(model)[0], *lora_properties(model)[1]] if properties is None else list(properties)
    return kv_bmc(model, depth, names, time_budget, goal=_goal, breaks=_breaks, kind=lora_kind)


def _goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    if name in LORA_STEP_FORMULAS:
        return system.build(LORA_STEP_FORMULAS[name], steps[-1]) if steps else z3.BoolVal(True)
    return _on(system, name, system.frame(t))


def _breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec breaks `name` on the replayed trace: a step property on its last step."""
    if name in LORA_STEP_FORMULAS:
        with applied(model.mutant):
            return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
                       for p in transition_properties_for(model.cfg))
    return name == WF or _spec_breaks(model, name, states[-1])


# --- the rows of `flightcheck verify --lora`

# The profile whose rules the Z3 models are checked under, for each profile
# `--lora` takes: an async profile's rows are its synchronous twin's (the
# proofs are not run under async scheduling), and the method says so.
LORA_ENCODED_PROFILE = {"vllm-0.33": "vllm-0.33", "vllm-0.33-async": "vllm-0.33",
                        "vllm-0.34": "vllm-0.34", "vllm-0.34-async": "vllm-0.34"}

# How deep BMC of each model goes (the proofs are unbounded; BMC gives each
# property a second, independent method).
LORA_BMC_DEPTH = 4


def lora_models(profile: str) -> tuple[Model, ...]:
    """The Z3 models (z3/lora_models.py) under `profile`'s synchronous rules."""
    from flightcheck.verification.z3.lora_models import LORA_Z3_MODELS
    encoded = LORA_ENCODED_PROFILE[profile]
    return tuple(m if m.cfg.profile == encoded else m.under_profile(encoded) for m in LORA_Z3_MODELS)


def lora_rows(profile: str, depth: int = LORA_BMC_DEPTH, time_budget: float | None = None) -> list[PropertyResult]:
    """LORA1 by k-induction, LORA2 and PL1 one step from its invariant, and
    each by BMC to `depth`, on the Z3 model that has it, under `profile`'s
    synchronous rules; each method names its model and the profile."""
    encoded = LORA_ENCODED_PROFILE[profile]
    note = "" if encoded == profile else f"; {profile}'s synchronous twin"
    rows = []
    for model in lora_models(profile):
        where = f" [{model.name.split('@')[0]}@{encoded}{note}]"
        for result in (lora_induction(model, time_budget=time_budget), lora_bmc(model, depth, time_budget=time_budget)):
            rows += [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
                     for p in result.properties if p.kind != "auxiliary"]
    return rows

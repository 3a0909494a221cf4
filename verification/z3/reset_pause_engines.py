"""RP1-RP4 (spec/reset_pause.py) proved on the Z3 encoding
(encoding/reset_pause.py), on the model of reset_pause_models.py, and RP5
(a reset of the connector's cache forgets the offers not yet taken) on its
model beside a KV connector.

RP1-RP5 are transition properties, so they are proved as one-step
consequences of an inductive invariant I:

    I(s) AND T(s, s') AND not P(s, s')      unsat for each P

I is what kv_engines.kv_induction (k-induction, k = 1, the Houdini loop)
keeps of WF_encoding, the auxiliary invariant RPA1
(encoding/reset_pause_invariants.py) and the encoding's own formulas of the
spec's invariants and strengthening invariants (kv_engines' candidates):
each kept conjunct holds in every reachable state, so every step from a
reachable state satisfies P. BMC bounds each P on the steps of every
path up to a depth; a violation (a mutant's) is decoded into spec actions,
replayed on the concrete spec state for state, and must break the spec's
own predicate on its last step (z3.results.replay, concrete_check).
"""

from __future__ import annotations

import time
from typing import Iterable

import z3
from flightcheck.spec import invariants_for, transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.invariants import NEEDS_SCHEDULE, invariant_formulas_for
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY
from flightcheck.verification.z3.encoding.reset_pause_invariants import (RP5_FORMULA, RP_AUXILIARY, RP_KV_AUXILIARY,
                                                                         RP_TRANSITION_FORMULAS, rp_transition_formulas)
from flightcheck.verification.z3.encoding.system import Step, System
from flightcheck.verification.z3.kv_engines import (KV_CANDIDATES, WF, _formula, candidate_names, kv_bmc,
                                                   kv_induction, kv_properties)
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

RP_PROPERTIES: tuple[str, ...] = tuple(RP_TRANSITION_FORMULAS)


def rp_properties(model: Model) -> tuple[str, ...]:
    """RP1-RP4, and RP5 beside a KV connector (spec.transition_properties_for)."""
    return tuple(rp_transition_formulas(model.cfg))


def rp_auxiliary(model: Model) -> list[str]:
    """The conjuncts offered to the Houdini loop: RPA1, then the encoding's
    formulas of the spec's invariants and strengthening invariants; beside
    a connector, the connector models' conjuncts instead (kv_engines: its
    invariants, its auxiliary ones and the candidates it keeps)."""
    if model.cfg.kv_connector is not None:
        return [*RP_AUXILIARY, *RP_KV_AUXILIARY, *kv_properties(model), *KV_AUXILIARY, *KV_CANDIDATES]
    return [*RP_AUXILIARY, *candidate_names(model.cfg)]


def _holds(system: System, name: str, st: Step) -> z3.BoolRef:
    """RP1-RP4 on the step; a spec state invariant (the encoding's formula,
    invariants.invariant_formulas_for) on the state after it."""
    formulas = rp_transition_formulas(system.layout.cfg)
    if name in formulas:
        return system.build(formulas[name], st)
    formula = invariant_formulas_for(system.layout.cfg)[name]
    return system.build(lambda layout, s: formula(layout, s, None), st.after)


def _spec_breaks(model: Model, name: str, states: list, actions: list) -> bool:
    """The spec's own property `name` fails on the trace's last step or state."""
    with applied(model.mutant):
        return any(p.name == name and not p.holds(states[-2], states[-1], actions[-1], model.cfg)
                   for p in transition_properties_for(model.cfg)) or \
            any(inv.name == name and not inv.holds(states[-1], model.cfg) for inv in invariants_for(model.cfg))


def rp_bmc(model: Model, depth: int, properties: Iterable[str] | None = None,
           time_budget: float | None = None) -> EngineResult:
    """Each of RP1-RP4 (or a spec state invariant the encoding has, named
    among `properties`, on the state after each step) holds on every step
    of every path of up to `depth` steps from the initial state, or is
    violated at the shortest such step (its trace replayed on the spec;
    kv_engines.kv_bmc with the steps' goals)."""
    names = list(rp_properties(model) if properties is None else properties)
    if any(n in NEEDS_SCHEDULE for n in names):
        raise ValueError(f"rp_bmc does not check {sorted(NEEDS_SCHEDULE)}")
    return kv_bmc(model, depth, names, time_budget, goal=_goal, breaks=_spec_breaks, kind=_kind_of, with_wf=False)


def _goal(system: System, name: str, t: int, steps: list[Step]) -> z3.BoolRef:
    return _holds(system, name, steps[-1]) if steps else z3.BoolVal(True)      # properties of steps


def _kind_of(name: str) -> str:
    return "transition" if name in RP_TRANSITION_FORMULAS or name in RP5_FORMULA else "invariant"


def rp_induction(model: Model, time_budget: float | None = None) -> EngineResult:
    """The inductive invariant (k-induction, k = 1, Houdini over WF, RPA1 and
    the candidates), then RP1-RP4 as one-step consequences of it. The rows:
    RP1-RP4 (proved, or unknown with the step that breaks them under I),
    then every conjunct of I offered (proved: kept; unknown: dropped)."""
    started = time.perf_counter()
    invariant = kv_induction(model, 1, properties=[], auxiliary=rp_auxiliary(model), time_budget=time_budget)
    kept = [p.name for p in invariant.properties if p.status == "proved"]
    system = System(model)
    st = system.step(0, 1)
    solver = z3.SolverFor("QF_BV")
    solver.add(*st.constraints, *[_formula(system, n, 0) for n in kept])
    method = "k-induction (k=1), one step"
    rows = []
    for name in rp_properties(model):
        if time_budget is not None:
            solver.set("timeout", max(1, int((started + time_budget - time.perf_counter()) * 1000)))
        answer = solver.check(z3.Not(_holds(system, name, st)))
        status = "proved" if answer == z3.unsat else "unknown"
        message = "" if answer == z3.unsat else f"I(s) and T(s, s') do not imply it ({answer})"
        if answer == z3.sat:
            message += f": from {system.decode_or_dump(solver.model(), 0)} by {system.decode_action(solver.model(), st)}"
        rows.append(EngineVerdict(name, "transition", status, method, 1, time.perf_counter() - started,
                                  message=message))
    seconds = time.perf_counter() - started
    return EngineResult(model.name, method, seconds, 1, rows + invariant.properties,
                        notes=[f"inductive invariant: {len(kept)} conjuncts kept ({WF} and "
                               f"{', '.join(n for n in kept if n in RP_AUXILIARY or n in RP_KV_AUXILIARY) or 'no RPA'}"
                               " among them)"])


# --- the rows of `flightcheck verify --reset-pause`

# The profile whose rules the Z3 model is checked under, for each profile
# `--reset-pause` takes: vLLM 0.34's (reset_pause_models.RP_Z3) or 0.33's
# (the same model under that profile: the same 2,124 states); an async
# profile's rows are its synchronous twin's (the proof is not run under
# async scheduling), and the method says so.
RP_ENCODED_PROFILE = {"vllm-0.33": "vllm-0.33", "vllm-0.33-async": "vllm-0.33",
                      "vllm-0.34": "vllm-0.34", "vllm-0.34-async": "vllm-0.34"}


def rp_model(profile: str) -> Model:
    """The Z3 model under `profile`'s synchronous rules (RP_ENCODED_PROFILE)."""
    from flightcheck.verification.z3.profiles import profile_model
    from flightcheck.verification.z3.reset_pause_models import RP_Z3
    encoded = RP_ENCODED_PROFILE[profile]
    return RP_Z3 if RP_Z3.cfg.profile == encoded else profile_model(RP_Z3, encoded)


# How deep BMC of the model goes (the proof is unbounded; BMC gives each of
# RP1-RP4 a second, independent method).
RP_BMC_DEPTH = 5


def rp_kv_model(profile: str) -> Model:
    """The model beside a connector (reset_pause_models.RP_KV_Z3) under
    `profile`'s synchronous rules (RP_ENCODED_PROFILE)."""
    from flightcheck.verification.z3.profiles import profile_model
    from flightcheck.verification.z3.reset_pause_models import RP_KV_Z3
    encoded = RP_ENCODED_PROFILE[profile]
    return RP_KV_Z3 if RP_KV_Z3.cfg.profile == encoded else profile_model(RP_KV_Z3, encoded)


# The row of the model beside a connector: RP5 only. RP1-RP3 hold there too
# (tests/test_z3_reset_pause_kv.py), and RP4 breaks there as on the explicit
# reset-kv-async-k2: a reset of the running requests beside a parked load
# leaves its blocks held (vLLM raises: docs/vllm-kv-connector-findings.md).
RP_KV_PROPERTIES: tuple[str, ...] = tuple(RP5_FORMULA)


def reset_pause_rows(profile: str, depth: int = RP_BMC_DEPTH, time_budget: float | None = None) -> list:
    """RP1-RP4 on the model by k-induction and one step, and by BMC to
    `depth`, under `profile`'s synchronous rules, then RP5 so on the model
    beside a connector; the method names the model and the profile."""
    from flightcheck.verification.results import PropertyResult, kind_of
    encoded = RP_ENCODED_PROFILE[profile]
    note = "" if encoded == profile else f"; {profile}'s synchronous twin"
    rows = []
    for chosen, names in ((rp_model(profile), RP_PROPERTIES), (rp_kv_model(profile), RP_KV_PROPERTIES)):
        where = f" [{chosen.name.split('@')[0]}@{encoded}{note}]"
        for result in (rp_induction(chosen, time_budget), rp_bmc(chosen, depth, names, time_budget)):
            rows += [PropertyResult(p.name, kind_of(p.name), p.status, p.method + where, p.depth, p.seconds)
                     for p in result.properties if p.name in names]
    return rows

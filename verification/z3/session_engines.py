"""The streaming-session proofs in Z3 (docs/proofs.md, "Streaming
sessions"), on the engines of kv_engines.py:

* SS2-SS4 by k-induction (k = 1, `session_induction`): WF, the three
  session invariants, the auxiliary invariants SA1-SA10
  (encoding/session_invariants.py) and the S/A candidates that read the
  same beside sessions (`session_candidates`), one Houdini loop;
* SS1, a transition property, as a one-step consequence of what that loop
  kept (`ss1_one_step`): I(s) and T(s, s') imply SS1(s, s'), I the
  inductive conjunction, so SS1 holds on every step from a reachable state;
* SS1 bounded by BMC (`ss1_bmc`: every step of every path up to a depth),
  each violation replayed on the spec, whose own SS1 must fail there.
"""

from __future__ import annotations

import time

import z3
from flightcheck.spec import transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.session_invariants import (
    SESSION_AUXILIARY,
    SESSION_FORMULAS,
    ss1_old_output_never_bound,
)
from flightcheck.verification.z3.kv_engines import CANDIDATE, WF, _on, candidate_names, kv_bmc, kv_induction
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.results import EngineResult, EngineVerdict, ReplayMismatch, replay

SS1 = "SS1_old_output_never_bound"

# The encoding's S/A formulas (z3.induction.strengthening) left out of the
# session proof: those that read otherwise beside sessions (a session
# between turns keeps computed tokens and blocks while WAITING or parked,
# and a parked session is unfinished), which SA5-SA8 restate, and under
# async scheduling S6p and IA2, which the Houdini loop drops beside sessions
# (an old turn's decode still in flight behind a parked session; a new
# turn's max_tokens below the placeholders of the old one's). Every other
# candidate of the profile is offered as it is written (kv_engines.candidate_names).
SESSION_RESTATED: tuple[str, ...] = (
    "S1_counter_bounds", "S9_kv_ownership", "S10_queues_and_budgets", "IF0_in_flight_never_negative",
    "IF1_in_flight_counter", "IF2_stale_counter", "A2_waiting_never_ran", "A4_counts_nonnegative",
    "A10_inactive_has_no_counters", "S6p_async_decode_gating", "IA2_placeholders_within_max_tokens")


def session_candidates(cfg) -> list[str]:
    return [n for n in candidate_names(cfg) if n[len(CANDIDATE):] not in SESSION_RESTATED]


SESSION_PROPERTIES: tuple[str, ...] = tuple(SESSION_FORMULAS)


def session_auxiliary(cfg) -> list[str]:
    return [*SESSION_AUXILIARY, *session_candidates(cfg)]


def session_induction(model: Model, time_budget: float | None = None) -> EngineResult:
    """SS2-SS4 by 1-induction with SA1-SA10 and the session candidates of the profile."""
    return kv_induction(model, 1, list(SESSION_PROPERTIES), session_auxiliary(model.cfg), time_budget)


def session_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineResult:
    """SS2-SS4 (and WF) bounded to `depth` steps, or violated at the least depth (replayed on the spec)."""
    return kv_bmc(model, depth, list(SESSION_PROPERTIES), time_budget)


def ss1_one_step(model: Model, induction: EngineResult) -> EngineVerdict:
    """SS1 from the conjunction `induction` proved: I(s) AND T(s, s') AND NOT
    SS1(s, s') is unsat (proved), else unknown (a step from a state of I)."""
    started = time.perf_counter()
    kept = [p.name for p in induction.properties if p.status == "proved"]
    method = "one step of the k-induction invariant"
    system = System(model)
    step = system.step(0, 1)
    solver = z3.SolverFor("QF_BV")
    solver.add(step.constraints)
    solver.add(*[_on(system, n, system.frame(0)) for n in kept])
    answer = solver.check(z3.Not(system.build(ss1_old_output_never_bound, step)))
    if answer == z3.unsat:
        return EngineVerdict(SS1, "transition", "proved", method, 1, time.perf_counter() - started)
    message = "solver gave up" if answer == z3.unknown else \
        f"a step from a state of the invariant breaks it: {system.decode_or_dump(solver.model(), 0)}"
    return EngineVerdict(SS1, "transition", "unknown", method, 1, time.perf_counter() - started, message=message)


def ss1_bmc(model: Model, depth: int, time_budget: float | None = None) -> EngineVerdict:
    """SS1 on every step of every path of up to `depth` steps, or violated at
    the least depth, its trace replayed on the spec (whose SS1 must fail)."""
    started = time.perf_counter()
    system = System(model)
    solver = z3.SolverFor("QF_BV")
    solver.add(system.init(0))
    steps = []
    for t in range(1, depth + 1):
        step = system.step(t - 1, t)
        steps.append(step)
        solver.add(step.constraints)
        if time_budget is not None:
            solver.set("timeout", max(1, int((time_budget - (time.perf_counter() - started)) * 1000)))
        goal = system.build(ss1_old_output_never_bound, step)
        answer = solver.check(z3.Not(goal))
        if answer == z3.unknown:
            return EngineVerdict(SS1, "transition", "unknown", "bmc", t - 1, time.perf_counter() - started)
        if answer == z3.sat:
            return _ss1_violation(system, model, steps, solver.model(), t, started)
        solver.add(goal)
    return EngineVerdict(SS1, "transition", "bounded", "bmc", depth, time.perf_counter() - started)


def _ss1_violation(system: System, model: Model, steps: list, witness: z3.ModelRef, t: int,
                   started: float) -> EngineVerdict:
    actions = [system.decode_action(witness, st) for st in steps]
    states = [system.decode_or_dump(witness, i) for i in range(t + 1)]
    if any(isinstance(s, str) for s in states):
        raise ReplayMismatch(f"SS1: the solver's trace holds a frame that is not a spec state: {states}")
    concrete = replay(model, actions, states)
    with applied(model.mutant):
        spec_ss1 = next(p for p in transition_properties_for(model.cfg) if p.name == SS1)
        if spec_ss1.holds(concrete[-2], concrete[-1], actions[-1], model.cfg):
            raise ReplayMismatch(f"SS1: the encoding's violation at depth {t} holds in the spec")
    return EngineVerdict(SS1, "transition", "violated", "bmc", t, time.perf_counter() - started,
                         trace=actions, states=concrete)


# How deep BMC of the session model goes (the k-induction proof is unbounded;
# BMC gives each property a second, independent method).
SESSION_BMC_DEPTH = 6

# The profiles whose session model the Z3 rows cover (z3.session_models:
# the session alone under each profile with sessions, sync and async).
SESSION_Z3_PROFILES: tuple[str, ...] = ("vllm-0.33", "vllm-0.34", "vllm-0.33-async", "vllm-0.34-async")


def session_rows(profile: str, depth: int = SESSION_BMC_DEPTH, time_budget: float | None = None) -> list:
    """SS2-SS4 by 1-induction and by BMC to `depth`, and SS1 as a one-step
    consequence of the inductive invariant and by BMC, on the session model
    under `profile` (one of SESSION_Z3_PROFILES; else no rows); the method
    names the model."""
    from flightcheck.verification.results import PropertyResult
    from flightcheck.verification.z3.session_models import session_solo
    if profile not in SESSION_Z3_PROFILES:
        return []
    model = session_solo(profile)
    where = f" [{model.name}]"
    induction = session_induction(model, time_budget)
    verdicts = [*induction.properties, ss1_one_step(model, induction),
                *session_bmc(model, depth, time_budget).properties, ss1_bmc(model, depth, time_budget)]
    return [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
            for p in verdicts if p.kind != "auxiliary" and p.name != WF]

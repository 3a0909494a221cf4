"""BMC and k-induction of the KV connector's invariants on the connector
models (verification/z3/kv_models.py), on the encoding of
z3/encoding/connector.py, kv_schedule.py and kv_state.py.

    bmc(d)        = Init(s0) AND T(s0,s1) AND ... AND T(s_{d-1},s_d) AND not P(s_d)
    base(k)       = bmc(t) for every t < k
    step(k)       = I(s0) AND T(s0,s1) AND ... AND I(s_{k-1}) AND T(s_{k-1},s_k) AND not n(s_k)

I is the conjunction of the encoding's well-formedness (WF_encoding), the
KV invariants (encoding/kv_invariants.py KV_FORMULAS) and the connector
models' auxiliary invariants (KV_AUXILIARY); the Houdini loop drops every
conjunct a model of step(k) breaks (a counterexample to induction), and
what is left is inductive, hence proved in every reachable state (base(k)
unsat for it). Every violation BMC finds is decoded into spec actions and
replayed on the concrete spec, which must agree state for state and find
the same invariant broken (z3.results.replay): the encoding cannot report
a bug the spec does not have.

These are small engines of their own, not z3.bmc.engine's and
z3.induction.kinduction's: those run the spec's S-invariants with their
micro-step chains and strengthening, which speak of a scheduler without a
connector (S1, S9 and S10 read differently with one: spec/kv_invariants.py).
"""

from __future__ import annotations

import time
from typing import Iterable

import z3
from flightcheck.spec import invariants_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY, KV_FORMULAS
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.results import EngineResult, EngineVerdict, ReplayMismatch, replay

WF = "WF_encoding"


def kv_properties(model: Model) -> list[str]:
    """The KV invariants the model's profile has (spec.invariants_for), in the spec's order."""
    return [inv.name for inv in invariants_for(model.cfg) if inv.name in KV_FORMULAS]


def _formula(system: System, name: str, tag: int) -> z3.BoolRef:
    frame = system.frame(tag)
    if name == WF:
        return system.build(well_formed, frame)
    return system.build({**KV_FORMULAS, **KV_AUXILIARY}[name], frame)


def _kind(name: str) -> str:
    """A KV invariant's kind as the spec registers it; WF and the auxiliary ones: auxiliary."""
    from flightcheck.spec.invariants import KV_INVARIANTS, KV_LOAD_LIMIT
    for inv in (*KV_INVARIANTS, KV_LOAD_LIMIT):
        if inv.name == name:
            return inv.kind
    return kind_of(name)


def _spec_breaks(model: Model, name: str, state) -> bool:
    """The spec's own predicate `name` fails on `state` (the replayed trace's last)."""
    with applied(model.mutant):
        return any(inv.name == name and not inv.holds(state, model.cfg) for inv in invariants_for(model.cfg))


def kv_bmc(model: Model, depth: int, properties: Iterable[str] | None = None,
           time_budget: float | None = None) -> EngineResult:
    """Each property bounded to `depth` steps from the initial state, or
    violated at the smallest depth (its trace replayed on the spec)."""
    started = time.perf_counter()
    names = [WF, *(kv_properties(model) if properties is None else properties)]
    system = System(model)
    solver = z3.SolverFor("QF_BV")
    solver.add(system.init(0))
    rows: dict[str, EngineVerdict] = {}
    steps = []
    reached = 0
    for t in range(depth + 1):
        if t > 0:
            step = system.step(t - 1, t)
            steps.append(step)
            solver.add(step.constraints)
        if time_budget is not None:
            solver.set("timeout", max(1, int((time_budget - (time.perf_counter() - started)) * 1000)))
        while True:             # one query for every open property; a model names those it breaks
            open_names = [n for n in names if n not in rows]
            goals = {n: _formula(system, n, t) for n in open_names}
            answer = solver.check(z3.Not(z3.And(list(goals.values())))) if goals else z3.unsat
            if answer == z3.unknown:
                return _result(model, names, rows, "bmc", reached, started, budget_out=True)
            if answer == z3.unsat:
                solver.add(*goals.values())     # they hold at depth t: lemmas for the deeper queries
                break
            witness = solver.model()
            for n, goal in goals.items():
                if not z3.is_true(witness.eval(goal, model_completion=True)):
                    rows[n] = _violation(system, model, n, t, steps, witness, started)
        reached = t
    return _result(model, names, rows, "bmc", reached, started)


def _violation(system: System, model: Model, name: str, t: int, steps: list, witness: z3.ModelRef,
               started: float) -> EngineVerdict:
    """The verdict for a violation at depth t, its trace replayed on the spec."""
    actions = [system.decode_action(witness, step) for step in steps]
    states = [system.decode_or_dump(witness, i) for i in range(t + 1)]
    if any(isinstance(s, str) for s in states):
        raise ReplayMismatch(f"{name}: the solver's trace holds a frame that is not a spec state: {states}")
    concrete = replay(model, actions, states)
    if name != WF and not _spec_breaks(model, name, concrete[-1]):
        raise ReplayMismatch(f"{name}: the encoding's violation at depth {t} holds in the spec")
    return EngineVerdict(name, _kind(name), "violated", "bmc", t, time.perf_counter() - started,
                         trace=actions, states=concrete)


def _result(model: Model, names: list[str], rows: dict[str, EngineVerdict], method: str, depth: int,
            started: float, budget_out: bool = False) -> EngineResult:
    seconds = time.perf_counter() - started
    verdicts = [rows.get(name) or EngineVerdict(name, _kind(name), "unknown" if budget_out else "bounded", method,
                                                depth, seconds) for name in names]
    return EngineResult(model.name, method, seconds, depth, verdicts)


def kv_induction(model: Model, k: int = 1, properties: Iterable[str] | None = None,
                 auxiliary: Iterable[str] | None = None, time_budget: float | None = None) -> EngineResult:
    """Prove WF, the KV invariants and the auxiliary ones by k-induction, the
    Houdini way: base(k) drops (as violated) what fails within k-1 steps,
    step(k) drops (as unknown, with the counterexample to induction's
    action) what the rest does not keep; what is left is proved."""
    started = time.perf_counter()
    names = [WF, *(kv_properties(model) if properties is None else properties),
             *(KV_AUXILIARY if auxiliary is None else auxiliary)]
    method = f"k-induction (k={k})"
    base = kv_bmc(model, k - 1, [n for n in names if n != WF], time_budget)
    rows = {p.name: p for p in base.properties if p.status == "violated"}
    alive = [n for n in names if n not in rows]
    system = System(model)
    solver = z3.SolverFor("QF_BV")
    steps = [system.step(t, t + 1) for t in range(k)]
    for step in steps:
        solver.add(step.constraints)
    assume = {n: z3.Bool(f"assume:{n}") for n in names}
    for n in names:
        solver.add(z3.Implies(assume[n], z3.And([_formula(system, n, t) for t in range(k)])))
    if time_budget is not None:
        solver.set("timeout", max(1, int((time_budget - (time.perf_counter() - started)) * 1000)))
    changed = True
    while changed:
        changed = False
        for name in list(alive):
            if name not in alive:
                continue
            answer = solver.check(*[assume[n] for n in alive], z3.Not(_formula(system, name, k)))
            if answer == z3.unsat:
                continue
            changed = True
            broken = [name]
            if answer == z3.sat:
                witness = solver.model()
                broken = [n for n in alive if not z3.is_true(witness.eval(_formula(system, n, k),
                                                                          model_completion=True))]
                action = system.decode_action(witness, steps[-1])
                message = f"not inductive: {action} from {system.decode_or_dump(witness, k - 1)}"
            else:
                message = "solver gave up"
            for n in broken:
                rows[n] = EngineVerdict(n, _kind(n), "unknown", method, k, time.perf_counter() - started,
                                        message=message)
                alive.remove(n)
    seconds = time.perf_counter() - started
    for n in alive:
        rows[n] = EngineVerdict(n, _kind(n), "proved", method, k, seconds)
    return EngineResult(model.name, method, seconds, k, [rows[n] for n in names])

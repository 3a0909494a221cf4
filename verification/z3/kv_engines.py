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
from typing import Callable, Iterable

import z3
from flightcheck.spec import invariants_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.feature_formulas import AUXILIARY, FORMULAS
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.results import EngineResult, EngineVerdict, ReplayMismatch, replay

WF = "WF_encoding"


def kv_properties(model: Model) -> list[str]:
    """The feature invariants (the connector's, and every other feature's in
    encoding/feature_formulas.py) the model's profile has
    (spec.invariants_for), in the spec's order."""
    return [inv.name for inv in invariants_for(model.cfg) if inv.name in FORMULAS]


def _formula(system: System, name: str, tag: int) -> z3.BoolRef:
    return _on(system, name, system.frame(tag))


def _kind(name: str) -> str:
    """A feature invariant's kind as the spec registers it (any tuple or
    single Invariant spec/invariants.py defines); WF and the auxiliary ones:
    auxiliary."""
    from flightcheck.spec import invariants as spec_invariants
    for value in vars(spec_invariants).values():
        for inv in (value if isinstance(value, tuple) else (value,)):
            if isinstance(inv, spec_invariants.Invariant) and inv.name == name:
                return inv.kind
    return kind_of(name)


def _spec_breaks(model: Model, name: str, state) -> bool:
    """The spec's own predicate `name` fails on `state` (the replayed trace's last)."""
    with applied(model.mutant):
        return any(inv.name == name and not inv.holds(state, model.cfg) for inv in invariants_for(model.cfg))


# A property's goal at depth t, given the steps so far (a state formula on
# frame t, or a step formula on the last step), and whether the spec itself
# breaks it on the replayed trace (its states and actions): a feature whose
# properties are of steps (priority, reset and pause) passes its own.
Goal = Callable[[System, str, int, list], z3.BoolRef]
Breaks = Callable[[Model, str, list, list], bool]


def _state_goal(system: System, name: str, t: int, steps: list) -> z3.BoolRef:
    return _formula(system, name, t)


def _state_breaks(model: Model, name: str, states: list, actions: list) -> bool:
    return name == WF or _spec_breaks(model, name, states[-1])


def kv_bmc(model: Model, depth: int, properties: Iterable[str] | None = None,
           time_budget: float | None = None, *, goal: Goal = _state_goal, breaks: Breaks = _state_breaks,
           kind: Callable[[str], str] | None = None, with_wf: bool = True) -> EngineResult:
    """Each property (and WF, `with_wf`) bounded to `depth` steps from the
    initial state, or violated at the smallest depth (its trace replayed on
    the spec, which must break it too: `breaks`); `kind` names a row's kind
    (default: the spec's)."""
    started = time.perf_counter()
    names = [WF] * with_wf + [*(kv_properties(model) if properties is None else properties)]
    kind = kind or _kind
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
            goals = {n: goal(system, n, t, steps) for n in open_names}
            answer = solver.check(z3.Not(z3.And(list(goals.values())))) if goals else z3.unsat
            if answer == z3.unknown:
                return _result(model, names, rows, "bmc", reached, started, budget_out=True, kind=kind)
            if answer == z3.unsat:
                solver.add(*goals.values())     # they hold at depth t: lemmas for the deeper queries
                break
            witness = solver.model()
            for n, formula in goals.items():
                if not z3.is_true(witness.eval(formula, model_completion=True)):
                    rows[n] = _violation(system, model, n, t, steps, witness, started, breaks, kind)
        reached = t
    return _result(model, names, rows, "bmc", reached, started, kind=kind)


def _violation(system: System, model: Model, name: str, t: int, steps: list, witness: z3.ModelRef,
               started: float, breaks: Breaks = _state_breaks, kind: Callable[[str], str] | None = None) -> EngineVerdict:
    """The verdict for a violation at depth t, its trace replayed on the spec."""
    actions = [system.decode_action(witness, step) for step in steps]
    states = [system.decode_or_dump(witness, i) for i in range(t + 1)]
    if any(isinstance(s, str) for s in states):
        raise ReplayMismatch(f"{name}: the solver's trace holds a frame that is not a spec state: {states}")
    concrete = replay(model, actions, states)
    if not breaks(model, name, concrete, actions):
        raise ReplayMismatch(f"{name}: the encoding's violation at depth {t} holds in the spec")
    return EngineVerdict(name, (kind or _kind)(name), "violated", "bmc", t, time.perf_counter() - started,
                         trace=actions, states=concrete)


def _result(model: Model, names: list[str], rows: dict[str, EngineVerdict], method: str, depth: int,
            started: float, budget_out: bool = False, kind: Callable[[str], str] | None = None) -> EngineResult:
    seconds = time.perf_counter() - started
    kind = kind or _kind
    verdicts = [rows.get(name) or EngineVerdict(name, kind(name), "unknown" if budget_out else "bounded", method,
                                                depth, seconds) for name in names]
    return EngineResult(model.name, method, seconds, depth, verdicts)


def kv_induction(model: Model, k: int = 1, properties: Iterable[str] | None = None,
                 auxiliary: Iterable[str] | None = None, time_budget: float | None = None,
                 with_wf: bool = True) -> EngineResult:
    """Prove WF, the KV invariants and the auxiliary ones by k-induction, the
    Houdini way: base(k) drops (as violated) what fails within k-1 steps,
    step(k) drops (as unknown, with the counterexample to induction) what
    the rest does not keep; what is left is proved. step(k) is asked action
    by action: frames 0..k-1 joined by T, the conjuncts assumed on them, the
    action's guard on frame k-1, and each conjunct on the action's effect (a
    term of frame k-1 and the step's choices), so each query holds one
    action's circuit only (z3.induction.kinduction does the same). Without
    `with_wf` WF_encoding is not offered: the conjuncts must be inductive
    on frames the encoding's well-formedness does not constrain."""
    started = time.perf_counter()
    names = [WF] * with_wf + [*(kv_properties(model) if properties is None else properties),
             *([*KV_AUXILIARY, *KV_CANDIDATES] if auxiliary is None else auxiliary)]
    method = f"k-induction (k={k})"
    base = kv_bmc(model, k - 1, [n for n in names if n != WF], time_budget, with_wf=with_wf)
    rows = {p.name: p for p in base.properties if p.status == "violated"}
    alive = [n for n in names if n not in rows]
    system = System(model)
    solvers = _step_solvers(system, k, names)
    deadline = None if time_budget is None else started + time_budget
    changed = True
    while changed:
        changed = False
        for action, (solver, assume, goal) in solvers.items():
            for name in list(alive):
                if name not in alive:
                    continue
                if deadline is not None:
                    solver.set("timeout", max(1, int((deadline - time.perf_counter()) * 1000)))
                answer = solver.check(*[assume[n] for n in alive], z3.Not(goal[name]))
                if answer == z3.unsat:
                    continue
                changed = True
                broken = [name]
                message = "solver gave up"
                if answer == z3.sat:
                    witness = solver.model()
                    broken = [n for n in alive if not z3.is_true(witness.eval(goal[n], model_completion=True))]
                    message = f"not inductive under action {action} from {system.decode_or_dump(witness, k - 1)}"
                for n in broken:
                    rows[n] = EngineVerdict(n, _kind(n), "unknown", method, k, time.perf_counter() - started,
                                            message=message)
                    alive.remove(n)
    seconds = time.perf_counter() - started
    for n in alive:
        rows[n] = EngineVerdict(n, _kind(n), "proved", method, k, seconds)
    return EngineResult(model.name, method, seconds, k, [rows[n] for n in names])


def _step_solvers(system: System, k: int, names: list[str]) -> dict[int, tuple]:
    """For each action a: (its solver, the literal assuming each conjunct on
    frames 0..k-1, each conjunct on a's effect from frame k-1)."""
    transitions = system.transitions(k - 1)
    prefix = [c for t in range(k - 1) for c in system.step(t, t + 1).constraints]
    assume = {n: z3.Bool(f"assume:{n}") for n in names}
    hypotheses = [z3.Implies(assume[n], z3.And([_formula(system, n, t) for t in range(k)])) for n in names]
    out = {}
    for action, (guard, effect) in enumerate(zip(transitions.guards, transitions.effects)):
        solver = z3.SolverFor("QF_BV")
        circuit = transitions.sched_defs if action == SCHEDULE else []    # only schedule reads its circuit
        solver.add(prefix + circuit + transitions.defs + transitions.legal + hypotheses)
        solver.add(guard, transitions.choices.act == action)
        out[action] = (solver, assume, {n: _on(system, n, effect) for n in names})
    return out


def _on(system: System, name: str, state) -> z3.BoolRef:
    """Conjunct `name` on a symbolic state (an action's effect)."""
    if name == WF:
        return system.build(well_formed, state)
    if name.startswith(CANDIDATE):
        return system.build(_candidates(system.layout.cfg)[name], state)
    return system.build({**FORMULAS, **AUXILIARY}[name], state)


# The encoding's formulas of the S-invariants and its strengthening
# invariants (z3.induction.strengthening) are written for a scheduler without
# a connector; on a connector model they are only candidates, each kept by
# the Houdini loop when the others make it inductive, dropped otherwise.
CANDIDATE = "candidate:"


def _candidates(cfg) -> dict:
    from flightcheck.verification.z3.encoding.invariants import NEEDS_SCHEDULE, invariant_formulas_for
    from flightcheck.verification.z3.induction.strengthening import AUXILIARY, auxiliary_for
    out = {CANDIDATE + n: (lambda layout, s, f=f: f(layout, s, None))
           for n, f in invariant_formulas_for(cfg).items() if n not in NEEDS_SCHEDULE}
    out.update({CANDIDATE + n: AUXILIARY[n] for n in auxiliary_for(cfg)})
    return out


def candidate_names(cfg) -> list[str]:
    return list(_candidates(cfg))


# The candidates the connector models' proof keeps (every one holds there:
# the Houdini loop keeps them all on kv-async); those the connector changes
# (S1, S9, S10, IF0-IF2, A10) are restated in KV_AUXILIARY instead.
KV_CANDIDATES: tuple[str, ...] = tuple(CANDIDATE + n for n in (
    "S2_length_cap", "S3_contiguous_coverage", "S5_one_sample_per_prefill", "S6_decode_gating",
    "S7_output_binding", "S8_spec_accounting", "S11_pipeline_depth", "L1_running_request_unblocked", "L3_drain",
    "IF3_no_stale_resumption", "A1_new_is_pristine", "A2_waiting_never_ran", "A3_finished_is_released",
    "A4_counts_nonnegative", "A5_snapshots_well_formed", "A6_drafts_ride_on_last_live_entry",
    "A7_unlabelled_blocks_are_private", "A8_one_live_entry_per_request", "A9_held_blocks_are_not_free",
    "A11_stale_entries_come_first"))


def step_consequences(model: Model, kept: list[str], formulas: dict,
                      kind: Callable[[str], str] = lambda name: "transition") -> list[EngineVerdict]:
    """Each schedule-step property P of `formulas` (name -> formula of a step)
    proved when I(s) AND schedule's guard and effect from s AND NOT P is
    unsat, I the conjuncts `kept` (P holds of every other action by its first
    clause); else unknown, with the state the solver found. Never vacuous: I(s)
    must admit a schedule step."""
    from types import SimpleNamespace
    started = time.perf_counter()
    system = System(model)
    s, tr = system.frame(0), system.transitions(0)
    solver = z3.SolverFor("QF_BV")
    solver.add(tr.sched_defs + tr.defs + tr.legal + [_on(system, n, s) for n in kept])
    solver.add(tr.guards[SCHEDULE], tr.choices.act == SCHEDULE)
    st = SimpleNamespace(before=s, after=tr.effects[SCHEDULE], choices=tr.choices, sched=tr.sched)
    method = "one step from the k-induction invariant"
    if solver.check() != z3.sat:
        return [EngineVerdict(n, kind(n), "unknown", method, 1, time.perf_counter() - started,
                              message="I(s) admits no schedule step") for n in formulas]
    out = []
    for name, formula in formulas.items():
        answer = solver.check(z3.Not(system.build(formula, st)))
        message = "" if answer == z3.unsat else "solver gave up" if answer == z3.unknown else \
            f"I(s) and a schedule step do not imply it: from {system.decode_or_dump(solver.model(), 0)}"
        out.append(EngineVerdict(name, kind(name), "proved" if answer == z3.unsat else "unknown", method, 1,
                                 time.perf_counter() - started, message=message))
    return out

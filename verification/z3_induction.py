"""Unbounded proofs by k-induction with strengthening invariants.

    base(k) = Init(s0) AND T(s0,s1) AND ... AND T(s_{k-2},s_{k-1}) AND OR_{t<k} not I(s_t)
    step(k) = I(s0) AND T(s0,s1) AND ... AND I(s_{k-1}) AND T(s_{k-1},s_k) AND not I(s_k)

where I is the conjunction of the spec's invariants, the auxiliary
(strengthening) invariants of `z3_strengthening`, and the encoding's
well-formedness (WF_encoding). base(k) and step(k) both unsatisfiable prove
I, hence every conjunct, in every reachable state.

The last step is not taken through next-frame variables: for each action a,
s_k is the term effect_a(s_{k-1}), so a conjunct that an action leaves alone
is the very same term on both sides. The step query is split by action and by
conjunct (the solver proves many small implications much faster than one
big one). The conjunction is found the Houdini way: a CTI (a counterexample
to induction) drops every conjunct it violates, and the rest is re-checked
until what is left is inductive; the CTI is decoded into spec states. The
transition properties (S4, S7, S12) are then proved as
I(s) AND T(s,s') => Q(s,s').
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Iterable

import z3

from flightcheck.spec import State

from .models import Model
from .z3_actions import ABORT, ARRIVE, COMPLETE, SCHEDULE
from .z3_invariants import INVARIANT_FORMULAS, NEEDS_SCHEDULE, TRANSITION_FORMULAS, well_formed
from .z3_results import EngineResult, PropertyResult, kind_of
from .z3_strengthening import AUXILIARY
from .z3_system import Step, System
from .z3_terms import V, arithmetic

ACTIONS = {ARRIVE: "arrive", SCHEDULE: "schedule", COMPLETE: "complete_oldest", ABORT: "abort"}


def formula(system: System, name: str, s, sched=None) -> z3.BoolRef:
    """Conjunct `name` on a symbolic state (a frame or an action's effect)."""
    if name == "WF_encoding":
        return system.build(well_formed, s)
    if name in INVARIANT_FORMULAS:
        return system.build(INVARIANT_FORMULAS[name], s, sched)
    return system.build(AUXILIARY[name], s)


@dataclass
class _Query:
    """step(k) for one action: the solver, and each conjunct on the action's effect."""

    action: int
    goal: dict          # conjunct name -> formula on effect_a(s_{k-1})
    guard: z3.BoolRef   # literal: the action is taken


def k_induction(system: System, k: int, names: list[str]):
    """step(k) on one solver: frames 0..k-1 with T between them, every
    conjunct assumed on them (under a literal each), and the last step's
    effects per action."""
    solver = z3.SolverFor("QF_BV") if system.lay.width else z3.SolverFor("QF_LIA")
    for t in range(k - 1):
        solver.add(system.step(t, t + 1).constraints)
    tr = system.transitions(k - 1)
    solver.add(tr.sched_defs + tr.defs + tr.legal)
    assume = {}
    for n in names:
        lit = z3.Bool(f"assume:{n}")
        solver.add(z3.Implies(lit, z3.And([formula(system, n, system.frame(t), system.sched(t)[0])
                                           for t in range(k)])))
        assume[n] = lit
    queries = []
    for a in ACTIONS:
        eff = tr.effects[a]
        sched1 = None
        if any(n in NEEDS_SCHEDULE for n in names):
            sched1, defs = system.schedule_of(eff, f"effect{a}@{k}")
            solver.add(defs)
        g = z3.Bool(f"takes:{ACTIONS[a]}")
        solver.add(z3.Implies(g, z3.And(tr.guards[a], tr.choices.act == a)))
        queries.append(_Query(a, {n: formula(system, n, eff, sched1) for n in names}, g))
    return solver, assume, queries, tr


def _base(system: System, k: int, names: list[str]) -> dict[str, tuple]:
    """Conjuncts that fail within k-1 steps of the initial state: name -> (depth, model)."""
    failed = {}
    solver = z3.SolverFor("QF_BV") if system.lay.width else z3.SolverFor("QF_LIA")
    solver.add(system.init(0))
    for t in range(k):
        if t > 0:
            solver.add(system.step(t - 1, t).constraints)
        solver.add(system.sched(t)[1])
        for n in names:
            f = formula(system, n, system.frame(t), system.sched(t)[0])
            if n not in failed and solver.check(z3.Not(f)) == z3.sat:
                failed[n] = (t, solver.model())
    return failed


def prove_by_induction(model: Model, k: int = 1, invariants: Iterable[str] | None = None,
                       auxiliary: Iterable[str] | None = None, time_budget: float | None = None) -> EngineResult:
    """Prove `invariants` (default: all of the spec's) and the transition
    properties with the auxiliary invariants by k-induction.

    Returns one row per conjunct and transition property: proved, or unknown
    with a CTI (state before, action, state after) when the Houdini loop had to
    drop it, or violated when it fails within k-1 steps of the initial state."""
    t0 = time.perf_counter()
    system = System(model)
    names = ["WF_encoding", *(INVARIANT_FORMULAS if invariants is None else invariants),
             *(AUXILIARY if auxiliary is None else auxiliary)]
    rows: dict[str, PropertyResult] = {}
    method = f"k-induction (k={k})"
    for n, (depth, m) in _base(system, k, names).items():
        rows[n] = PropertyResult(n, kind_of(n), "violated", method + " base", depth, time.perf_counter() - t0,
                                 states=[system.decode_or_dump(m, depth)],
                                 message="fails within k-1 steps of the initial state")
    solver, assume, queries, tr = k_induction(system, k, names)
    alive = [n for n in names if n not in rows]

    def left_ms() -> int | None:
        return None if time_budget is None else max(1, int((time_budget - (time.perf_counter() - t0)) * 1000))

    changed = True
    while changed:
        changed = False
        for q in queries:
            for n in list(alive):
                if n not in alive:
                    continue
                if left_ms() is not None:
                    solver.set("timeout", left_ms())
                r = solver.check(*[assume[x] for x in alive], q.guard, z3.Not(q.goal[n]))
                if r == z3.unsat:
                    continue
                cti, failing = None, [n]
                if r == z3.sat:
                    m = solver.model()
                    cti = (system.decode_or_dump(m, k - 1), system.decode_action(m, _step_of(system, tr, q.action)),
                           _effect_state(system, m, tr, q.action))
                    failing = [x for x in alive if not z3.is_true(m.eval(q.goal[x], model_completion=True))]
                for x in failing:
                    rows[x] = PropertyResult(x, kind_of(x), "unknown", method, k, time.perf_counter() - t0, cti=cti,
                                             message=f"not inductive under {ACTIONS[q.action]}" if r == z3.sat
                                             else "solver gave up")
                    alive.remove(x)
                changed = True
    seconds = time.perf_counter() - t0
    for n in alive:
        rows[n] = PropertyResult(n, kind_of(n), "proved", method, k, seconds)
    out = [rows[n] for n in names]
    for name, fn in TRANSITION_FORMULAS.items():
        status, cti = "proved", None
        for q in queries:
            st = _step_of(system, tr, q.action)
            if left_ms() is not None:
                solver.set("timeout", left_ms())
            r = solver.check(*[assume[x] for x in alive], q.guard, z3.Not(system.build(fn, st)))
            if r != z3.unsat:
                status = "unknown"
                if r == z3.sat:
                    m = solver.model()
                    cti = (system.decode_or_dump(m, k - 1), system.decode_action(m, st),
                           _effect_state(system, m, tr, q.action))
                break
        out.append(PropertyResult(name, "invariant", status, method, k, time.perf_counter() - t0, cti=cti))
    return EngineResult(model.name, method, time.perf_counter() - t0, k, out)


def _step_of(system: System, tr, action: int) -> Step:
    """The last step under `action`, with its effect as the next state."""
    with arithmetic(system.lay.width):
        ch = dataclasses.replace(tr.choices, act=V(action))
    return Step(tr.before, tr.effects[action], ch, tr.sched, tr.completion, [])


def _effect_state(system: System, m: z3.ModelRef, tr, action: int) -> State | str:
    from .z3_state import decode, NotRepresentable
    try:
        return decode(system.lay, m, tr.effects[action])
    except (NotRepresentable, IndexError) as e:
        return f"<not a spec state: {e}>"


def describe_cti(cti: tuple) -> str:
    from flightcheck.spec import describe
    before, action, after = cti
    show = [x if isinstance(x, str) else describe(x) for x in (before, after)]
    return f"  before: {show[0]}\n  action: {action}\n  after:  {show[1]}"

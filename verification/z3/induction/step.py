"""step(k) of a k-induction proof as solver queries (kinduction.py runs the
proof): for each action, the frames 0..k-1 with every conjunct assumed under
a literal, the action's guard, and each conjunct on the action's effect
(`StepQuery`: a lean solver first, the full one for the CTI); and the
micro-step chains of `schedule` and `complete_oldest` (z3.induction.microsteps)
that prove most conjuncts without the one-query form."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable

import z3
from flightcheck.verification.z3.encoding.actions import (
    ABORT,
    ARRIVE,
    COMPLETE,
    SCHEDULE,
    complete_guard,
)
from flightcheck.verification.z3.encoding.invariants import (
    ALL_INVARIANT_FORMULAS,
    NEEDS_SCHEDULE,
    well_formed,
)
from flightcheck.verification.z3.encoding.schedule import SchedResult
from flightcheck.verification.z3.encoding.state import SState
from flightcheck.verification.z3.encoding.system import System, Transitions
from flightcheck.verification.z3.encoding.terms import arithmetic, eq
from flightcheck.verification.z3.induction.grammar import is_candidate, predicate
from flightcheck.verification.z3.induction.microsteps import (
    SPLIT,
    Chain,
    MicroChain,
    batch_facts,
    completion_facts,
)
from flightcheck.verification.z3.induction.strengthening import AUXILIARY

ACTIONS = {ARRIVE: "arrive", SCHEDULE: "schedule", COMPLETE: "complete_oldest", ABORT: "abort"}


def formula(system: System, name: str, state: SState, schedule: SchedResult | None = None) -> z3.BoolRef:
    """Conjunct `name` on a symbolic state (a frame or an action's effect)."""
    if name == "WF_encoding":
        return system.build(well_formed, state)
    if name in ALL_INVARIANT_FORMULAS:
        return system.build(ALL_INVARIANT_FORMULAS[name], state, schedule)
    if is_candidate(name):
        return system.build(predicate(name), state)
    if name in AUXILIARY:
        return system.build(AUXILIARY[name], state)
    # a feature's invariant or auxiliary one (encoding/feature_formulas.py),
    # offered beside the base conjuncts (z3/unwritten_engines.py, KV8)
    from flightcheck.verification.z3.encoding import feature_formulas
    return system.build({**feature_formulas.FORMULAS, **feature_formulas.AUXILIARY}[name], state)


def solver_for(system: System) -> z3.Solver:
    """A solver for the system's arithmetic: bit-vectors or integers."""
    return z3.SolverFor("QF_BV") if system.layout.width else z3.SolverFor("QF_LIA")


# A lean query the incremental solver has not settled within this many
# milliseconds is split into its top-level conjuncts (or, when it has none,
# asked again of a fresh solver): with 8 requests, `complete_oldest` against
# S3 as one query ran for over ten minutes; request by request it takes
# under a second each.
INCREMENTAL_MS = 30_000


@dataclass
class StepQuery:
    """step(k) for one action: its solvers, and each conjunct on the action's effect.

    A conjunct is first asked of a lean solver: the same step without the
    hypotheses that call `schedule` on the frame (L2) and, for the other
    actions, without the schedule circuit itself. Fewer hypotheses only
    admit more models, so its unsat is a proof; when it is not unsat, the
    full solver decides (and gives the CTI). With 8 requests, assuming L2
    makes even an `arrive` query reason through the whole schedule circuit:
    such a query ran for minutes where the lean one takes a second."""

    action: int
    goal: dict[str, z3.BoolRef]         # conjunct name -> formula on effect_a(s_{k-1})
    guard: z3.BoolRef                   # literal: the action is taken
    solvers: dict[str, z3.Solver]       # conjunct name -> the full solver that checks it
    parts: dict[str, list[z3.BoolRef]]  # conjunct name -> its clauses, for the big ones (SPLIT)
    new_lean_solver: Callable[[], z3.Solver]
    lean_solver: z3.Solver | None = None    # the incremental lean solver, once made
    timeout_ms: int | None = None

    def solver(self, name: str) -> z3.Solver:
        return self.solvers[name]

    def check(self, name: str, assumptions: list[z3.BoolRef]) -> z3.CheckSatResult:
        """Can the action break conjunct `name`? Clause by clause for a split
        one (many small queries beat one big disjunction)."""
        return self._check_each(name, assumptions, self.parts.get(name, [self.goal[name]]))

    def _check_each(self, name: str, assumptions: list[z3.BoolRef], claims: list[z3.BoolRef]) -> z3.CheckSatResult:
        """unsat when no claim can be broken; else sat or unknown for the first that is not refuted."""
        for claim in claims:
            answer = self.check_formula(name, assumptions, claim)
            if answer != z3.unsat:
                return answer
        return z3.unsat

    def check_formula(self, name: str, assumptions: list[z3.BoolRef], claim: z3.BoolRef) -> z3.CheckSatResult:
        """Can the action break `claim`? Lean first, then in full (which gives the CTI)."""
        question = [*assumptions, self.guard, z3.Not(claim)]
        if name not in NEEDS_SCHEDULE:
            if self.lean_solver is None:
                self.lean_solver = self.new_lean_solver()
            answer = self._ask(self.lean_solver, question, INCREMENTAL_MS)
            if answer == z3.unknown and z3.is_and(claim):
                return self._check_each(name, assumptions, claim.children())
            if answer == z3.unknown:
                answer = self._ask(self.new_lean_solver(), question)
            if answer == z3.unsat:
                return answer
        return self._ask(self.solvers[name], question)

    def _ask(self, solver: z3.Solver, question: list[z3.BoolRef], cap_ms: int | None = None) -> z3.CheckSatResult:
        limits = [ms for ms in (cap_ms, self.timeout_ms) if ms is not None]
        if limits:
            solver.set("timeout", min(limits))
        return solver.check(*question)


@dataclass(frozen=True)
class InductionStep:
    """step(k), as `k_induction` builds it: a literal per conjunct that assumes
    it on frames 0..k-1, one `StepQuery` per action (in `ACTIONS` order), and
    the last step's transitions (each action's guard and effect)."""

    assume: dict[str, z3.BoolRef]
    queries: list[StepQuery]
    transitions: Transitions

    def assumptions(self, names: Iterable[str]) -> list[z3.BoolRef]:
        """The literals that assume `names` on the frames."""
        return [self.assume[name] for name in names]


def k_induction(system: System, k: int, names: list[str]) -> InductionStep:
    """step(k) as one small solver per action (and one more per action for
    the conjuncts that call `schedule` on the next state): frames 0..k-1 with
    T between them, every conjunct assumed on them under a literal each, and
    the action's guard under a literal. Keeping each action's circuit (and
    the next state's schedule circuit) out of the other queries is what
    keeps them fast."""
    transitions = system.transitions(k - 1)
    assume = {name: z3.Bool(f"assume:{name}") for name in names}

    def assumed_on_frames(selected: list[str]) -> list[z3.BoolRef]:
        """assume[n] -> n(s_0) AND ... AND n(s_{k-1}), for each selected n."""
        return [z3.Implies(assume[name], z3.And([formula(system, name, system.frame(t), system.sched(t)[0])
                                                 for t in range(k)])) for name in selected]

    hypotheses = assumed_on_frames(names)
    lean_hypotheses = assumed_on_frames([name for name in names if name not in NEEDS_SCHEDULE])
    prefix = [c for t in range(k - 1) for c in system.step(t, t + 1).constraints]
    queries = []
    for action in ACTIONS:
        effect = transitions.effects[action]
        takes = z3.Bool(f"takes:{ACTIONS[action]}")

        def new_solver(lean: bool = False, action: int = action, takes: z3.BoolRef = takes) -> z3.Solver:
            solver = solver_for(system)
            circuit = [] if lean and action != SCHEDULE else transitions.sched_defs
            solver.add(prefix + circuit + transitions.defs + transitions.legal
                       + (lean_hypotheses if lean else hypotheses))
            solver.add(z3.Implies(takes, z3.And(transitions.guards[action], transitions.choices.act == action)))
            return solver

        main_solver, next_schedule, solvers = new_solver(), None, {}
        if any(name in NEEDS_SCHEDULE for name in names):
            next_schedule, schedule_definitions = system.schedule_of(effect, f"effect{action}@{k}")
            with_next_schedule = new_solver()
            with_next_schedule.add(schedule_definitions)
        for name in names:
            solvers[name] = with_next_schedule if name in NEEDS_SCHEDULE else main_solver
        parts = {name: list(system.build(SPLIT[name], effect).values()) for name in names if name in SPLIT}
        goal = {name: formula(system, name, effect, next_schedule) for name in names}
        queries.append(StepQuery(action, goal, takes, solvers, parts, functools.partial(new_solver, lean=True)))
    return InductionStep(assume, queries, transitions)


def chains(system: System, t: int, names: list[str]) -> dict[int, MicroChain]:
    """schedule's and complete_oldest's steps from frame t, micro-step by
    micro-step (z3.induction.microsteps)."""
    frame, transitions = system.frame(t), system.transitions(t)
    schedule, completion = transitions.sched, transitions.completion
    plain = [name for name in names if name not in NEEDS_SCHEDULE]
    flag_definitions = [d for d in transitions.defs
                        if any(d.arg(0).eq(flag) for flag in completion.samples_here if z3.is_const(flag))]
    with arithmetic(system.layout.width):
        given_complete = [complete_guard(system.layout, frame), eq(transitions.choices.act, COMPLETE)]
    chain_of = {
        SCHEDULE: Chain(schedule.trail[0], schedule.micro, lambda acc: acc.state,
                        lambda acc, _: system.build(batch_facts, acc, frame), [schedule.enabled],
                        schedule.launch_defs + [schedule.result], "schedule"),
        COMPLETE: Chain(completion.start, completion.micro, lambda state: state,
                        lambda state, taken: system.build(completion_facts, state, frame, taken),
                        [*given_complete, *transitions.legal, *flag_definitions], [],
                        "complete_oldest"),
    }
    state_conjuncts = {name: (lambda state, name=name: formula(system, name, state)) for name in plain}
    return {action: MicroChain(system.build, chain, state_conjuncts,
                               lambda alive: [formula(system, name, frame) for name in alive if name in plain],
                               lambda: solver_for(system))
            for action, chain in chain_of.items()}

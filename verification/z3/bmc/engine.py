"""Bounded model checking of a `Model` with Z3, incremental and shortest-first.

    unrolling(k) = Init(s0) AND T(s0, s1) AND ... AND T(s_{k-1}, s_k)
    bmc(k)       = unrolling(k) AND OR_P not P(s_k)        (state properties)
                                AND OR_Q not Q(s_{k-1}, s_k) (transition properties)
    cover(k)     = unrolling(k) AND OR_S target_S(s_k)       ("sometimes")

One solver holds the unrolling; each depth adds one frame and one step, and
each query is asked under a fresh assumption literal, so a property is first
violated (or a target first reached) at the smallest depth, and every
counterexample is a shortest one. Each trace is decoded into spec actions and
replayed on the concrete spec, which must agree state for state and must
itself find the property broken. What a run checks, and how, is a
`BmcOptions`; each step of the loop over the depths (check the properties,
record a violation, assume what held, check the targets, record a reach,
finish the rows) is a method of `_BmcRun`, its formula in its docstring.

`bmc_split` (parallel.py) shares the paths among processes: each runs this
BMC on the paths of one `Cube` (cubes.py: the label of one early step), and
the parts' results merge into one (a property holds to the depth every part
reached; a violation or target is reported at the smallest depth any part
found it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import z3
from flightcheck.spec import SOMETIMES, Action, Config, State
from flightcheck.spec.sometimes import ASYNC_SOMETIMES
from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.bmc.cubes import Cube
from flightcheck.verification.z3.bmc.reduction import (
    check_reducible,
    peephole,
    twin_order,
)
from flightcheck.verification.z3.encoding.invariants import (
    ALL_INVARIANT_FORMULAS,
    INVARIANT_FORMULAS,
    invariant_formulas_for,
    well_formed,
)
from flightcheck.verification.z3.encoding.sometimes import (
    ASYNC_SOMETIMES_FORMULAS,
    SCHEDULE_SOMETIMES_FORMULAS,
    SOMETIMES_FORMULAS,
    STEP_SOMETIMES_FORMULAS,
    VERIFICATION_SOMETIMES,
    verification_target_applies,
)
from flightcheck.verification.z3.encoding.transitions import TRANSITION_FORMULAS
from flightcheck.verification.z3.encoding.system import Step, System
from flightcheck.verification.z3.encoding.terms import arithmetic
from flightcheck.verification.z3.induction.strengthening import AUXILIARY, auxiliary_for
from flightcheck.verification.z3.results import (
    EngineResult,
    EngineVerdict,
    ReplayMismatch,
    concrete_check,
    replay,
)


def unrolling(system: System, k: int) -> list[z3.BoolRef]:
    """Init(s0) AND T(s0,s1) AND ... AND T(s_{k-1},s_k) (with schedule's definitions of s_k)."""
    constraints = system.init(0)
    for t in range(k):
        constraints += system.step(t, t + 1).constraints
    return constraints + system.sched(k)[1]


def default_properties(cfg: Config | None = None) -> list[str]:
    """Every state invariant and every transition property of the spec (of
    cfg's profile: IF1-IF3 where it keeps stale-output counters)."""
    return list(INVARIANT_FORMULAS if cfg is None else invariant_formulas_for(cfg)) + list(TRANSITION_FORMULAS)


def applicable_sometimes(model: Model) -> list[str]:
    """The "sometimes" targets that make sense for the model's configuration."""
    labels = [label for prompt in model.prompts for label in set(prompt.labels)]
    shares_prefix = len(labels) != len(set(labels))     # a duplicate needs two prompts with one label
    return [target.name for target in SOMETIMES if target.is_applicable(model.cfg, shares_prefix)] + \
        [target.name for target in VERIFICATION_SOMETIMES if verification_target_applies(target, model.cfg)]


class _Unrolling:
    """The incremental solver: frames 0..depth, steps between them.

    Each open property P has a literal `held[P]`; once BMC has shown that P
    holds at every state within d steps, `held[P] -> P(s_t)` is added for
    t <= d. Queries assume the literals of the properties still open, so the
    solver gets every invariant not yet refuted as a lemma on the prefix
    (sound: a path violating an open P earlier would have refuted P at a
    smaller depth), and dropping a refuted P's literal releases it."""

    def __init__(self, model: Model, seed: int = 0, reduce: bool = False, cube: Cube | None = None) -> None:
        if reduce:
            check_reducible(model)
        self.reduce = reduce
        self.cube = cube
        self.system = System(model)
        # Bit-vectors go to Z3's incremental SAT solver (bit-blasted once, then
        # CDCL with assumptions), far faster here than integer arithmetic.
        self.solver = z3.SolverFor("QF_BV")
        self.solver.set("random_seed", seed)
        self.steps: list[Step] = []
        self.depth = 0
        self.held: dict[str, z3.BoolRef] = {}
        self._num_queries = 0
        self.solver.add(self.system.init(0))
        self.solver.add(self.system.sched(0)[1])

    def extend(self) -> None:
        """One more step: T(s_d, s_{d+1}), with the reductions' and the cube's constraints."""
        step = self.system.step(self.depth, self.depth + 1, with_sched_defs=False)
        self.solver.add(step.constraints)
        self.steps.append(step)
        self.depth += 1
        self.solver.add(self.system.sched(self.depth)[1])
        if self.reduce:
            self.solver.add(twin_order(self.system, self.depth))
            if self.depth >= 3:     # pair (d-3, d-2): never the last step (z3.bmc.reduction)
                self.solver.add(peephole(self.system, self.steps[-3], self.steps[-2]))
        if self.cube is not None and self.depth == self.cube.at + 1:
            with arithmetic(self.system.layout.width):
                self.solver.add(self.cube.formula(self.steps[self.cube.at]))

    def holds(self, name: str, formula: z3.BoolRef) -> None:
        """Record that `name` holds at the current depth (as a lemma)."""
        literal = self.held.setdefault(name, z3.Bool(f"held:{name}"))
        self.solver.add(z3.Implies(literal, formula))

    def query(self, goal: z3.BoolRef, timeout_ms: int | None, open_names: list[str]) -> z3.CheckSatResult:
        """Is `goal` satisfiable at the current depth, with the open properties as lemmas?"""
        self._num_queries += 1
        literal = z3.Bool(f"query#{self._num_queries}")
        self.solver.add(z3.Implies(literal, goal))
        if timeout_ms is not None:
            self.solver.set("timeout", max(1, timeout_ms))
        return self.solver.check(literal, *[self.held[name] for name in open_names if name in self.held])

    def counts(self) -> dict[str, int]:
        """The SAT solver's conflicts and propagations so far."""
        statistics = self.solver.statistics()
        value = {key: statistics.get_key_value(key) for key in statistics.keys()}
        return {"conflicts": int(value.get("sat conflicts", 0)),
                "propagations": int(value.get("sat propagations 2ary", 0) + value.get("sat propagations nary", 0))}

    def trace(self, witness: z3.ModelRef) -> tuple[list[Action], list[State]]:
        """The solver's path as spec actions and the states between them."""
        actions = [self.system.decode_action(witness, step) for step in self.steps]
        states = [self.system.decode(witness, t) for t in range(self.depth + 1)]
        return actions, states


@dataclass(frozen=True)
class BmcOptions:
    """What one BMC run checks, and how (the knobs of `bmc` and `bmc_split`).

    `properties`: invariant and transition-property names (None: all of them);
    `sometimes`: "sometimes" targets for cover queries (None: every one
    applicable to the model); `time_budget`: seconds for the whole run (None:
    no limit); `stop_at_first`: return at the first violation of a spec
    property (mutant hunting); `seed`: the SAT solver's random seed;
    `lemmas`: also check the auxiliary invariants of z3.induction.strengthening
    and the encoding's well-formedness (rows of kind "auxiliary"), which then
    serve as lemmas on the prefix like every open property, and, since
    together they are inductive, make each depth's query about one step;
    `reduce`: keep fewer paths (z3.bmc.reduction)."""

    properties: tuple[str, ...] | None = None
    sometimes: tuple[str, ...] | None = None
    time_budget: float | None = None
    stop_at_first: bool = False
    seed: int = 0
    lemmas: bool = False
    reduce: bool = False

    def __post_init__(self) -> None:
        # Any iterable of names is accepted; a tuple keeps the options hashable and picklable.
        for name in ("properties", "sometimes"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))


Progress = Callable[[int, float, dict[str, int]], None]     # (depth, seconds, solver counts)


class _BmcRun:
    """One run of `bmc`: the unrolling, the verdicts found so far and what is
    still open. Each method is one step of the loop over the depths d:

        check_properties(d):  bmc(d)   = unrolling(d) AND OR_{P open} not P(s_d)
        assume_held(d):       held[P] -> P(s_d) for every P still open
        check_targets(d):     cover(d) = unrolling(d) AND OR_{S open} target_S(s_d)
    """

    def __init__(self, model: Model, options: BmcOptions, cube: Cube | None) -> None:
        self.started = time.perf_counter()
        self.model, self.options = model, options
        self.properties = list(default_properties(model.cfg) if options.properties is None else options.properties)
        self.spec_properties = set(self.properties)
        if options.lemmas:
            self.properties += ["WF_encoding", *auxiliary_for(model.cfg)]
        self.targets = list(applicable_sometimes(model) if options.sometimes is None else options.sometimes)
        self.unrolling = _Unrolling(model, options.seed, options.reduce, cube)
        self.verdicts: dict[str, EngineVerdict] = {}
        self.open_properties, self.open_targets = list(self.properties), list(self.targets)
        self.completed = -1         # the deepest depth every query was answered at
        self.timed_out = False      # a query came back unknown (its time limit)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining_ms(self) -> int | None:
        """The budget left, in milliseconds (None: no budget)."""
        if self.options.time_budget is None:
            return None
        return int((self.options.time_budget - self.elapsed()) * 1000)

    def property_formulas(self, depth: int) -> dict[str, z3.BoolRef]:
        """P(s_d) for every open state property P, and Q(s_{d-1}, s_d) for every
        open transition property Q (none at depth 0: no step yet)."""
        system = self.unrolling.system
        frame, schedule = system.frame(depth), system.sched(depth)[0]
        formulas = {}
        for name in self.open_properties:
            if name in TRANSITION_FORMULAS:
                if depth > 0:
                    formulas[name] = system.build(TRANSITION_FORMULAS[name], self.unrolling.steps[-1])
            elif name == "WF_encoding":
                formulas[name] = system.build(well_formed, frame)
            elif name in AUXILIARY:
                formulas[name] = system.build(AUXILIARY[name], frame)
            else:
                formulas[name] = system.build(ALL_INVARIANT_FORMULAS[name], frame, schedule)
        return formulas

    def check_properties(self, depth: int, formulas: dict[str, z3.BoolRef]) -> None:
        """bmc(d) = unrolling(d) AND OR_{P open} not P(s_d), asked until unsat:
        each model violates some properties, which are recorded and closed.
        With stop_at_first, the first violation of a spec property ends it
        (the shortest counterexample is found; the rest of this depth is not asked)."""
        while not self.timed_out:
            violations = {name: z3.Not(formula) for name, formula in formulas.items()
                          if name in self.open_properties}
            if not violations:
                return
            found = self.satisfy(violations)
            if found is None:
                return
            witness, actions, states = found
            for name, violation in violations.items():
                if z3.is_true(witness.eval(violation, model_completion=True)):
                    self.record_violation(name, depth, actions, states)
            if self.options.stop_at_first and self.found_spec_violation():
                return

    def satisfy(self, goals: dict[str, z3.BoolRef]) -> tuple[z3.ModelRef, list[Action], list[State]] | None:
        """unrolling(d) AND OR goals: a witness, its trace and the states the
        concrete spec computes for it (replayed: an encoding bug raises), or
        None when unsat or out of time (then `timed_out` says which)."""
        answer = self.unrolling.query(z3.Or(list(goals.values())), self.remaining_ms(), self.open_properties)
        if answer != z3.sat:
            self.timed_out = answer == z3.unknown
            return None
        witness = self.unrolling.solver.model()
        actions, states = self.unrolling.trace(witness)
        replay(self.model, actions, states)
        return witness, actions, states

    def record_violation(self, name: str, depth: int, actions: list[Action], states: list[State]) -> None:
        """`name` is violated at the end of the trace: the spec's own predicate
        must agree (for a spec property); its row is closed at this depth."""
        if name in self.spec_properties and not concrete_check(self.model, name, states, actions):
            raise ReplayMismatch(f"{name}: Z3 says violated at depth {depth}, the spec's predicate holds")
        self.verdicts[name] = EngineVerdict(name, kind_of(name), "violated", "bmc", depth, self.elapsed(),
                                            actions, states)
        self.open_properties.remove(name)

    def found_spec_violation(self) -> bool:
        return any(verdict.status == "violated" and name in self.spec_properties
                   for name, verdict in self.verdicts.items())

    def assume_held(self, formulas: dict[str, z3.BoolRef]) -> None:
        """held[P] -> P(s_d) for every property still open: it holds at depth d,
        and serves the deeper queries as a lemma."""
        for name in self.open_properties:
            if name in formulas:
                self.unrolling.holds(name, formulas[name])

    def check_targets(self, depth: int) -> None:
        """cover(d) = unrolling(d) AND OR_{S open} target_S(s_d), asked until
        unsat: each model reaches some targets, which are recorded and closed."""
        while self.open_targets and not self.timed_out:
            goals = {name: self.target_formula(name, depth) for name in self.open_targets}
            found = self.satisfy(goals)
            if found is None:
                return
            witness, actions, states = found
            for name, goal in goals.items():
                if z3.is_true(witness.eval(goal, model_completion=True)):
                    self.record_reach(name, depth, actions, states)

    def target_formula(self, name: str, depth: int) -> z3.BoolRef:
        """Target `name` reached at depth d: by frame d (and its schedule), or
        by the step into it (a transition's target: none at depth 0)."""
        system = self.unrolling.system
        frame = system.frame(depth)
        if name in STEP_SOMETIMES_FORMULAS:
            if depth == 0:
                return z3.BoolVal(False)
            return system.build(STEP_SOMETIMES_FORMULAS[name], self.unrolling.steps[-1])
        if name in SCHEDULE_SOMETIMES_FORMULAS:
            return system.build(SCHEDULE_SOMETIMES_FORMULAS[name], frame, system.sched(depth)[0])
        if name in ASYNC_SOMETIMES_FORMULAS:
            return system.build(ASYNC_SOMETIMES_FORMULAS[name], frame)
        return system.build(SOMETIMES_FORMULAS[name], frame)

    def record_reach(self, name: str, depth: int, actions: list[Action], states: list[State]) -> None:
        """Target `name` is reached at the end of the trace: the spec's own
        predicate must agree; its row is closed at this depth."""
        _confirm_reached(self.model, name, states, actions)
        self.verdicts[name] = EngineVerdict(name, "sometimes", "reached", "bmc", depth, self.elapsed(),
                                            actions, states)
        self.open_targets.remove(name)

    def finish(self) -> EngineResult:
        """The rows, in the order asked: a property still open is bounded to the
        deepest completed depth (unknown if none was); a target still open is unknown."""
        seconds = self.elapsed()
        depth = max(self.completed, 0)
        for name in self.open_properties:
            self.verdicts[name] = EngineVerdict(name, kind_of(name), "bounded" if self.completed >= 0 else "unknown",
                                                "bmc", depth, seconds)
        for name in self.open_targets:
            self.verdicts[name] = EngineVerdict(name, "sometimes", "unknown", "bmc", depth, seconds,
                                                message=f"not reached within depth {self.completed}")
        order = self.properties + self.targets
        return EngineResult(self.model.name, "bmc", seconds, self.completed,
                            sorted(self.verdicts.values(), key=lambda verdict: order.index(verdict.name)))


def bmc(model: Model, max_depth: int, options: BmcOptions = BmcOptions(), progress: Progress | None = None,
        cube: Cube | None = None) -> EngineResult:
    """BMC of `options.properties` and cover queries for `options.sometimes`
    up to `max_depth` steps or `options.time_budget` seconds; at each depth d,
    after the unrolling gains its step d:

        bmc(d)   = unrolling(d) AND OR_P not P(s_d)      (until unsat; P then held at d)
        cover(d) = unrolling(d) AND OR_S target_S(s_d)   (until unsat)

    `progress(depth, seconds, solver_counts)` is called after each depth, with
    the SAT solver's conflicts and propagations so far. With `cube`, only the
    paths of that part (see `bmc_split`)."""
    run = _BmcRun(model, options, cube)
    for depth in range(max_depth + 1):
        if depth > 0:
            run.unrolling.extend()
        formulas = run.property_formulas(depth)
        run.check_properties(depth, formulas)
        if run.timed_out:
            break
        run.assume_held(formulas)
        if options.stop_at_first and run.found_spec_violation():
            run.completed = depth
            break
        run.check_targets(depth)
        if run.timed_out:
            break
        run.completed = depth
        if progress is not None:
            progress(depth, run.elapsed(), run.unrolling.counts())
        remaining = run.remaining_ms()
        if remaining is not None and remaining <= 0:
            break
    return run.finish()


def _confirm_reached(model: Model, name: str, states: list[State], actions: list[Action] | None = None) -> None:
    """The spec's own predicate says the target is reached at the trace's end
    (a transition's target: on the trace's last step)."""
    target = next(candidate for candidate in SOMETIMES + ASYNC_SOMETIMES + VERIFICATION_SOMETIMES
                  if candidate.name == name)
    cfg = model.cfg
    if target.on_step is not None:
        if actions and len(states) >= 2 and any(target.on_step(states[-2], states[-1], actions[-1], cfg, request)
                                                for request in range(model.num_requests)):
            return
        raise ReplayMismatch(f"{name}: Z3 says reached, the spec's predicate disagrees")
    for request in range(model.num_requests):
        if not target.target(states[-1], cfg, request):
            continue
        if target.after is None or any(target.after(state, cfg, request) for state in states):
            return
    raise ReplayMismatch(f"{name}: Z3 says reached, the spec's predicate disagrees")


def first_counterexample(model: Model, max_depth: int = 12, time_budget: float | None = 60.0,
                         properties: Iterable[str] | None = None) -> EngineVerdict | None:
    """The shortest violation of any property (for mutant hunting), or None."""
    options = BmcOptions(properties=properties, sometimes=(), time_budget=time_budget, stop_at_first=True)
    result = bmc(model, max_depth, options)
    violated = [row for row in result.properties if row.status == "violated" and row.kind != "auxiliary"]
    return min(violated, key=lambda row: row.depth) if violated else None

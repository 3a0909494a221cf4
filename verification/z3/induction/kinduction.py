"""Unbounded proofs by k-induction with strengthening invariants.

    base(k) = Init(s0) AND T(s0,s1) AND ... AND T(s_{k-2},s_{k-1}) AND OR_{t<k} not I(s_t)
    step(k) = I(s0) AND T(s0,s1) AND ... AND I(s_{k-1}) AND T(s_{k-1},s_k) AND not I(s_k)

where I is the conjunction of the spec's invariants, the auxiliary
(strengthening) invariants of `z3.induction.strengthening`, and the encoding's
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

`schedule` and `complete_oldest` are unrolled loops; their step is first
tried micro-step by micro-step (z3.induction.microsteps), which is what makes the
3-request, K = 3 proof take seconds per conjunct instead of minutes, and
only what that leaves unproved goes to the one-query form. With `jobs` > 1
(and no time budget) the Houdini loop goes round by round with the work
shared between processes as tasks taken by whichever is free (each chained
action whole, each transition property, then the other actions conjunct by
conjunct), the union of their drops leaves, and a round that drops nothing
ends it; its transition-property rows, proved with what was alive assumed,
are the result's. When the conjunction is inductive as given (the
strengthening invariants), that is a single round. The processes are the
command's executor's (verification/executors: `jobs` local processes, or
Ray workers with `--executor ray`), each keeping its step(k) for the next
round's tasks.

step(k)'s solvers and queries, and the micro-step chains, are built in
step.py; this module runs the proof on them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import z3
from flightcheck.spec import Action, State
from flightcheck.verification import executors
from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.actions import COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.invariants import NEEDS_SCHEDULE, invariant_formulas_for
from flightcheck.verification.z3.encoding.system import Step, System, Transitions
from flightcheck.verification.z3.encoding.terms import V, arithmetic
from flightcheck.verification.z3.encoding.transitions import TRANSITION_FORMULAS
from flightcheck.verification.z3.induction.microsteps import MicroChain
from flightcheck.verification.z3.induction.step import (
    ACTIONS,
    InductionStep,
    StepQuery,
    chains,
    formula,
    k_induction,
    solver_for,
)
from flightcheck.verification.z3.induction.strengthening import auxiliary_for
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

# A counterexample to induction: the state before, the action, the state after
# (a string where the solver's state is not a spec state).
Cti = tuple[State | str, Action, State | str]


def _base(system: System, k: int, names: list[str]) -> dict[str, tuple[int, z3.ModelRef]]:
    """Conjuncts that fail within k-1 steps of the initial state: name -> (depth, model)."""
    failed: dict[str, tuple[int, z3.ModelRef]] = {}
    solver = solver_for(system)
    solver.add(system.init(0))
    for t in range(k):
        if t > 0:
            solver.add(system.step(t - 1, t).constraints)
        solver.add(system.sched(t)[1])
        for name in names:
            conjunct = formula(system, name, system.frame(t), system.sched(t)[0])
            if name not in failed and solver.check(z3.Not(conjunct)) == z3.sat:
                failed[name] = (t, solver.model())
    return failed


def _by_chain(by_chain: dict[int, MicroChain], query: StepQuery, name: str, alive: list[str]) -> bool:
    """The action keeps conjunct `name`, shown micro-step by micro-step (False: not shown this way)."""
    chain = by_chain.get(query.action)
    return chain is not None and name not in NEEDS_SCHEDULE and chain.proves(query.goal[name], alive)


def _cti(system: System, witness: z3.ModelRef, transitions: Transitions, action: int, k: int) -> Cti:
    """The counterexample to induction in a model of step(k) under `action`."""
    return (system.decode_or_dump(witness, k - 1), system.decode_action(witness, _step_of(system, transitions, action)),
            _effect_state(system, witness, transitions, action))


@dataclass
class _Houdini:
    """The Houdini loop's context: step(k), the conjuncts still `alive`, the
    `rows` of those dropped, the time left to each query, and who is told of
    each drop. One round asks every action of `actions` whether it keeps
    every alive conjunct, all of them assumed:

        round:  for each action a, each alive n:  unsat? step_a(k) AND not n(effect_a(s_{k-1}))

    and a CTI drops every alive conjunct it breaks; the loop ends after a
    round that drops nothing (what is alive is then inductive)."""

    system: System
    k: int
    step: InductionStep
    alive: list[str]
    rows: dict[str, EngineVerdict]
    remaining_ms: Callable[[], int | None]
    tell: Callable[[str], None]
    started: float

    @property
    def method(self) -> str:
        return f"k-induction (k={self.k})"

    def run(self, actions: Iterable[int]) -> None:
        """Rounds over `actions` until one drops nothing."""
        by_chain = chains(self.system, self.k - 1, self.alive)
        while self.round(actions, by_chain):
            pass

    def round(self, actions: Iterable[int], by_chain: dict[int, MicroChain],
              claims: Iterable[str] | None = None) -> bool:
        """One round: True when some conjunct was dropped. With `claims`, only
        those conjuncts are asked about (every alive one is still assumed):
        a parallel round's share of the work."""
        dropped = False
        for query in self.step.queries:
            if query.action not in actions:
                continue
            for name in list(self.alive if claims is None else claims):
                if name not in self.alive or _by_chain(by_chain, query, name, self.alive):
                    continue
                query.timeout_ms = self.remaining_ms()
                answer = query.check(name, self.step.assumptions(self.alive))
                if answer != z3.unsat:
                    self.drop(query, name, answer)
                    dropped = True
        return dropped

    def drop(self, query: StepQuery, name: str, answer: z3.CheckSatResult) -> None:
        """The action may break `name`: with a CTI (sat), every alive conjunct
        that the same solver checks and the CTI breaks leaves; with no answer
        (the solver gave up), `name` alone."""
        solver = query.solver(name)
        cti, failing = None, [name]
        if answer == z3.sat:
            witness = solver.model()
            cti = _cti(self.system, witness, self.step.transitions, query.action, self.k)
            failing = [other for other in self.alive if query.solver(other) is solver
                       and not z3.is_true(witness.eval(query.goal[other], model_completion=True))]
        message = f"not inductive under {ACTIONS[query.action]}" if answer == z3.sat else "solver gave up"
        for other in failing:
            self.rows[other] = EngineVerdict(other, kind_of(other), "unknown", self.method, self.k,
                                             time.perf_counter() - self.started, cti=cti, message=message)
            self.alive.remove(other)
        self.tell(f"{time.perf_counter() - self.started:6.1f} s  {ACTIONS[query.action]} breaks "
                  f"{_some(failing)}; {len(self.alive)} left")


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# A worker's step(k) and micro-step chains, built on its first task and kept
# for the later tasks of every round: (model, k, names) -> what it built.
_WORKER_CONTEXT: dict[tuple[Model, int, tuple[str, ...]], tuple[System, InductionStep, dict[int, MicroChain]]] = {}


def _worker_context(model: Model, k: int, names: tuple[str, ...]) -> tuple[System, InductionStep,
                                                                            dict[int, MicroChain]]:
    key = (model, k, names)
    if key not in _WORKER_CONTEXT:
        _WORKER_CONTEXT.clear()
        system = System(model)
        _WORKER_CONTEXT[key] = (system, k_induction(system, k, list(names)), chains(system, k - 1, list(names)))
    return _WORKER_CONTEXT[key]


def _houdini_task(model: Model, k: int, names: tuple[str, ...], alive: list[str], action: int | str,
                  claims: list[str] | None) -> dict[str, EngineVerdict]:
    """One task of a parallel Houdini round: whether `action` keeps each of
    `claims` (None: every alive conjunct), every conjunct of `alive` assumed;
    the rows of the conjuncts it dropped. `action` a transition property's
    name instead: its row, `alive` assumed (kept only if the round drops
    nothing, when `alive` is the inductive conjunction)."""
    system, step, by_chain = _worker_context(model, k, names)
    if isinstance(action, str):
        return {action: _transition_row(system, k, step, action, list(alive), lambda: None, time.perf_counter())}
    houdini = _Houdini(system, k, step, list(alive), {}, remaining_ms=lambda: None, tell=lambda _: None,
                       started=time.perf_counter())
    houdini.round([action], by_chain, claims)
    return houdini.rows


# The actions with micro-step chains: their chain (computed once per alive
# set, for every conjunct) is most of their work, so each goes to one process
# whole; the others' queries are independent, conjunct by conjunct.
_CHAINED = (SCHEDULE, COMPLETE)


def _round_tasks(alive: list[str]) -> list[tuple[int | str, list[str] | None]]:
    """A parallel round's tasks, largest first (measured on shared-k3 under
    vLLM 0.33: schedule 201 s, abort 104 s, complete_oldest 84 s, arrive 73 s,
    the three transition properties 35 s, each alone on a loaded machine):
    each chained action whole, then each transition property, then abort
    and arrive one conjunct each, so the processes that finish early take
    the rest."""
    return ([(action, None) for action in _CHAINED] + [(name, None) for name in TRANSITION_FORMULAS]
            + [(action, [name]) for action in ACTIONS if action not in _CHAINED for name in alive])


def _parallel_houdini(model: Model, k: int, alive: list[str], rows: dict[str, EngineVerdict], jobs: int,
                      tell: Callable[[str], None], started: float) -> list[EngineVerdict]:
    """The Houdini loop with the work shared between processes, round by
    round: a round's tasks (`_round_tasks`) go to whichever process is free,
    each run from what is alive, and every conjunct any of them dropped
    leaves, until a round drops none (then every action keeps every
    conjunct left, all assumed: it is inductive). A drop is sound whatever
    the other tasks drop meanwhile: a CTI that satisfies a superset of the
    inductive core still shows its conjunct is not in it. Each round also
    proves the transition properties with what is alive assumed; the last
    round's (which drops nothing) are returned."""
    names = tuple(alive)
    processes = min(jobs, len(ACTIONS))
    with executors.open_executor(processes) as pool:       # the command's executor (verification/executors)
        for round_number in range(1, len(names) + 2):      # each round but the last drops one at least
            dropped: dict[str, EngineVerdict] = {}
            transition_rows: list[EngineVerdict] = []
            tasks = _round_tasks(alive)
            work = [executors.Task((round_number, index), _houdini_task,
                                   (model, k, names, list(alive), action, claims),
                                   f"Houdini round {round_number}: {_task_name(action, claims)}")
                    for index, (action, claims) in enumerate(tasks)]
            for (action, _), task_rows in zip(tasks, pool.map(work)):
                if isinstance(action, str):
                    transition_rows += [dataclasses.replace(row, seconds=time.perf_counter() - started)
                                        for row in task_rows.values()]
                    continue
                for name, row in task_rows.items():
                    dropped.setdefault(name, row)
            if not dropped:
                return transition_rows
            for name, row in dropped.items():
                alive.remove(name)
                rows[name] = dataclasses.replace(row, seconds=time.perf_counter() - started)
            tell(f"{time.perf_counter() - started:6.1f} s  a round in {processes} processes drops "
                 f"{_some(list(dropped))}; {len(alive)} left")
    raise AssertionError("a Houdini round that dropped nothing ends the loop")


def _task_name(action: int | str, claims: list[str] | None) -> str:
    """A Houdini task as progress and errors name it."""
    what = action if isinstance(action, str) else ACTIONS[action]
    return what if claims is None else f"{what} keeps {', '.join(claims)}"


def prove_by_induction(model: Model, k: int = 1, invariants: Iterable[str] | None = None,
                       auxiliary: Iterable[str] | None = None, time_budget: float | None = None,
                       jobs: int = 1, progress: Callable[[str], None] | None = None) -> EngineResult:
    """Prove `invariants` (default: all of the spec's) and the transition
    properties with the auxiliary invariants by k-induction:

        base(k) unsat for each conjunct, then Houdini on step(k), then
        I(s) AND T(s,s') => Q(s,s') for each transition property Q.

    Returns one row per conjunct and transition property: proved, or unknown
    with a CTI (state before, action, state after) when the Houdini loop had to
    drop it, or violated when it fails within k-1 steps of the initial state.
    `jobs`: processes for the Houdini rounds (see the module docstring);
    `progress`: told of every conjunct the Houdini loop drops."""
    started = time.perf_counter()
    system = System(model)
    names = ["WF_encoding", *(invariant_formulas_for(model.cfg) if invariants is None else invariants),
             *(auxiliary_for(model.cfg) if auxiliary is None else auxiliary)]
    method = f"k-induction (k={k})"
    tell = progress or (lambda _: None)
    rows = _base_rows(system, k, names, started)
    if rows:
        tell(f"{len(rows)} fail within k-1 steps of the initial state; {len(names) - len(rows)} left")
    alive = [name for name in names if name not in rows]

    def remaining_ms() -> int | None:
        if time_budget is None:
            return None
        return max(1, int((time_budget - (time.perf_counter() - started)) * 1000))

    step: InductionStep | None = None
    if jobs > 1 and time_budget is None:
        transition_rows = _parallel_houdini(model, k, alive, rows, jobs, tell, started)
    else:
        step = k_induction(system, k, names)
        _Houdini(system, k, step, alive, rows, remaining_ms, tell, started).run(ACTIONS)
    seconds = time.perf_counter() - started
    for name in alive:
        rows[name] = EngineVerdict(name, kind_of(name), "proved", method, k, seconds)
    verdicts = [rows[name] for name in names]
    if step is not None:
        transition_rows = _transition_rows(system, k, step, alive, remaining_ms, started)
    verdicts += transition_rows
    return EngineResult(model.name, method, time.perf_counter() - started, k, verdicts)


def _base_rows(system: System, k: int, names: list[str], started: float) -> dict[str, EngineVerdict]:
    """base(k): a violated row for each conjunct that fails within k-1 steps of the initial state."""
    method = f"k-induction (k={k}) base"
    rows: dict[str, EngineVerdict] = {}
    for name, (depth, witness) in _base(system, k, names).items():
        rows[name] = EngineVerdict(name, kind_of(name), "violated", method, depth, time.perf_counter() - started,
                                   states=[system.decode_or_dump(witness, depth)],
                                   message="fails within k-1 steps of the initial state")
    return rows


def _transition_rows(system: System, k: int, step: InductionStep, alive: list[str],
                     remaining_ms: Callable[[], int | None], started: float) -> list[EngineVerdict]:
    """Each transition property Q, proved as I(s) AND T_a(s,s') => Q(s,s') for
    every action a, with I the conjuncts left `alive` (assumed on the frames);
    unknown, with a CTI where available, at the first action that may break it."""
    return [_transition_row(system, k, step, name, alive, remaining_ms, started) for name in TRANSITION_FORMULAS]


def _transition_row(system: System, k: int, step: InductionStep, name: str, alive: list[str],
                    remaining_ms: Callable[[], int | None], started: float) -> EngineVerdict:
    """Transition property `name` by every action, `alive` assumed (see _transition_rows)."""
    status, cti = "proved", None
    for query in step.queries:
        last_step = _step_of(system, step.transitions, query.action)
        solver = query.solver("WF_encoding")
        query.timeout_ms = remaining_ms()
        answer = query.check_formula("WF_encoding", step.assumptions(alive),
                                     system.build(TRANSITION_FORMULAS[name], last_step))
        if answer != z3.unsat:
            status = "unknown"
            if answer == z3.sat:
                cti = _cti(system, solver.model(), step.transitions, query.action, k)
            break
    return EngineVerdict(name, "invariant", status, f"k-induction (k={k})", k, time.perf_counter() - started,
                         cti=cti)


def _step_of(system: System, transitions: Transitions, action: int) -> Step:
    """The last step under `action`, with its effect as the next state."""
    with arithmetic(system.layout.width):
        choices = dataclasses.replace(transitions.choices, act=V(action))
    return Step(transitions.before, transitions.effects[action], choices, transitions.sched,
                transitions.completion, [])


def _effect_state(system: System, witness: z3.ModelRef, transitions: Transitions, action: int) -> State | str:
    """The action's effect in the model, as a spec state if it is one."""
    from flightcheck.verification.z3.encoding.state import NotRepresentable, decode
    try:
        return decode(system.layout, witness, transitions.effects[action])
    except (NotRepresentable, IndexError) as error:
        return f"<not a spec state: {error}>"


def describe_cti(cti: Cti) -> str:
    from flightcheck.spec import describe
    before, action, after = cti
    shown = [x if isinstance(x, str) else describe(x) for x in (before, after)]
    return f"  before: {shown[0]}\n  action: {action}\n  after:  {shown[1]}"

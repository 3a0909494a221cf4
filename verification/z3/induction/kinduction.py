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
(and no time budget) the Houdini loop goes round by round with the actions
shared between processes: each runs the loop over its actions, the union
of their drops leaves, and a round that drops nothing ends it. When the
conjunction is inductive as given (the strengthening invariants), that is
a single round.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import multiprocessing
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import z3
from flightcheck.spec import State
from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.actions import (
    ABORT,
    ARRIVE,
    COMPLETE,
    SCHEDULE,
    complete_guard,
)
from flightcheck.verification.z3.encoding.invariants import (
    INVARIANT_FORMULAS,
    NEEDS_SCHEDULE,
    TRANSITION_FORMULAS,
    well_formed,
)
from flightcheck.verification.z3.encoding.system import Step, System
from flightcheck.verification.z3.encoding.terms import V, arithmetic, eq
from flightcheck.verification.z3.induction.grammar import is_candidate, predicate
from flightcheck.verification.z3.induction.microsteps import (
    SPLIT,
    Chain,
    MicroChain,
    batch_facts,
    completion_facts,
)
from flightcheck.verification.z3.induction.strengthening import AUXILIARY
from flightcheck.verification.z3.results import EngineResult, EngineVerdict

ACTIONS = {ARRIVE: "arrive", SCHEDULE: "schedule", COMPLETE: "complete_oldest", ABORT: "abort"}


def formula(system: System, name: str, s, sched=None) -> z3.BoolRef:
    """Conjunct `name` on a symbolic state (a frame or an action's effect)."""
    if name == "WF_encoding":
        return system.build(well_formed, s)
    if name in INVARIANT_FORMULAS:
        return system.build(INVARIANT_FORMULAS[name], s, sched)
    if is_candidate(name):
        return system.build(predicate(name), s)
    return system.build(AUXILIARY[name], s)


# A lean query the incremental solver has not settled within this many
# milliseconds is split into its top-level conjuncts (or, when it has none,
# asked again of a fresh solver): with 8 requests, `complete_oldest` against
# S3 as one query ran for over ten minutes; request by request it takes
# under a second each.
INCREMENTAL_MS = 30_000


@dataclass
class _Query:
    """step(k) for one action: its solvers, and each conjunct on the action's effect.

    A conjunct is first asked of a lean solver: the same step without the
    hypotheses that call `schedule` on the frame (L2) and, for the other
    actions, without the schedule circuit itself. Fewer hypotheses only
    admit more models, so its unsat is a proof; when it is not unsat, the
    full solver decides (and gives the CTI). With 8 requests, assuming L2
    makes even an `arrive` query reason through the whole schedule circuit:
    such a query ran for minutes where the lean one takes a second."""

    action: int
    goal: dict          # conjunct name -> formula on effect_a(s_{k-1})
    guard: z3.BoolRef   # literal: the action is taken
    solvers: dict       # conjunct name -> the full solver that checks it
    parts: dict         # conjunct name -> its clauses, for the big ones (SPLIT)
    new_lean: Callable[[], z3.Solver]   # a fresh lean solver
    lean: z3.Solver | None = None        # the incremental lean solver, once made
    timeout_ms: int | None = None

    def solver(self, name: str) -> z3.Solver:
        return self.solvers[name]

    def check(self, name: str, assumptions: list) -> z3.CheckSatResult:
        """Can the action break conjunct `name`? Clause by clause for a split
        one (many small queries beat one big disjunction)."""
        return self._check_each(name, assumptions, self.parts.get(name, [self.goal[name]]))

    def _check_each(self, name: str, assumptions: list, claims: list) -> z3.CheckSatResult:
        """unsat when no claim can be broken; else sat or unknown for the first that is not refuted."""
        for claim in claims:
            r = self.check_formula(name, assumptions, claim)
            if r != z3.unsat:
                return r
        return z3.unsat

    def check_formula(self, name: str, assumptions: list, claim: z3.BoolRef) -> z3.CheckSatResult:
        """Can the action break `claim`? Lean first, then in full (which gives the CTI)."""
        question = [*assumptions, self.guard, z3.Not(claim)]
        if name not in NEEDS_SCHEDULE:
            if self.lean is None:
                self.lean = self.new_lean()
            r = self._ask(self.lean, question, INCREMENTAL_MS)
            if r == z3.unknown and z3.is_and(claim):
                return self._check_each(name, assumptions, claim.children())
            if r == z3.unknown:
                r = self._ask(self.new_lean(), question)
            if r == z3.unsat:
                return r
        return self._ask(self.solvers[name], question)

    def _ask(self, solver: z3.Solver, question: list, cap_ms: int | None = None) -> z3.CheckSatResult:
        limits = [ms for ms in (cap_ms, self.timeout_ms) if ms is not None]
        if limits:
            solver.set("timeout", min(limits))
        return solver.check(*question)


def k_induction(system: System, k: int, names: list[str]):
    """step(k) as one small solver per action (and one more per action for
    the conjuncts that call `schedule` on the next state): frames 0..k-1 with
    T between them, every conjunct assumed on them under a literal each, and
    the action's guard under a literal. Keeping each action's circuit (and
    the next state's schedule circuit) out of the other queries is what
    keeps them fast."""
    tr = system.transitions(k - 1)
    assume = {n: z3.Bool(f"assume:{n}") for n in names}

    def hypotheses(selected: list[str]) -> list[z3.BoolRef]:
        return [z3.Implies(assume[n], z3.And([formula(system, n, system.frame(t), system.sched(t)[0])
                                              for t in range(k)])) for n in selected]

    hyps = hypotheses(names)
    lean_hyps = hypotheses([n for n in names if n not in NEEDS_SCHEDULE])
    prefix = [c for t in range(k - 1) for c in system.step(t, t + 1).constraints]
    queries = []
    for a in ACTIONS:
        eff = tr.effects[a]
        g = z3.Bool(f"takes:{ACTIONS[a]}")

        def new_solver(lean: bool = False, a: int = a, g: z3.BoolRef = g) -> z3.Solver:
            solver = z3.SolverFor("QF_BV") if system.lay.width else z3.SolverFor("QF_LIA")
            circuit = [] if lean and a != SCHEDULE else tr.sched_defs
            solver.add(prefix + circuit + tr.defs + tr.legal + (lean_hyps if lean else hyps))
            solver.add(z3.Implies(g, z3.And(tr.guards[a], tr.choices.act == a)))
            return solver

        main, sched1, solvers = new_solver(), None, {}
        if any(n in NEEDS_SCHEDULE for n in names):
            sched1, defs = system.schedule_of(eff, f"effect{a}@{k}")
            extra = new_solver()
            extra.add(defs)
        for n in names:
            solvers[n] = extra if n in NEEDS_SCHEDULE else main
        parts = {n: list(system.build(SPLIT[n], eff).values()) for n in names if n in SPLIT}
        queries.append(_Query(a, {n: formula(system, n, eff, sched1) for n in names}, g, solvers, parts,
                              functools.partial(new_solver, lean=True)))
    return assume, queries, tr


def chains(system: System, t: int, names: list[str]) -> dict[int, MicroChain]:
    """schedule's and complete_oldest's steps from frame t, micro-step by
    micro-step (z3.induction.microsteps)."""
    frame, tr = system.frame(t), system.transitions(t)
    sched, comp = tr.sched, tr.completion
    plain = [n for n in names if n not in NEEDS_SCHEDULE]
    flag_defs = [d for d in tr.defs if any(d.arg(0).eq(f) for f in comp.samples_here if z3.is_const(f))]
    with arithmetic(system.lay.width):
        given_complete = [complete_guard(system.lay, frame), eq(tr.choices.act, COMPLETE)]
    specs = {
        SCHEDULE: Chain(sched.trail[0], sched.micro, lambda acc: acc.st,
                        lambda acc, _: system.build(batch_facts, acc, frame), [sched.enabled],
                        sched.launch_defs + [sched.result], "schedule"),
        COMPLETE: Chain(comp.start, comp.micro, lambda st: st,
                        lambda st, i: system.build(completion_facts, st, frame, i),
                        [*given_complete, *tr.legal, *flag_defs], [],
                        "complete_oldest"),
    }
    return {a: MicroChain(system.build, c, {n: (lambda st, n=n: formula(system, n, st)) for n in plain},
                          lambda alive: [formula(system, n, frame) for n in alive if n in plain],
                          lambda: z3.SolverFor("QF_BV") if system.lay.width else z3.SolverFor("QF_LIA"))
            for a, c in specs.items()}


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


def _by_chain(by_chain: dict[int, MicroChain], q: _Query, n: str, alive: list[str]) -> bool:
    """The action keeps conjunct n, shown micro-step by micro-step (False: not shown this way)."""
    chain = by_chain.get(q.action)
    return chain is not None and n not in NEEDS_SCHEDULE and chain.proves(q.goal[n], alive)


def _houdini(system: System, k: int, queries: list[_Query], assume: dict, tr, alive: list[str],
            rows: dict[str, EngineVerdict], actions: Iterable[int], left_ms: Callable[[], int | None],
            tell: Callable[[str], None], t0: float) -> None:
    """The Houdini loop over `actions`: every conjunct a counterexample to
    induction breaks leaves `alive` (its row goes to `rows`), until no action
    breaks any conjunct still alive."""
    method = f"k-induction (k={k})"
    by_chain = chains(system, k - 1, alive)
    changed = True
    while changed:
        changed = False
        for q in queries:
            if q.action not in actions:
                continue
            for n in list(alive):
                if n not in alive:
                    continue
                if _by_chain(by_chain, q, n, alive):
                    continue
                solver = q.solver(n)
                q.timeout_ms = left_ms()
                r = q.check(n, [assume[x] for x in alive])
                if r == z3.unsat:
                    continue
                cti, failing = None, [n]
                if r == z3.sat:
                    m = solver.model()
                    cti = (system.decode_or_dump(m, k - 1), system.decode_action(m, _step_of(system, tr, q.action)),
                           _effect_state(system, m, tr, q.action))
                    failing = [x for x in alive if q.solver(x) is solver
                               and not z3.is_true(m.eval(q.goal[x], model_completion=True))]
                for x in failing:
                    rows[x] = EngineVerdict(x, kind_of(x), "unknown", method, k, time.perf_counter() - t0, cti=cti,
                                             message=f"not inductive under {ACTIONS[q.action]}" if r == z3.sat
                                             else "solver gave up")
                    alive.remove(x)
                tell(f"{time.perf_counter() - t0:6.1f} s  {ACTIONS[q.action]} breaks {_some(failing)}; "
                     f"{len(alive)} left")
                changed = True


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _houdini_share(model: Model, k: int, names: list[str], actions: list[int]) -> dict[str, EngineVerdict]:
    """One process's share of a parallel Houdini round: the loop over `actions`
    alone, from `names` all alive; the rows of the conjuncts it dropped."""
    system = System(model)
    assume, queries, tr = k_induction(system, k, names)
    rows: dict[str, EngineVerdict] = {}
    _houdini(system, k, queries, assume, tr, list(names), rows, actions, lambda: None, lambda _: None,
             time.perf_counter())
    return rows


# The actions' shares of the work, largest first (measured on shared-k3), for
# splitting the Houdini rounds between processes.
_COST_ORDER = (COMPLETE, SCHEDULE, ABORT, ARRIVE)


def _parallel_houdini(model: Model, k: int, alive: list[str], rows: dict[str, EngineVerdict], jobs: int,
                      tell: Callable[[str], None], t0: float) -> None:
    """The Houdini loop with the actions shared between processes, round by
    round: each process runs the loop over its actions from what is alive, and
    every conjunct any of them dropped leaves, until a round drops none (then
    every action keeps every conjunct left, all assumed: it is inductive). A
    drop is sound whatever the other processes drop meanwhile: a CTI that
    satisfies a superset of the inductive core still shows its conjunct is
    not in it."""
    shares: list[list[int]] = [[] for _ in range(min(jobs, len(_COST_ORDER)))]
    for i, a in enumerate(_COST_ORDER):
        shares[i % len(shares)].append(a)
    ctx = multiprocessing.get_context("spawn")      # Z3 contexts do not survive a fork
    with concurrent.futures.ProcessPoolExecutor(len(shares), mp_context=ctx) as pool:
        while True:
            dropped: dict[str, EngineVerdict] = {}
            for share_rows in pool.map(_houdini_share, *zip(*[(model, k, list(alive), s) for s in shares])):
                for n, row in share_rows.items():
                    dropped.setdefault(n, row)
            if not dropped:
                return
            for n, row in dropped.items():
                alive.remove(n)
                rows[n] = dataclasses.replace(row, seconds=time.perf_counter() - t0)
            tell(f"{time.perf_counter() - t0:6.1f} s  a round in {len(shares)} processes drops "
                 f"{_some(list(dropped))}; {len(alive)} left")


def prove_by_induction(model: Model, k: int = 1, invariants: Iterable[str] | None = None,
                       auxiliary: Iterable[str] | None = None, time_budget: float | None = None,
                       jobs: int = 1, progress: Callable[[str], None] | None = None) -> EngineResult:
    """Prove `invariants` (default: all of the spec's) and the transition
    properties with the auxiliary invariants by k-induction.

    Returns one row per conjunct and transition property: proved, or unknown
    with a CTI (state before, action, state after) when the Houdini loop had to
    drop it, or violated when it fails within k-1 steps of the initial state.
    `jobs`: processes for the Houdini rounds (see the module docstring);
    `progress`: told of every conjunct the Houdini loop drops."""
    t0 = time.perf_counter()
    system = System(model)
    names = ["WF_encoding", *(INVARIANT_FORMULAS if invariants is None else invariants),
             *(AUXILIARY if auxiliary is None else auxiliary)]
    rows: dict[str, EngineVerdict] = {}
    method = f"k-induction (k={k})"
    for n, (depth, m) in _base(system, k, names).items():
        rows[n] = EngineVerdict(n, kind_of(n), "violated", method + " base", depth, time.perf_counter() - t0,
                                 states=[system.decode_or_dump(m, depth)],
                                 message="fails within k-1 steps of the initial state")
    tell = progress or (lambda _: None)
    if rows:
        tell(f"{len(rows)} fail within k-1 steps of the initial state; {len(names) - len(rows)} left")
    assume, queries, tr = k_induction(system, k, names)
    alive = [n for n in names if n not in rows]

    def left_ms() -> int | None:
        return None if time_budget is None else max(1, int((time_budget - (time.perf_counter() - t0)) * 1000))

    if jobs > 1 and time_budget is None:
        _parallel_houdini(model, k, alive, rows, jobs, tell, t0)
    else:
        _houdini(system, k, queries, assume, tr, alive, rows, ACTIONS, left_ms, tell, t0)
    seconds = time.perf_counter() - t0
    for n in alive:
        rows[n] = EngineVerdict(n, kind_of(n), "proved", method, k, seconds)
    out = [rows[n] for n in names]
    for name, fn in TRANSITION_FORMULAS.items():
        status, cti = "proved", None
        for q in queries:
            st = _step_of(system, tr, q.action)
            solver = q.solver("WF_encoding")
            q.timeout_ms = left_ms()
            r = q.check_formula("WF_encoding", [assume[x] for x in alive], system.build(fn, st))
            if r != z3.unsat:
                status = "unknown"
                if r == z3.sat:
                    m = solver.model()
                    cti = (system.decode_or_dump(m, k - 1), system.decode_action(m, st),
                           _effect_state(system, m, tr, q.action))
                break
        out.append(EngineVerdict(name, "invariant", status, method, k, time.perf_counter() - t0, cti=cti))
    return EngineResult(model.name, method, time.perf_counter() - t0, k, out)


def _step_of(system: System, tr, action: int) -> Step:
    """The last step under `action`, with its effect as the next state."""
    with arithmetic(system.lay.width):
        ch = dataclasses.replace(tr.choices, act=V(action))
    return Step(tr.before, tr.effects[action], ch, tr.sched, tr.completion, [])


def _effect_state(system: System, m: z3.ModelRef, tr, action: int) -> State | str:
    from flightcheck.verification.z3.encoding.state import NotRepresentable, decode
    try:
        return decode(system.lay, m, tr.effects[action])
    except (NotRepresentable, IndexError) as e:
        return f"<not a spec state: {e}>"


def describe_cti(cti: tuple) -> str:
    from flightcheck.spec import describe
    before, action, after = cti
    show = [x if isinstance(x, str) else describe(x) for x in (before, after)]
    return f"  before: {show[0]}\n  action: {action}\n  after:  {show[1]}"

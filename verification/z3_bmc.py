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
itself find the property broken.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import z3

from flightcheck.spec import SOMETIMES

from .models import Model
from .z3_invariants import INVARIANT_FORMULAS, SOMETIMES_FORMULAS, TRANSITION_FORMULAS, well_formed
from .z3_reduction import check_reducible, peephole, twin_order
from .z3_results import EngineResult, PropertyResult, ReplayMismatch, concrete_check, kind_of, replay
from .z3_strengthening import AUXILIARY
from .z3_system import Step, System


def unrolling(system: System, k: int) -> list[z3.BoolRef]:
    """Init(s0) AND T(s0,s1) AND ... AND T(s_{k-1},s_k) (with schedule's definitions of s_k)."""
    out = system.init(0)
    for t in range(k):
        out += system.step(t, t + 1).constraints
    return out + system.sched(k)[1]


def default_properties() -> list[str]:
    return list(INVARIANT_FORMULAS) + list(TRANSITION_FORMULAS)


def applicable_sometimes(model: Model) -> list[str]:
    return [s.name for s in SOMETIMES if s.is_applicable(model.cfg)]


class _Unrolling:
    """The incremental solver: frames 0..depth, steps between them.

    Each open property P has a literal `held[P]`; once BMC has shown that P
    holds at every state within d steps, `held[P] -> P(s_t)` is added for
    t <= d. Queries assume the literals of the properties still open, so the
    solver gets every invariant not yet refuted as a lemma on the prefix
    (sound: a path violating an open P earlier would have refuted P at a
    smaller depth), and dropping a refuted P's literal releases it."""

    def __init__(self, model: Model, seed: int = 0, reduce: bool = False) -> None:
        if reduce:
            check_reducible(model)
        self.reduce = reduce
        self.system = System(model)
        # Bit-vectors go to Z3's incremental SAT solver (bit-blasted once, then
        # CDCL with assumptions), far faster here than integer arithmetic.
        self.solver = z3.SolverFor("QF_BV")
        self.solver.set("random_seed", seed)
        self.steps: list[Step] = []
        self.depth = 0
        self.held: dict[str, z3.BoolRef] = {}
        self._lits = 0
        self.solver.add(self.system.init(0))
        self.solver.add(self.system.sched(0)[1])

    def extend(self) -> None:
        st = self.system.step(self.depth, self.depth + 1, with_sched_defs=False)
        self.solver.add(st.constraints)
        self.steps.append(st)
        self.depth += 1
        self.solver.add(self.system.sched(self.depth)[1])
        if self.reduce:
            self.solver.add(twin_order(self.system, self.depth))
            if self.depth >= 3:     # pair (d-3, d-2): never the last step (z3_reduction)
                self.solver.add(peephole(self.system, self.steps[-3], self.steps[-2]))

    def holds(self, name: str, formula: z3.BoolRef) -> None:
        """Record that `name` holds at the current depth (as a lemma)."""
        lit = self.held.setdefault(name, z3.Bool(f"held:{name}"))
        self.solver.add(z3.Implies(lit, formula))

    def query(self, goal: z3.BoolRef, timeout_ms: int | None, open_names) -> z3.CheckSatResult:
        """Is `goal` satisfiable at the current depth, with the open properties as lemmas?"""
        self._lits += 1
        lit = z3.Bool(f"query#{self._lits}")
        self.solver.add(z3.Implies(lit, goal))
        if timeout_ms is not None:
            self.solver.set("timeout", max(1, timeout_ms))
        return self.solver.check(lit, *[self.held[n] for n in open_names if n in self.held])

    def counts(self) -> dict[str, int]:
        """The SAT solver's conflicts and propagations so far."""
        st = self.solver.statistics()
        value = {k: st.get_key_value(k) for k in st.keys()}
        return {"conflicts": int(value.get("sat conflicts", 0)),
                "propagations": int(value.get("sat propagations 2ary", 0) + value.get("sat propagations nary", 0))}

    def trace(self, m: z3.ModelRef):
        sysm = self.system
        actions = [sysm.decode_action(m, st) for st in self.steps]
        states = [sysm.decode(m, t) for t in range(self.depth + 1)]
        return actions, states


def bmc(model: Model, max_depth: int, properties: Iterable[str] | None = None,
        sometimes: Iterable[str] | None = None, time_budget: float | None = None,
        stop_at_first: bool = False, seed: int = 0, lemmas: bool = False, reduce: bool = False,
        progress: Callable[[int, float, dict[str, int]], None] | None = None) -> EngineResult:
    """BMC of `properties` (invariant and transition-property names; default:
    all of them) and cover queries for `sometimes` targets (default: every one
    applicable to the model) up to `max_depth` steps or `time_budget` seconds.

    With `lemmas`, the auxiliary invariants of z3_strengthening and the
    encoding's well-formedness are checked too (rows of kind "auxiliary"):
    like every open property they then serve as lemmas on the prefix, and
    since together they are inductive, each depth's query is about one step.
    With stop_at_first, it returns at the first violation of a spec property
    (mutant hunting). `progress(depth, seconds, solver_counts)` is called
    after each depth, with the SAT solver's conflicts and propagations so far.
    With `reduce`, the unrolling keeps fewer paths (z3_reduction)."""
    t0 = time.perf_counter()
    props = list(default_properties() if properties is None else properties)
    spec_props = set(props)
    if lemmas:
        props += ["WF_encoding", *AUXILIARY]
    targets = list(applicable_sometimes(model) if sometimes is None else sometimes)
    u = _Unrolling(model, seed, reduce)
    results: dict[str, PropertyResult] = {}
    open_props, open_targets = list(props), list(targets)
    completed, timed_out = -1, False

    def remaining_ms() -> int | None:
        if time_budget is None:
            return None
        return int((time_budget - (time.perf_counter() - t0)) * 1000)

    for d in range(max_depth + 1):
        if d > 0:
            u.extend()
        frame, sched = u.system.frame(d), u.system.sched(d)[0]
        formulas = {}
        for n in open_props:
            if n in TRANSITION_FORMULAS:
                if d > 0:
                    formulas[n] = u.system.build(TRANSITION_FORMULAS[n], u.steps[-1])
            elif n == "WF_encoding":
                formulas[n] = u.system.build(well_formed, frame)
            elif n in AUXILIARY:
                formulas[n] = u.system.build(AUXILIARY[n], frame)
            else:
                formulas[n] = u.system.build(INVARIANT_FORMULAS[n], frame, sched)
        while not timed_out:
            bad = {n: z3.Not(f) for n, f in formulas.items() if n in open_props}
            if not bad:
                break
            r = u.query(z3.Or(list(bad.values())), remaining_ms(), open_props)
            if r != z3.sat:
                timed_out = r == z3.unknown
                break
            m = u.solver.model()
            actions, states = u.trace(m)
            replay(model, actions, states)
            for n, f in bad.items():
                if z3.is_true(m.eval(f, model_completion=True)):
                    if n in spec_props and not concrete_check(model, n, states, actions):
                        raise ReplayMismatch(f"{n}: Z3 says violated at depth {d}, the spec's predicate holds")
                    results[n] = PropertyResult(n, kind_of(n), "violated", "bmc", d,
                                                time.perf_counter() - t0, actions, states)
                    open_props.remove(n)
            if stop_at_first and any(n in spec_props for n in results):
                break       # the shortest counterexample is found; the rest of this depth is not asked
        if timed_out:
            break
        for n in open_props:
            if n in formulas:
                u.holds(n, formulas[n])
        if stop_at_first and any(p.status == "violated" and p.name in spec_props for p in results.values()):
            completed = d
            break
        while open_targets and not timed_out:
            goals = {n: u.system.build(SOMETIMES_FORMULAS[n], frame) for n in open_targets}
            r = u.query(z3.Or(list(goals.values())), remaining_ms(), open_props)
            if r != z3.sat:
                timed_out = r == z3.unknown
                break
            m = u.solver.model()
            actions, states = u.trace(m)
            replay(model, actions, states)
            for n, g in goals.items():
                if z3.is_true(m.eval(g, model_completion=True)):
                    _confirm_reached(model, n, states)
                    results[n] = PropertyResult(n, "sometimes", "reached", "bmc", d,
                                                time.perf_counter() - t0, actions, states)
                    open_targets.remove(n)
        if timed_out:
            break
        completed = d
        if progress is not None:
            progress(d, time.perf_counter() - t0, u.counts())
        ms = remaining_ms()
        if ms is not None and ms <= 0:
            break
    seconds = time.perf_counter() - t0
    for n in open_props:
        results[n] = PropertyResult(n, kind_of(n), "bounded" if completed >= 0 else "unknown", "bmc",
                                    max(completed, 0), seconds)
    for n in open_targets:
        results[n] = PropertyResult(n, "sometimes", "unknown", "bmc", max(completed, 0), seconds,
                                    message=f"not reached within depth {completed}")
    order = props + targets
    return EngineResult(model.name, "bmc", seconds, completed,
                        sorted(results.values(), key=lambda p: order.index(p.name)))


def _confirm_reached(model: Model, name: str, states) -> None:
    """The spec's own predicate says the target is reached at the trace's end."""
    sm = next(s for s in SOMETIMES if s.name == name)
    cfg, n = model.cfg, model.num_requests
    for r in range(n):
        if not sm.target(states[-1], cfg, r):
            continue
        if sm.after is None or any(sm.after(s, cfg, r) for s in states):
            return
    raise ReplayMismatch(f"{name}: Z3 says reached, the spec's predicate disagrees")


def first_counterexample(model: Model, max_depth: int = 12, time_budget: float | None = 60.0,
                         properties: Iterable[str] | None = None) -> PropertyResult | None:
    """The shortest violation of any property (for mutant hunting), or None."""
    res = bmc(model, max_depth, properties, sometimes=[], time_budget=time_budget, stop_at_first=True)
    bad = [p for p in res.properties if p.status == "violated" and p.kind != "auxiliary"]
    return min(bad, key=lambda p: p.depth) if bad else None

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
from typing import Iterable

import z3

from flightcheck.spec import SOMETIMES

from .models import Model
from .z3_invariants import INVARIANT_FORMULAS, SOMETIMES_FORMULAS, TRANSITION_FORMULAS
from .z3_results import EngineResult, PropertyResult, ReplayMismatch, concrete_check, kind_of, replay
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
    """The incremental solver: frames 0..depth, steps between them."""

    def __init__(self, model: Model, seed: int = 0) -> None:
        self.system = System(model)
        self.solver = z3.Solver()
        self.solver.set("random_seed", seed)
        self.steps: list[Step] = []
        self.depth = 0
        self._lits = 0
        self.solver.add(self.system.init(0))
        self.solver.add(self.system.sched(0)[1])

    def extend(self) -> None:
        st = self.system.step(self.depth, self.depth + 1, with_sched_defs=False)
        self.solver.add(st.constraints)
        self.steps.append(st)
        self.depth += 1
        self.solver.add(self.system.sched(self.depth)[1])

    def query(self, goal: z3.BoolRef, timeout_ms: int | None) -> z3.CheckSatResult:
        """Is `goal` satisfiable at the current depth? (asked under a fresh literal)"""
        self._lits += 1
        lit = z3.Bool(f"query#{self._lits}")
        self.solver.add(z3.Implies(lit, goal))
        if timeout_ms is not None:
            self.solver.set("timeout", max(1, timeout_ms))
        return self.solver.check(lit)

    def trace(self, m: z3.ModelRef):
        sysm = self.system
        actions = [sysm.decode_action(m, st) for st in self.steps]
        states = [sysm.decode(m, t) for t in range(self.depth + 1)]
        return actions, states


def bmc(model: Model, max_depth: int, properties: Iterable[str] | None = None,
        sometimes: Iterable[str] | None = None, time_budget: float | None = None,
        stop_at_first: bool = False, seed: int = 0) -> EngineResult:
    """BMC of `properties` (invariant and transition-property names; default:
    all of them) and cover queries for `sometimes` targets (default: every one
    applicable to the model) up to `max_depth` steps or `time_budget` seconds.
    With stop_at_first, it returns at the first violation (mutant hunting)."""
    t0 = time.perf_counter()
    props = list(default_properties() if properties is None else properties)
    targets = list(applicable_sometimes(model) if sometimes is None else sometimes)
    u = _Unrolling(model, seed)
    lay = u.system.lay
    results: dict[str, PropertyResult] = {}
    open_props, open_targets = list(props), list(targets)
    completed = -1

    def remaining_ms() -> int | None:
        if time_budget is None:
            return None
        return int((time_budget - (time.perf_counter() - t0)) * 1000)

    def out_of_time() -> bool:
        ms = remaining_ms()
        return ms is not None and ms <= 0

    timed_out = False
    for d in range(max_depth + 1):
        if d > 0:
            u.extend()
        frame = u.system.frame(d)
        sched = u.system.sched(d)[0]

        def violation(name: str):
            if name in TRANSITION_FORMULAS:
                return None if d == 0 else z3.Not(TRANSITION_FORMULAS[name](lay, u.steps[-1]))
            return z3.Not(INVARIANT_FORMULAS[name](lay, frame, sched))

        while open_props and not timed_out:
            bad = {n: violation(n) for n in open_props}
            bad = {n: f for n, f in bad.items() if f is not None}
            if not bad:
                break
            r = u.query(z3.Or(list(bad.values())), remaining_ms())
            if r == z3.unknown:
                timed_out = True
                break
            if r == z3.unsat:
                break
            m = u.solver.model()
            actions, states = u.trace(m)
            replay(model, actions, states)
            for n, f in bad.items():
                if z3.is_true(m.eval(f, model_completion=True)):
                    if not concrete_check(model, n, states, actions):
                        raise ReplayMismatch(f"{n}: Z3 says violated at depth {d}, the spec's predicate holds")
                    results[n] = PropertyResult(n, kind_of(n), "violated", "bmc", d,
                                                time.perf_counter() - t0, actions, states)
                    open_props.remove(n)
        if stop_at_first and any(p.status == "violated" for p in results.values()):
            completed = d
            break
        while open_targets and not timed_out:
            goals = {n: SOMETIMES_FORMULAS[n](lay, frame) for n in open_targets}
            r = u.query(z3.Or(list(goals.values())), remaining_ms())
            if r == z3.unknown:
                timed_out = True
                break
            if r == z3.unsat:
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
        if timed_out or out_of_time():
            if not timed_out:
                completed = d
            break
        completed = d
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
    bad = [p for p in res.properties if p.status == "violated"]
    return min(bad, key=lambda p: p.depth) if bad else None

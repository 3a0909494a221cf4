"""The parameterised proof by 1-induction over the micro-steps, one small
query per (micro-step, depth before it):

    initiation:   Init(x) ⇒ Inv(x)
    consecution:  Assume(cfg) ∧ Inv(x) ∧ depth(x) = d ∧ guard_s(x, p) ⇒ Inv(post_s(x, p))
                  for every micro-step s and every d it can fire at (0..K)

Each is asked as the unsatisfiability of its negation; the negated goal
∃r. ¬Local(x', r) is skolemised by hand to a fresh constant r0, the
hypothesis ∀r. Local(x, r) stays a quantifier for Z3 to instantiate (its
instances at r0 and at the step's request are the ones that matter).
`Req`, the step's parameters and every configuration constant are free, so
unsat means: for every number of requests, every configuration Config
accepts, every choice the guards allow. A `sat` answer is a
counterexample-to-induction, reported with the conjuncts it breaks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3
from flightcheck.verification.z3.param.invariant import (
    global_conjuncts,
    invariant,
    local_conjuncts,
)
from flightcheck.verification.z3.param.model import (
    REQ,
    Symbolic,
    finite_req_sort,
    initial,
    symbolic_config,
    symbolic_state,
)
from flightcheck.verification.z3.param.steps import MICRO_STEPS, StepKind

QUERY_TIMEOUT_MS = 60_000


@dataclass
class QueryResult:
    name: str              # "init" or "<micro-step>@depth=<d>"
    status: str            # proved | cti | unknown
    seconds: float
    broken: list[str] = field(default_factory=list)   # cti: the conjuncts Inv(x') loses
    cti: str = ""                                     # cti: r0 and the step's request, before and after


@dataclass
class ParamProof:
    K: int
    mutant: str | None
    seconds: float
    queries: list[QueryResult]

    @property
    def ok(self) -> bool:
        return all(q.status == "proved" for q in self.queries)

    @property
    def failures(self) -> list[QueryResult]:
        return [q for q in self.queries if q.status != "proved"]


def _goal(ops: Symbolic, x: Any, cfg: Any, r0: Any) -> dict[str, Any]:
    """Inv(x) with ∀r skolemised to r0 (the goal side): Global(x) ∧ Local(x, r0)."""
    return {**global_conjuncts(ops, x, cfg), **local_conjuncts(ops, x, cfg, r0)}


def _solve(name: str, hypotheses: list[Any], goal: dict[str, Any], show: list[tuple[str, Any]],
           ops: Symbolic, cfg: Any, states: list[tuple[str, Any]]) -> QueryResult:
    t0 = time.perf_counter()
    solver = z3.Solver()
    solver.set("timeout", QUERY_TIMEOUT_MS)
    solver.add(*hypotheses)
    solver.add(z3.Not(z3.And(*goal.values())))
    answer = solver.check()
    seconds = time.perf_counter() - t0
    if answer == z3.unsat:
        return QueryResult(name, "proved", seconds)
    if answer == z3.unknown:
        return QueryResult(name, "unknown", seconds, cti=solver.reason_unknown())
    witness = solver.model()
    broken = [n for n, f in goal.items() if z3.is_false(witness.eval(f, model_completion=True))]
    lines = [f"{label} {tag}: {_render(witness, ops, x, cfg, r)}" for tag, x in states for label, r in show]
    return QueryResult(name, "cti", seconds, broken, "\n".join(lines))


def _render(witness: z3.ModelRef, ops: Symbolic, x: Any, cfg: Any, r: Any) -> str:
    def value(t: Any) -> str:
        return str(witness.eval(t, model_completion=True))

    entries = []
    for i, s in enumerate(x.slots):
        f = value(s.fate[r])
        if f != "absent":
            entries.append(f"[{i}] {f} {value(s.start[r])}+{value(s.n[r])}"
                           f"{'*' if value(s.samples[r]) == 'True' else ''} d={value(s.drafts[r])}")
    return (f"{value(x.status[r])} T={value(x.num_tokens(r))} C={value(x.num_computed[r])}"
            f" D={value(x.num_drafts[r])} O={value(x.num_output[r])}/{value(x.max_tokens[r])}"
            f" depth={value(x.depth)} | " + (" ".join(entries) or "-"))


def initiation(K: int, mutant: str | None = None) -> QueryResult:
    """Init(x) ⇒ Inv(x):  unsat( Assume(cfg) ∧ ¬(Global(x₀) ∧ Local(x₀, r0)) ), x₀ = initial()."""
    ops, cfg = Symbolic(), symbolic_config(K, mutant)
    x0, r0 = initial(ops, cfg), z3.Const("r0", REQ)
    return _solve("init", cfg.assumptions(), _goal(ops, x0, cfg, r0), [("r0", r0)], ops, cfg, [("init", x0)])


def consecution(K: int, kind: StepKind, d: int, mutant: str | None = None) -> QueryResult:
    """Inv(x) ∧ T_s(x, x') ⇒ Inv(x') for micro-step s at depth d:
    unsat( Assume(cfg) ∧ Global(x) ∧ ∀r. Local(x, r) ∧ depth(x) = d ∧ guard_s(x, p)
           ∧ ¬(Global(x') ∧ Local(x', r0)) ),  x' = post_s(x, p)."""
    ops, cfg = Symbolic(), symbolic_config(K, mutant)
    x = symbolic_state(K, "pre")
    params = [z3.Const("r1", REQ) if p == "r" else z3.Int(p) for p in kind.params]
    guard, post = kind.update(ops, x, cfg, d, *params)
    r0 = z3.Const("r0", REQ)
    hypotheses = [*cfg.assumptions(), x.depth == d, invariant(ops, x, cfg), guard]
    show = [("r0", r0)] + ([("r1", params[0])] if "r" in kind.params else [])
    return _solve(f"{kind.name}@depth={d}", hypotheses, _goal(ops, post, cfg, r0), show, ops, cfg,
                  [("before", x), ("after", post)])


def hypothesis_has_a_finite_model(K: int, kind: StepKind, d: int, num_requests: int = 2) -> bool:
    """Non-vacuity of a consecution query: Assume(cfg) ∧ Inv(x) ∧ depth(x) = d ∧ guard_s(x, p)
    is satisfiable with Req interpreted as `num_requests` elements (∀ expanded,
    so the question is quantifier-free). A model of it is a model of the
    query's hypothesis, so that query does not hold vacuously."""
    sort, domain = finite_req_sort(num_requests)
    ops, cfg = Symbolic(sort, domain), symbolic_config(K, req_sort=sort)
    x = symbolic_state(K, "pre", sort)
    params = [z3.Const("r1", sort) if p == "r" else z3.Int(p) for p in kind.params]
    guard, _ = kind.update(ops, x, cfg, d, *params)
    solver = z3.Solver()
    solver.set("timeout", QUERY_TIMEOUT_MS)
    solver.add(*cfg.assumptions(), x.depth == d, invariant(ops, x, cfg), guard)
    return solver.check() == z3.sat


def prove(K: int, mutant: str | None = None, stop_at_first: bool = False) -> ParamProof:
    """Initiation and every consecution query for K slots."""
    t0 = time.perf_counter()
    results = [initiation(K, mutant)]
    for kind in MICRO_STEPS:
        for d in kind.depths(K):
            if stop_at_first and any(q.status != "proved" for q in results):
                break
            results.append(consecution(K, kind, d, mutant))
    return ParamProof(K, mutant, time.perf_counter() - t0, results)

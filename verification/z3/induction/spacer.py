"""Unbounded proofs with no hand-written invariant: Z3's Spacer engine on
constrained Horn clauses.

    Inv(s)  <=  Init(s)
    Inv(s') <=  Inv(s) AND T_a(s, s')                  (one rule per action a)
    Bad     <=  Inv(s) AND NOT P(s)                    (P: a state property)
    Bad     <=  Inv(s) AND T_a(s, s') AND NOT P_a(s, s')   (P: a transition property)

`Bad` unreachable (the query answers unsat) proves P for every reachable
state (every step from one), with Inv synthesised by Spacer; sat means a
counterexample exists (its depth is then found, and the trace confirmed, by
`bmc`). The encoding is the same transition relation as BMC's and
k-induction's, over Ints (Spacer's arithmetic engines want them); the
auxiliary variables of the schedule and the step's choices are universally
quantified in the rules, which is the existential of the body.

Two things keep each rule small, and both leave it equivalent to T_a:
* T_a is T with the step's action fixed to a and simplified, so the rule
  carries one action's effect, not all four;
* of the auxiliary definitions `aux == term` (z3.encoding.terms.Builder), the rule
  keeps only those its action's constraints reach, directly or through
  other definitions. A definition nothing else mentions only says that its
  variable equals a term, which some value always satisfies, so dropping it
  changes no solution of the rest. An arrival's rule then no longer carries
  the whole unrolled schedule.
Measured on the 2-core machine: S11 on shared-k3 (3 requests, K = 3) in 88 s
with action-fixed rules alone, about 4 s sliced (the query alone; 12 s
with its process start).

Z3's own `timeout` on a fixedpoint query is not always honoured on these
rules (a 120 s budget has run for many minutes), so each query runs in its
own process and is stopped at its share of the budget.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from typing import Any, Iterable

import z3
from flightcheck.verification.models import Model
from flightcheck.verification.results import kind_of
from flightcheck.verification.z3.encoding.invariants import INVARIANT_FORMULAS
from flightcheck.verification.z3.encoding.transitions import SPEC_PROPERTIES, TRANSITION_FORMULAS
from flightcheck.verification.z3.encoding.system import ACTION_CODE, System
from flightcheck.verification.z3.encoding.terms import leaves
from flightcheck.verification.z3.results import EngineResult, EngineVerdict


def _free_consts(formulas: list[z3.ExprRef]) -> list[z3.ExprRef]:
    seen: dict[int, z3.ExprRef] = {}
    todo = list(formulas)
    while todo:
        e = todo.pop()
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            seen.setdefault(e.get_id(), e)
        else:
            todo.extend(e.children())
    return list(seen.values())


def _with_definitions(core: list[z3.BoolRef], definitions: dict[int, tuple[z3.ExprRef, z3.ExprRef]],
                      fix) -> list[z3.BoolRef]:
    """core plus the definitions `aux == term` it reaches (each term passed through `fix`)."""
    out, seen = list(core), set()
    todo = _free_consts(core)
    while todo:
        v = todo.pop()
        if v.get_id() in seen or v.get_id() not in definitions:
            continue
        seen.add(v.get_id())
        aux, term = definitions[v.get_id()]
        term = fix(term)
        out.append(aux == term)
        todo.extend(_free_consts([term]))
    return out


def horn_clauses(system: System, properties: list[str]):
    """(fixedpoint, Bad): the rules above on a Fixedpoint object."""
    s0, s1 = system.frame(0), system.frame(1)
    x0 = [v for n, v in leaves(s0) if not n.startswith("was_preempted")]
    x1 = [v for n, v in leaves(s1) if not n.startswith("was_preempted")]
    inv = z3.Function("Inv", *[v.sort() for v in x0], z3.BoolSort())
    bad = z3.Function("Bad", z3.BoolSort())
    fixedpoint = z3.Fixedpoint()
    fixedpoint.set(engine="spacer")
    fixedpoint.register_relation(inv, bad)
    init = [c for c in system.init(0) if "was_preempted" not in str(c)]
    step = system.step(0, 1)
    schedule, schedule_definitions = system.sched(0)
    transitions = system.transitions(0)
    definitions = {d.arg(0).get_id(): (d.arg(0), d.arg(1)) for d in schedule_definitions + transitions.defs}
    definition_ids = {id(d) for d in schedule_definitions + transitions.defs}
    core = [c for c in step.constraints if id(c) not in definition_ids and "was_preempted" not in str(c)]
    state_properties = [n for n in properties if n in INVARIANT_FORMULAS]
    transition_properties = [n for n in properties if n in TRANSITION_FORMULAS]
    state_property = z3.And([system.build(INVARIANT_FORMULAS[n], s0, schedule) for n in state_properties])
    transition_property = z3.And([system.build(TRANSITION_FORMULAS[n], step) for n in transition_properties])
    fixedpoint.declare_var(*_free_consts(init + step.constraints + [state_property, transition_property]))
    fixedpoint.rule(inv(*x0), init)
    for a in ACTION_CODE.values():
        def fix(t: Any, a: int = a) -> Any:
            return z3.simplify(z3.substitute(t, (step.choices.act, z3.IntVal(a))))
        fixed = [c for c in map(fix, core) if not z3.is_true(c)]
        fixedpoint.rule(inv(*x1), [inv(*x0)] + _with_definitions(fixed, definitions, fix))
        if transition_properties:
            violation = fix(z3.Not(transition_property))
            fixedpoint.rule(bad(), [inv(*x0)] + _with_definitions(fixed + [violation], definitions, fix))
    if state_properties:
        fixedpoint.rule(bad(), [inv(*x0)] + _with_definitions([z3.Not(state_property)], definitions, lambda t: t))
    return fixedpoint, bad


def _query(model: Model, group: list[str], answers: "multiprocessing.Queue") -> None:
    """One Spacer query, in its own process: ('proved'|'violated'|'unknown', message)."""
    fixedpoint, bad = horn_clauses(System(model, bitvectors=False), group)
    try:
        answer = fixedpoint.query(bad())
        reason = "" if answer != z3.unknown else fixedpoint.reason_unknown()
    except z3.Z3Exception as error:
        answer, reason = z3.unknown, str(error)
    if answer == z3.unsat:
        answers.put(("proved", f"synthesised invariant: {len(str(fixedpoint.get_answer()))} characters"))
    elif answer == z3.sat:
        answers.put(("violated", "Bad is reachable: bmc finds the shortest trace"))
    else:
        answers.put(("unknown", f"Spacer gave up: {reason}"))


def _answer(worker, answers, deadline: float | None) -> tuple[str, str]:
    """The worker's answer, or why there is none (its budget ran out, it died)."""
    while True:
        try:
            return answers.get(timeout=1.0)
        except queue.Empty:
            pass
        if not worker.is_alive():
            try:
                return answers.get(timeout=1.0)      # it may have answered just before exiting
            except queue.Empty:
                return "unknown", f"Spacer's process died (exit code {worker.exitcode})"
        if deadline is not None and time.perf_counter() > deadline:
            return "unknown", "stopped at its share of the budget"


def spacer(model: Model, properties: Iterable[str] | None = None, time_budget: float | None = None,
           separately: bool = True) -> EngineResult:
    """Prove `properties` (default: every spec invariant, state and
    transition) with Spacer: each on its own query (`separately`, the budget
    split evenly), or all at once. A query still running at its share of the
    budget is stopped and reported unknown."""
    t0 = time.perf_counter()
    names = list(SPEC_PROPERTIES if properties is None else properties)
    unknown = [n for n in names if n not in SPEC_PROPERTIES]
    if unknown:
        raise ValueError(f"not a property Spacer can be asked for: {', '.join(unknown)}")
    if time_budget is not None and time_budget <= 0:
        raise ValueError(f"time_budget must be positive, not {time_budget}")
    groups = [[n] for n in names] if separately else [names]
    share = None if time_budget is None else time_budget / len(groups)
    context = multiprocessing.get_context("spawn")          # Z3 contexts do not survive a fork
    result = EngineResult(model.name, "spacer", 0.0, 0)
    for group in groups:
        start = time.perf_counter()
        answers = context.Queue()
        worker = context.Process(target=_query, args=(model, group, answers), daemon=True)
        worker.start()
        status, message = _answer(worker, answers, None if share is None else start + share)
        if worker.is_alive():               # answered and exiting, or past its budget
            worker.kill()
        worker.join()
        seconds = time.perf_counter() - start
        result.properties += [EngineVerdict(n, kind_of(n), status, "spacer", None, seconds, message=message)
                           for n in group]
    result.seconds = time.perf_counter() - t0
    return result

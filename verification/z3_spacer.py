"""Unbounded proofs with no hand-written invariant: Z3's Spacer engine on
constrained Horn clauses.

    Inv(s)  <=  Init(s)
    Inv(s') <=  Inv(s) AND T_a(s, s')          (one rule per action a)
    Bad     <=  Inv(s) AND NOT P(s)            (P: the conjunction of the properties)

`Bad` unreachable (the query answers unsat) proves P for every reachable
state, with Inv synthesised by Spacer; sat means a counterexample exists
(its depth is then found, and the trace confirmed, by `bmc`). The encoding is
the same transition relation as BMC's and k-induction's, over Ints (Spacer's
arithmetic engines want them); the auxiliary variables of the schedule and
the step's choices are universally quantified in the rules, which is the
existential of the body. T_a is T with the step's action fixed to a and
simplified, so each rule carries one action's effect, not all four: S11 on
single-seq took 26 s with one rule for T and 6-20 s (two runs) with four.
"""

from __future__ import annotations

import time
from typing import Iterable

import z3

from .models import Model
from .z3_invariants import INVARIANT_FORMULAS
from .z3_results import EngineResult, PropertyResult, kind_of
from .z3_system import ACTION_CODE, System
from .z3_terms import leaves


def _free_consts(fs: list[z3.ExprRef]) -> list[z3.ExprRef]:
    seen: dict[int, z3.ExprRef] = {}
    todo = list(fs)
    while todo:
        e = todo.pop()
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            seen.setdefault(e.get_id(), e)
        else:
            todo.extend(e.children())
    return list(seen.values())


def horn_clauses(system: System, properties: list[str]):
    """(fixedpoint, Bad): the three rules above on a Fixedpoint object."""
    s0, s1 = system.frame(0), system.frame(1)
    x0 = [v for n, v in leaves(s0) if not n.startswith("was_preempted")]
    x1 = [v for n, v in leaves(s1) if not n.startswith("was_preempted")]
    inv = z3.Function("Inv", *[v.sort() for v in x0], z3.BoolSort())
    bad = z3.Function("Bad", z3.BoolSort())
    fp = z3.Fixedpoint()
    fp.set(engine="spacer")
    fp.register_relation(inv, bad)
    init = [c for c in system.init(0) if "was_preempted" not in str(c)]
    step = system.step(0, 1)
    trans = [c for c in step.constraints if "was_preempted" not in str(c)]
    sched0, sdefs0 = system.sched(0)
    prop = z3.And([system.build(INVARIANT_FORMULAS[n], s0, sched0) for n in properties])
    variables = _free_consts(init + trans + sdefs0 + [prop])
    fp.declare_var(*variables)
    fp.rule(inv(*x0), init)
    for a in ACTION_CODE.values():
        fixed = [z3.simplify(z3.substitute(c, (step.choices.act, z3.IntVal(a)))) for c in trans]
        fp.rule(inv(*x1), [inv(*x0)] + [c for c in fixed if not z3.is_true(c)])
    fp.rule(bad(), [inv(*x0), z3.Not(prop)] + sdefs0)
    return fp, bad


def spacer(model: Model, properties: Iterable[str] | None = None, time_budget: float | None = None,
           separately: bool = True) -> EngineResult:
    """Prove `properties` (default: every spec invariant) with Spacer: each
    on its own query (`separately`, the budget split evenly), or all at once."""
    t0 = time.perf_counter()
    names = list(INVARIANT_FORMULAS if properties is None else properties)
    groups = [[n] for n in names] if separately else [names]
    res = EngineResult(model.name, "spacer", 0.0, 0)
    for group in groups:
        start = time.perf_counter()
        system = System(model, bitvectors=False)
        fp, bad = horn_clauses(system, group)
        if time_budget is not None:
            fp.set("timeout", max(1, int(time_budget / len(groups) * 1000)))
        try:
            r = fp.query(bad())
            reason = "" if r != z3.unknown else fp.reason_unknown()
        except z3.Z3Exception as e:          # a timeout surfaces as "canceled"
            r, reason = z3.unknown, str(e)
        seconds = time.perf_counter() - start
        status = "proved" if r == z3.unsat else "violated" if r == z3.sat else "unknown"
        message = f"Spacer gave up: {reason}" if status == "unknown" else ""
        if r == z3.unsat:
            message = f"synthesised invariant: {len(str(fp.get_answer()))} characters"
        res.properties += [PropertyResult(n, kind_of(n), status, "spacer", None, seconds, message=message)
                           for n in group]
    res.seconds = time.perf_counter() - t0
    return res

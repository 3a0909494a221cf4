"""Truth values of an encoding's formulas on concrete states and steps, for
the tests that hold a Z3 encoding's formulas against the spec's predicates
(tests/test_z3_reset_pause.py, tests/test_z3_reset_pause_kv.py): the frames'
and the action's values are substituted, so a perturbed successor is
evaluated as given (nothing of the relation asserted); a step formula that
reads the frame's schedule (RP1, RP5) is decided by a solve with the
schedule's definitions."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import z3

from flightcheck.spec import State
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import leaves


class FormulaEvaluator:
    def __init__(self, model: Model, auxiliary: Mapping[str, Any], transition: Mapping[str, Any]) -> None:
        self.system = System(model)
        self.step = self.system.step(0, 1)
        frame = self.system.frame(0)
        self.auxiliary = {n: self.system.build(f, frame) for n, f in auxiliary.items()}
        self.transition = {n: self.system.build(f, self.step) for n, f in transition.items()}
        self.before = [v for _, v in leaves(frame)]
        self.after = [v for _, v in leaves(self.system.frame(1))]
        self.solver = z3.Solver()
        self.solver.add(self.system.sched(0)[1])

    def _values(self, s: State) -> list:
        return [v for _, v in leaves(self.system.constant(s))]

    def state(self, s: State, name: str) -> bool:
        f = z3.substitute(self.auxiliary[name], *zip(self.before, self._values(s)))
        return z3.is_true(z3.simplify(f))

    def edge(self, s: State, code: int, t: State, name: str) -> bool:
        width = self.system.layout.width
        pairs = [*zip(self.before, self._values(s)), *zip(self.after, self._values(t)),
                 (self.step.choices.act, z3.IntVal(code) if width is None else z3.BitVecVal(code, width))]
        f = z3.simplify(z3.substitute(self.transition[name], *pairs))
        if z3.is_true(f) or z3.is_false(f):
            return z3.is_true(f)
        self.solver.push()              # the frame's schedule decides it
        self.solver.add(self.system.encode(s, 0))
        assert self.solver.check() == z3.sat
        truth = z3.is_true(self.solver.model().eval(f, model_completion=True))
        self.solver.pop()
        return truth

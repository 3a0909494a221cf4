"""The Z3 transition relation against the concrete spec, state by state.

For a concrete state s, `CrossChecker.check(s)` compares the two successor
relations both ways:
* every Z3 successor of encode(s) (enumerated with blocking clauses on the
  next frame) decodes to a concrete successor of s, and the action the Z3
  step chose decodes to a spec action that replays on the concrete spec from
  s to exactly that state;
* every concrete successor of s is among them (so it satisfies T).

The symbolic step is built once; for each s the frame's variables are
substituted by s's values and the formula simplified, which folds the
deterministic schedule away before the solver sees it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import z3
from flightcheck.spec import State, step
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import leaves


@dataclass
class CrossReport:
    states: int = 0
    edges: int = 0
    problems: list[str] = field(default_factory=list)


class CrossChecker:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.system = System(model)
        self.step = self.system.step(0, 1)
        self.relation = z3.And(self.step.constraints)
        self._before = [v for _, v in leaves(self.step.before)]

    def z3_successors(self, s: State, limit: int = 500) -> Iterator[tuple[object, State]]:
        """(action, state) for each distinct next state T allows from s."""
        values = [v for _, v in leaves(self.system.constant(s))]
        f = z3.simplify(z3.substitute(self.relation, *zip(self._before, values)))
        solver = z3.Solver()
        solver.add(f)
        for _ in range(limit):
            if solver.check() != z3.sat:
                return
            m = solver.model()
            nxt = self.system.decode(m, 1)
            yield self.system.decode_action(m, self.step), nxt
            solver.add(z3.Not(z3.And(self.system.encode(nxt, 1))))
        raise RuntimeError(f"more than {limit} Z3 successors: the next frame is not determined")

    def satisfies(self, s: State, nxt: State) -> bool:
        """T(encode(s), encode(nxt)) is satisfiable."""
        solver = z3.Solver()
        solver.add(self.relation, *self.system.encode(s, 0), *self.system.encode(nxt, 1))
        return solver.check() == z3.sat

    def check(self, s: State, report: CrossReport) -> set[State]:
        """Compare both successor relations at s; returns the concrete successors."""
        concrete: dict[State, object] = {}
        for action, nxt in concrete_successors(self.model, s):
            concrete.setdefault(nxt, action)
        found: set[State] = set()
        for action, nxt in self.z3_successors(s):
            found.add(nxt)
            if nxt not in concrete:
                report.problems.append(f"Z3 successor not in the spec: {action} from {s} gives {nxt}")
            elif _step_with_mutant(self.model, s, action) != nxt:
                report.problems.append(f"Z3 action {action} does not replay from {s}")
        for nxt in set(concrete) - found:
            report.problems.append(f"spec successor missing in Z3: {concrete[nxt]} from {s} gives {nxt}")
        report.states += 1
        report.edges += len(concrete)
        return set(concrete)


def concrete_successors(model: Model, s: State) -> Iterator[tuple[object, State]]:
    """The explicit search's successors, and with a KV connector every report
    the connector could make from s (connector.connector_reports)."""
    yield from explicit.successors(model, s)
    if model.cfg.kv_connector is not None:
        from flightcheck.verification.z3.encoding.connector import connector_reports
        yield from connector_reports(model, s)


def _step_with_mutant(model: Model, s: State, action: object) -> State | None:
    """The concrete spec's step, with the model's mutant applied."""
    with applied(model.mutant):
        return step(s, model.cfg, action)


def reachable(model: Model, limit: int | None = None) -> Iterator[State]:
    """Breadth-first over the concrete spec (every reachable state if no limit)."""
    root = explicit.initial(model)
    seen, frontier = {root}, deque([root])
    while frontier:
        s = frontier.popleft()
        yield s
        if limit is not None and len(seen) >= limit:
            continue
        for _, nxt in explicit.successors(model, s):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)


def random_walk_states(model: Model, count: int, seed: int = 0, max_len: int = 40) -> list[State]:
    """`count` distinct states met on seeded random walks from the initial state."""
    rng = random.Random(seed)
    found: dict[State, None] = {}
    root = explicit.initial(model)
    while len(found) < count:
        s = root
        for _ in range(rng.randint(1, max_len)):
            succ = [nxt for _, nxt in explicit.successors(model, s)]
            if not succ:
                break
            s = rng.choice(succ)
            found.setdefault(s)
            if len(found) >= count:
                break
    return list(found)

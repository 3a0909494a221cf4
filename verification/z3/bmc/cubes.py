"""The paths of a BMC run cut into parts (`Cube`s) on the label of one early
step, so that processes can share them (parallel.py `bmc_split`): together
the parts hold every path, each a prefix-closed set."""

from __future__ import annotations

from dataclasses import dataclass

import z3
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding.actions import ABORT, ARRIVE, COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.system import Step
from flightcheck.verification.z3.encoding.terms import conj, disj, eq, neg


@dataclass(frozen=True)
class Cube:
    """The paths whose step `at` carries one of `labels` ((action code,
    request) pairs; request 0 for schedule and complete), or, with `negate`,
    none of them. The set is prefix-closed, so a part's lemmas on the prefix
    stay sound; paths of at most `at` steps belong to every part."""

    at: int
    labels: frozenset[tuple[int, int]]
    negate: bool = False

    def __str__(self) -> str:
        names = {ARRIVE: "arrive r{}", SCHEDULE: "schedule", COMPLETE: "complete", ABORT: "abort r{}"}
        labels = ", ".join(names[a].format(r) for a, r in sorted(self.labels))
        return f"step {self.at + 1} is {'none' if self.negate else 'one'} of {{{labels}}}"

    def formula(self, step: Step) -> z3.BoolRef:
        """The step carries one of the labels (none of them, with `negate`)."""
        inside = disj(*[conj(eq(step.choices.act, action), eq(step.choices.req, request))
                        for action, request in sorted(self.labels)])
        return neg(inside) if self.negate else inside


def split(model: Model, parts: int) -> list[Cube | None]:
    """`parts` cubes that together hold every path, on the label of the
    second step (the first is an arrival). For two parts the cut is the one
    measured to balance on shared-k3: a schedule against everything else
    (114 s and 130 s to depth 8, `benchmarks/bmc_depth.py --jobs 2`); more
    parts deal the other labels out in turn, the last taking whatever the
    others do not name."""
    if parts <= 1:
        return [None]
    num_requests = model.num_requests
    others = [(ARRIVE, num_requests - 1), *[(ARRIVE, r) for r in range(num_requests - 1)], (COMPLETE, 0),
              *[(ABORT, r) for r in range(num_requests)]]
    if parts > max_parts(model):
        raise ValueError(f"{model.name}: at most {max_parts(model)} parts (one per label of the second step), "
                         f"not {parts}")
    named = [[(SCHEDULE, 0)], *[others[i::parts - 1] for i in range(parts - 2)]]
    covered = frozenset(x for group in named for x in group)
    return [Cube(1, frozenset(group)) for group in named] + [Cube(1, covered, negate=True)]


def max_parts(model: Model) -> int:
    """One part per label a step can carry: schedule, complete, and an arrival and an abort per request."""
    return 2 + 2 * model.num_requests

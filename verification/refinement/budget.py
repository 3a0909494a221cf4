"""The step budget of a fuzz run: how many rule steps the machine may take
before the run stops with no failure, and, once a failure is seen, how many
steps and seconds it took (what `flightcheck fuzz` reports)."""

from __future__ import annotations

import time


class BudgetSpent(BaseException):
    """The run's step budget is used up with no failure. A BaseException, so
    Hypothesis does not take it for a failing test and stops at once."""


class Budget:
    """Rule steps left to a fuzz run. Once a failure is seen the budget stops
    gating, so Hypothesis can replay and shrink the failing program."""

    def __init__(self, steps: int) -> None:
        self.steps, self.used = steps, 0
        self.failure_seen = False
        self.steps_to_failure: int | None = None
        self.seconds_to_failure: float | None = None
        self._t0 = time.perf_counter()

    def tick(self) -> None:
        if self.failure_seen:
            return
        if self.used >= self.steps:
            raise BudgetSpent()
        self.used += 1

    def fail(self) -> None:
        if not self.failure_seen:
            self.failure_seen, self.steps_to_failure = True, self.used
            self.seconds_to_failure = time.perf_counter() - self._t0

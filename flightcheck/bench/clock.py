"""Clocks for the serving loop: virtual (the simulator jumps) or wall (the
runtime benchmark sleeps). Both count seconds from the benchmark's start."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def wait_until(self, t: float) -> None:
        """Idle until time t (nothing to do before then)."""


class VirtualClock:
    """Simulated time; only the simulator's components move it."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    def advance_to(self, t: float) -> None:
        if t > self.t:
            self.t = t

    wait_until = advance_to


class WallClock:
    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def restart(self) -> None:
        """Time zero is now (after a slow start-up the benchmark should not count)."""
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

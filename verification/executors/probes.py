"""Tasks that measure and test an executor rather than check anything: an
empty task (benchmarks/executor_overhead.py times them), one that sleeps, one
that fails as a real task would, and one whose worker dies the first time it
runs. Module-level, so every executor's workers import them by name."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def echo(value: object) -> object:
    """Nothing but the round trip: the executor's own cost per task."""
    return value


def nap(seconds: float, value: object) -> object:
    """`value`, after `seconds`: finishes out of submission order on purpose."""
    time.sleep(seconds)
    return value


class ProbeFailure(ValueError):
    """The error `fail` raises: a task's own exception, with its one line."""


def fail(message: str) -> None:
    raise ProbeFailure(message)


def die_once(marker: str, value: object) -> object:
    """Kill this worker (SIGKILL, as the out-of-memory killer would) the
    first time, leaving `marker`; return `value` when run again."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return value

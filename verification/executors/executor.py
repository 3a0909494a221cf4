"""A task and the executor that runs it: what every executor shares
(verification/executors/__init__.py says how the seam is used; local.py and
ray_cluster.py are the two executors). `Executor.stream` submits, collects
in completion order, runs again a task lost with its worker, and cancels
what is pending when anything goes wrong."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

RETRIES = 3            # runs of a task lost with its worker before the campaign gives up

# Tasks run and tasks run again after being lost, since this process began.
COUNTS = {"tasks": 0, "retried": 0}


@dataclass(frozen=True)
class Task:
    """One independent piece of a campaign: `function(*args)` in some worker."""
    key: tuple[Any, ...]                 # where its result goes in the returned list
    function: Callable[..., Any]         # module-level: workers import it by name
    args: tuple[Any, ...] = ()
    label: str = ""                      # what progress and errors call it
    cpus: float = 1.0                    # what it declares to Ray (a Z3 query, a fuzz run: one)


@dataclass(frozen=True)
class Done:
    """A finished task, as `on_done` is told of it (completion order)."""
    task: Task
    result: Any
    finished: int                        # tasks finished so far, this one included
    total: int
    seconds: float                       # since the map began


class TaskLost(RuntimeError):
    """A task lost with its worker more often than `RETRIES` allows."""


class ExecutorUnavailable(RuntimeError):
    """The executor asked for cannot run here (Ray not installed, no cluster at the address)."""


class Executor:
    """Runs tasks; a context manager (closing it ends its workers; leaving it
    on an exception cancels what is still pending). Subclasses provide
    `_submit`, `_wait` (the finished handles, each with its outcome),
    `_recover` (after a loss) and `_cancel`."""

    name = ""

    def __enter__(self) -> "Executor":
        self._live: dict[Any, Task] = getattr(self, "_live", {})
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and getattr(self, "_live", None):
            self._cancel(list(self._live))
        self.close()

    def close(self) -> None:
        pass

    def map(self, tasks: Sequence[Task], on_done: Callable[[Done], None] | None = None) -> list[Any]:
        """Every task's result, ordered by key; `on_done` told of each as it finishes."""
        results = {}
        for done in self.stream(tasks):
            results[done.task.key] = done.result
            if on_done is not None:
                on_done(done)
        return [results[task.key] for task in sorted(tasks, key=lambda task: task.key)]

    def stream(self, tasks: Sequence[Task]) -> Iterator[Done]:
        """Each task's result as it finishes (completion order). The tasks
        are submitted at once, when `stream` is called: a caller may do
        other work before it reads the first result."""
        if len({task.key for task in tasks}) != len(tasks):
            raise ValueError("two tasks share a key")
        if not hasattr(self, "_live"):
            self._live = {}
        pending = {self._submit(task): task for task in tasks}
        self._live.update(pending)
        COUNTS["tasks"] += len(tasks)
        return self._collect(pending, len(tasks))

    def _collect(self, pending: dict[Any, Task], total: int) -> Iterator[Done]:
        started, finished = time.perf_counter(), 0
        runs = {task.key: 1 for task in pending.values()}
        try:
            while pending:
                lost = []
                for handle, outcome, value in self._wait(list(pending)):
                    task = pending.pop(handle)
                    self._live.pop(handle, None)
                    if outcome == "lost":
                        lost.append(task)
                        continue
                    if outcome == "error":
                        raise value
                    finished += 1
                    yield Done(task, value, finished, total, time.perf_counter() - started)
                if lost:
                    again = self._run_again(lost, runs, pending)
                    pending.update(again)
                    self._live.update(again)
        except BaseException:
            self._cancel(list(pending))
            raise

    def _run_again(self, lost: list[Task], runs: dict[tuple[Any, ...], int],
                   pending: dict[Any, Task]) -> dict[Any, Task]:
        """Resubmit the tasks lost with their worker (and those the recovery
        itself cut short); each counted as retried."""
        lost = lost + self._recover(pending)          # it empties `pending` where the pool went with it
        for task in lost:
            runs[task.key] += 1
            if runs[task.key] > RETRIES + 1:
                raise TaskLost(f"task {task.label or task.key} was lost with its worker {RETRIES + 1} times")
        COUNTS["retried"] += len(lost)
        return {self._submit(task): task for task in lost}

    def _submit(self, task: Task) -> Any:
        raise NotImplementedError

    def _wait(self, handles: list[Any]) -> list[tuple[Any, str, Any]]:
        raise NotImplementedError

    def _recover(self, pending: dict[Any, Task]) -> list[Task]:
        """Make the executor usable after a loss; the pending tasks it had to drop."""
        return []

    def _cancel(self, handles: list[Any]) -> None:
        pass


def call(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """What a worker runs for a task."""
    return function(*args)

"""Where a campaign's independent tasks run: the one seam every
campaign-shaped command goes through (`flightcheck fuzz --seeds`, `flightcheck
vllm campaign`, `verify`'s task pools).

    with open_executor(workers=2) as executor:
        rows = executor.map([Task((seed,), run_one, (seed,), f"seed {seed}") for seed in seeds])

A `Task` is a module-level function and its arguments (both picklable), the
key that places its result, a label for progress and errors, and the CPUs it
declares. Two executors run them:

* `local` (local.py): a process pool on this machine, its workers started
  the way every child of a command starts (SIGINT blocked: the command's
  process answers a Ctrl-C, flightcheck/commands/interrupts.py);
* `ray` (ray_cluster.py): Ray tasks on a cluster (`--ray-address`), or on a
  Ray instance started here; Ray is the optional `cluster` extra.

Either way, results come back in completion order to `on_done` (progress),
and `map` returns them ordered by key (seed, workload, property), so the two
executors' outputs compare as they are. A task lost with its worker (a
killed process, a node gone) is run again, up to `RETRIES` times, and
counted (`counts()["retried"]`); a task that raises has its exception raised
here, the same exception the task raises in-process, so a command prints
the same one line whichever executor ran it. A Ctrl-C (KeyboardInterrupt)
cancels every task still pending before it propagates.

Which executor `open_executor` opens is set once per command
(`configure`, from `--executor` and `--ray-address`), so a pool deep inside
the Z3 engines follows the command's choice without an argument threaded
through every layer.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

EXECUTORS = ("local", "ray")
RETRIES = 3            # runs of a task lost with its worker before the campaign gives up


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


@dataclass
class _Settings:
    kind: str = "local"
    address: str | None = None


_settings = _Settings()
_counts = {"tasks": 0, "retried": 0}


def configure(kind: str = "local", address: str | None = None) -> None:
    """The executor this process's campaigns use from now on."""
    if kind not in EXECUTORS:
        raise ValueError(f"unknown executor {kind!r}; known: {', '.join(EXECUTORS)}")
    _settings.kind, _settings.address = kind, address


def configured() -> str:
    """The name of the executor `open_executor` opens."""
    return _settings.kind


def counts() -> dict[str, int]:
    """Tasks run and tasks run again after being lost, since this process began."""
    return dict(_counts)


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--executor` and `--ray-address`, the same on every command that runs tasks."""
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="where the tasks run: local processes (default) or a Ray cluster "
                             "(pip install -e '.[cluster]'; docs/cluster.md)")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="the Ray cluster to run on (`auto`, `HOST:6379`, `ray://HOST:10001`); "
                             "default: a Ray instance started here for the command")


def configure_from(args: argparse.Namespace) -> str | None:
    """`configure` from the options `add_options` added; the one-line refusal
    when `--executor ray` cannot run here (the caller exits 2), else None."""
    kind, address = getattr(args, "executor", "local"), getattr(args, "ray_address", None)
    if address is not None and kind != "ray":
        return "--ray-address needs --executor ray"
    if kind == "ray":
        from .ray_cluster import ray_missing
        missing = ray_missing()
        if missing:
            return missing
    configure(kind, address)
    return None


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
        _counts["tasks"] += len(tasks)
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
        _counts["retried"] += len(lost)
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


@contextmanager
def open_executor(workers: int, kind: str | None = None) -> Iterator[Executor]:
    """The configured executor (or `kind`), with `workers` processes where it
    is local; a Ray cluster sizes itself."""
    kind = kind or _settings.kind
    if kind == "ray":
        from .ray_cluster import RayExecutor
        executor: Executor = RayExecutor(_settings.address)
    else:
        from .local import LocalExecutor
        executor = LocalExecutor(workers)
    with executor:
        yield executor


def run_tasks(tasks: Sequence[Task], workers: int, on_done: Callable[[Done], None] | None = None) -> list[Any]:
    """`map` on a configured executor opened for these tasks alone."""
    with open_executor(workers) as executor:
        return executor.map(tasks, on_done)


def progress_line(command: str, done: Done) -> str:
    """A finished task, as a line for stderr."""
    return (f"{command} [{done.seconds:7.1f} s] {done.finished}/{done.total} done: "
            f"{done.task.label or done.task.key} ({_settings.kind})")


def progress_printer(command: str, lines: int = 20) -> Callable[[Done], None]:
    """An `on_done` that writes `progress_line`s to stderr: every task of a
    small campaign, about `lines` of a large one (and always the last)."""
    def tell(done: Done) -> None:
        every = max(1, done.total // lines)
        if done.finished % every == 0 or done.finished == done.total:
            print(progress_line(command, done), file=sys.stderr, flush=True)
    return tell

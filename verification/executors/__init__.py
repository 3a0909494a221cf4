"""Where a campaign's independent tasks run: the one seam every
campaign-shaped command goes through (`flightcheck fuzz --seeds`, `check-trace`
of many traces, `flightcheck vllm campaign`, `verify`'s task pools).

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .executor import COUNTS, RETRIES, Done, Executor, ExecutorUnavailable, Task, TaskLost

EXECUTORS = ("local", "ray")
__all__ = ["EXECUTORS", "RETRIES", "Done", "Executor", "ExecutorUnavailable", "Task", "TaskLost", "add_options",
           "configure", "configure_from", "configured", "counts", "open_executor", "progress_printer", "ran_since",
           "run_tasks"]


@dataclass
class _Settings:
    kind: str = "local"
    address: str | None = None


_settings = _Settings()


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
    return dict(COUNTS)


def ran_since(before: dict[str, int]) -> dict[str, object]:
    """What a command's JSON says of its tasks: the executor, and the tasks
    run and run again since `counts()` gave `before`."""
    now = counts()
    return {"executor": _settings.kind, "tasks": now["tasks"] - before["tasks"],
            "retried": now["retried"] - before["retried"]}


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

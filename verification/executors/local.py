"""The local executor: a pool of processes on this machine.

Workers are spawned, not forked (a Z3 context does not survive a fork), and
start as every child of a command does: with SIGINT blocked
(flightcheck/commands/interrupts.py wraps `multiprocessing`'s Process.start
once the command runs), so a Ctrl-C reaches the command's process alone,
which kills them. A worker that dies (killed, out of memory) breaks the
whole pool: the pool is started anew and every task it held is run again.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .executor import Executor, Task, call


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _started(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")      # Z3 contexts do not survive a fork
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    def _submit(self, task: Task) -> concurrent.futures.Future:
        return self._started().submit(call, task.function, task.args)

    def _wait(self, handles: list[Any]) -> list[tuple[Any, str, Any]]:
        done, _ = concurrent.futures.wait(handles, return_when=concurrent.futures.FIRST_COMPLETED)
        outcomes = []
        for future in done:
            try:
                outcomes.append((future, "ok", future.result()))
            except BrokenProcessPool:
                outcomes.append((future, "lost", None))
            except Exception as err:            # noqa: BLE001 (the task's own error, raised by the caller)
                outcomes.append((future, "error", err))
        return outcomes

    def _recover(self, pending: dict[Any, Task]) -> list[Task]:
        """A broken pool fails every task it holds: a fresh pool, and those tasks to run again."""
        self._kill()
        dropped = list(pending.values())
        for handle in pending:
            self._live.pop(handle, None)
        pending.clear()
        return dropped

    def _cancel(self, handles: list[Any]) -> None:
        self._kill()

    def _kill(self) -> None:
        """End the pool at once: its workers killed, queued tasks dropped."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            try:
                process.kill()
                process.join(timeout=2)
            except (OSError, ValueError, AssertionError):     # already gone, or closed
                pass

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

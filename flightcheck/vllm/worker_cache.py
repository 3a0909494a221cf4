"""The replay workers a task process keeps between its tasks.

A campaign on an executor (verification/executors) is one task per
workload; loading vLLM takes seconds, so a process that runs many tasks
(a local pool's worker, a Ray worker) keeps the replay worker of the version
it last ran, and of one more: a task of another version starts its own. They
are closed when the process ends (a local pool's worker ends through
`multiprocessing`'s finalizers, a Ray worker through `atexit`); a process
killed outright leaves its replay worker to read the end of its input and
exit.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
from collections import OrderedDict
from pathlib import Path

from .replay import ReplayWorker

KEPT = 2                 # replay workers kept alive in one process at most

_workers: "OrderedDict[tuple[str, str | None], ReplayWorker]" = OrderedDict()
_closing_registered = False


def replay_worker(version: str, python: Path | None = None) -> ReplayWorker:
    """A running replay worker of `version` (with `python`: that interpreter's)."""
    global _closing_registered
    key = (version, None if python is None else str(python))
    if key in _workers:
        _workers.move_to_end(key)
        return _workers[key]
    while len(_workers) >= KEPT:
        _, oldest = _workers.popitem(last=False)
        oldest.close()
    if not _closing_registered:
        atexit.register(close_all)
        multiprocessing.util.Finalize(None, close_all, exitpriority=10)
        _closing_registered = True
    _workers[key] = ReplayWorker(version, python)
    return _workers[key]


def close_all() -> None:
    while _workers:
        _, worker = _workers.popitem()
        worker.close()

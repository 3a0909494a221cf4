"""Starting and reaping the stage processes of a local launch.

The stages start with torch.multiprocessing's `spawn` (a fresh interpreter
each: fork would copy the driver's threads and gloo state), with one OpenMP
thread, and deaf to the signals that stop a run: a stage spends its first
seconds importing torch, before `stage_entry` can ignore SIGINT, and a
Ctrl-C then (the terminal sends it to the whole process group) would print
its `KeyboardInterrupt` traceback on the user's terminal. So the driver
blocks SIGINT, SIGTERM and SIGHUP in its main thread while it starts them:
the mask survives fork and exec and Python leaves it as it finds it, so a
stage starts with them blocked (`stage_entry` then ignores SIGINT and
unblocks the rest), while one that reaches the driver meanwhile stays
pending and is delivered when the block lifts, never lost. multiprocessing's
resource tracker, started by the first process start of a run, unblocks
SIGINT and SIGTERM in the caller once it has started, so it is started
before the block.

Each stage beats into a shared array (heartbeat.py) and is tied to the
driver's life (lifeline.py).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any

import torch.multiprocessing as mp

from .stage_main import StageLaunch, stage_entry

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def start_stages(processes: list, num_stages: int, port: int, act_backend: str,
                 timeout_s: float, log_path: str) -> Any:
    """Start one process per stage (stage i is rank i + 1 of the store's
    world at `port`), appending each to `processes` once started (so the
    caller can reap those that started if a later one fails). Returns the
    stages' heartbeat array."""
    ctx = mp.get_context("spawn")
    heartbeats = ctx.RawArray("d", num_stages)
    from_main_thread = threading.current_thread() is threading.main_thread()
    resource_tracker.ensure_running()            # before the block: it would lift it
    with _signals_blocked(), _environment("OMP_NUM_THREADS", "1"):
        for rank in range(1, num_stages + 1):
            launch = StageLaunch(rank, num_stages + 1, "127.0.0.1", port, act_backend, timeout_s,
                                 log_path, heartbeats, from_main_thread)
            process = ctx.Process(target=stage_entry, args=(launch,), daemon=True,
                                  name=f"stage-{rank - 1}")
            process.start()
            processes.append(process)
    return heartbeats


def reap(processes: list, timeout_s: float = 5.0) -> None:
    """SIGKILL every stage process still alive (a stopped one too), then
    wait for each."""
    for p in processes:
        if p.pid is not None and p.is_alive():
            p.kill()
    for p in processes:
        if p.pid is not None:
            p.join(timeout_s)


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """STOP_SIGNALS blocked in this thread for the block's duration."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old

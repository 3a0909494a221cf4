"""Heartbeats: how the driver tells a hung stage from a busy one.

Every spawned stage runs a thread that writes the time (`time.monotonic()`:
CLOCK_MONOTONIC, one clock for every process on the machine) into its slot
of an array in shared memory every BEAT_S seconds. A thread of the driver
(`HangWatch`) reads the slots every WATCH_S seconds: a stage whose last beat
is older than HANG_S is hung, stopped (SIGSTOP, a debugger) or wedged with
its GIL held, unless /proc shows it working all the same (CPU time used in
that while: a long call into C that holds the GIL, say, loading weights; or
waiting on a device). Before its first beat a stage is still importing torch, which
takes seconds on a loaded machine, so silence proves nothing yet: then only
its /proc state counts, stopped (`T`) or traced (`t`) for HANG_S.

The watch names the first hung stage (index, pid, what /proc says of it) as
the run's failure, then SIGKILLs it (SIGKILL ends a stopped process too):
the hang becomes the death of a stage, which every wait of the driver
already handles, so the run ends with its partial trace and every process
reaped.

The bound: a hung stage is named within HANG_S + BEAT_S + WATCH_S = 5.75 s
of the moment it hung, and the run has ended a second later. Why 5 s: a beat
costs microseconds every half second; on this project's 2-core machine
shared by eight sessions (load 6 to 8) a woken thread waits tens of
milliseconds for a core, and a stage's main thread lets go of the GIL in
every torch op, so a live stage's beats come late by well under a second.
Ten missed beats are a hang, not a slow batch, and 5 s leaves the promised
10 s room for the run's own shutdown on such a machine.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BEAT_S = 0.5          # a stage beats this often
HANG_S = 5.0          # silent this long: hung
WATCH_S = 0.25        # the driver looks this often

HAS_PROC = Path("/proc/self/stat").exists()
STATES = {"T": "stopped by a signal", "t": "stopped by a debugger", "D": "waiting on a device",
          "R": "running", "S": "sleeping"}


def start_beating(slots: Any, index: int) -> None:
    """In stage `index`'s process: beat into `slots[index]` until it ends."""
    def beat() -> None:
        while True:
            slots[index] = time.monotonic()
            time.sleep(BEAT_S)

    threading.Thread(target=beat, daemon=True, name="heartbeat").start()


def process_stat(pid: int) -> tuple[str, int] | None:
    """The process's one-letter state in /proc and the CPU time it has used
    (clock ticks), or None (gone, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()        # from field 3, the state, on
    return fields[0], int(fields[11]) + int(fields[12])   # utime + stime


class HangWatch:
    """The driver's watch over `processes` (stage i is `processes[i]`),
    whose beats land in `slots`. `failure`: the hung stage, in words, once
    one is found; `on_hang(failure)` is called before the stage is killed."""

    def __init__(self, slots: Any, processes: Sequence[Any], hang_s: float = HANG_S) -> None:
        self.slots, self.processes, self.hang_s = slots, list(processes), hang_s
        self.failure: str | None = None
        self.on_hang: Callable[[str], None] | None = None
        self._stopped_since: dict[int, float] = {}
        self._cpu: dict[int, tuple[int | None, float]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hang-watch")
        self._thread.start()

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.wait(WATCH_S):
            for index, process in enumerate(self.processes):
                failure = self.hung(index, process, time.monotonic())
                if failure is not None and not self._done.is_set():
                    self.failure = failure
                    if self.on_hang is not None:
                        self.on_hang(failure)
                    _kill(process.pid)
                    return

    def hung(self, index: int, process: Any, now: float) -> str | None:
        """Stage `index` in words if it is hung, else None: silent for
        hang_s, and neither using CPU time in that while (a long call into C
        that holds the GIL, loading weights, is work) nor waiting on a device."""
        stat = process_stat(process.pid)
        if stat is None and HAS_PROC:                    # gone: a death, not a hang
            return None
        state, cpu = stat if stat is not None else (None, None)
        if state in ("Z", "X"):
            return None
        stopped = state in ("T", "t")
        if stopped:
            self._stopped_since.setdefault(index, now)
        else:
            self._stopped_since.pop(index, None)
        if index not in self._cpu or self._cpu[index][0] != cpu:
            self._cpu[index] = (cpu, now)                # (CPU time, when it last grew)
        last_beat = self.slots[index]
        if last_beat > 0.0:
            silent = now - last_beat
        else:                                            # still starting: only a stop counts
            silent = now - self._stopped_since.get(index, now)
        working = not stopped and (state == "D" or now - self._cpu[index][1] <= self.hang_s)
        if silent <= self.hang_s or working:
            return None
        where = (f"its process is {STATES.get(state, 'in state ' + state)}, /proc state {state}"
                 if state is not None else "no /proc to say why")
        return (f"stage {index} (pid {process.pid}) is hung: no heartbeat for {silent:.1f} s "
                f"({where})")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass

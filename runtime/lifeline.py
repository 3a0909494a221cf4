"""A stage process's ties to its driver: no stage outlives the driver that
started it, whatever ended the driver (SIGKILL included), by more than a
moment.

Two ties, set first thing in `stage_entry`, each covering what the other
cannot:

* the parent-death signal: Linux's `prctl(PR_SET_PDEATHSIG, SIGKILL)` makes
  the kernel kill the stage as the driver's thread that started it exits
  (so it is set only when that thread is the driver's main thread: a
  worker thread may end long before the driver). A driver that died
  between the stage's fork and its prctl sends nothing, so the stage then
  compares `os.getppid()` with the driver's pid (an orphan has been handed
  to another parent) and ends itself;
* a watchdog pipe, also where there is no prctl: multiprocessing hands every
  spawned child the read end of a pipe whose write end only the driver holds
  (`multiprocessing.parent_process().sentinel`); a thread blocks on it and
  ends the stage at the EOF the driver's death makes, within milliseconds (a
  poll of the parent once a second would be too slow).

Neither needs the driver to run any code as it dies. The multiprocessing
helper (the resource tracker) exits by itself once every holder of its pipe,
the driver and the stages, is gone. What no tie covers: a stage still
importing torch when its driver is SIGKILLed finishes that import (its
start-up, seconds on a loaded machine) before it reaches `stage_entry`, then
ends at once without loading anything.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1              # <linux/prctl.h>

# The exit code of a stage that ends because its driver is gone (nobody reads
# it: the driver is dead; 128 + SIGHUP says "lost the one who started me").
DRIVER_GONE = 128 + signal.SIGHUP


def tie_to_driver(parent_death_signal: bool = True) -> None:
    """In a spawned stage process: end it the moment its driver dies.
    `parent_death_signal`: the driver started it from its main thread."""
    parent = multiprocessing.parent_process()
    if parent is None:                # not a spawned child (torchrun's ranks have torchrun)
        return
    if parent_death_signal and sys.platform.startswith("linux"):
        _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent.pid:    # the driver died before the signal was set
        os._exit(DRIVER_GONE)
    _watch(parent.sentinel)


def _set_parent_death_signal(signum: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the watchdog pipe alone
        pass


def _watch(sentinel: int) -> None:
    def wait_for_eof() -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(DRIVER_GONE)

    threading.Thread(target=wait_for_eof, daemon=True, name="driver-watchdog").start()

"""The child processes a command started outside `multiprocessing`, so a
Ctrl-C can end them with it (flightcheck/commands/interrupts.py kills the
`multiprocessing` ones and these). Standard library only: any layer may
register its children here."""

from __future__ import annotations

import subprocess
import weakref

_children: "weakref.WeakSet[subprocess.Popen]" = weakref.WeakSet()


def register(process: subprocess.Popen) -> subprocess.Popen:
    """Remember `process` (until it is garbage) as one to kill on Ctrl-C."""
    _children.add(process)
    return process


def kill_all(timeout_s: float = 2.0) -> None:
    """SIGKILL every registered child still running, and reap it."""
    for process in list(_children):
        if process.poll() is None:
            try:
                process.kill()
                process.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass

"""The CPU a command run in the test's process costs, for the tests that bound
a verify run: its wall time is that CPU over the share a busy host gives the
suite (several times longer at load 15 under `nice -n 10`), so a bound on
wall time fails on a busy host and one on CPU only when the command itself
became slower."""

from __future__ import annotations

import resource


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread) and of its children
    reaped so far (verify's worker processes, once their pool is closed)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

"""A driver's answer to the signals that ask it to stop: SIGINT (Ctrl-C),
SIGTERM (`kill`, a job scheduler's end of a job) and SIGHUP (the terminal
closed).

Inside `stop_signals()`, SIGINT raises `KeyboardInterrupt` as ever (through
the command's own handler, flightcheck/commands/interrupts.py, when one is
set), and SIGTERM or SIGHUP raise `StopSignal`, so the `finally` blocks that answer
Ctrl-C also answer them: the stages are stopped and reaped and the trace is
flushed and closed, where the default action would end the driver on the
spot with its buffered trace lines lost. After the first of the three, all
three are ignored until the block ends, so that the clean-up, which is
bounded (the stages are SIGKILLed; any left die with the driver,
runtime/lifeline.py), runs to its end.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(BaseException):
    """SIGTERM or SIGHUP asked the driver to stop (a BaseException, like
    KeyboardInterrupt: no `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.trace_events: int | None = None     # set by a command that had a trace open

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process that the signal ended."""
        return 128 + self.signum


@contextmanager
def stop_signals() -> Iterator[None]:
    """Turn the stop signals into exceptions in the main thread for the
    block's duration (elsewhere, where Python takes no signals: nothing). A
    signal the process was started ignoring (`nohup`, a shell's `&`) stays
    ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def on_signal(signum: int, frame: Any) -> None:
        try:
            before = previous[signum]
            if signum == signal.SIGINT and callable(before):
                before(signum, frame)         # the command's own Ctrl-C handler (interrupts.py)
                return                        # it chose to deliver it later: nothing ignored yet
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise StopSignal(signum)
        except BaseException:
            for s in STOP_SIGNALS:            # the clean-up is not interrupted again
                signal.signal(s, signal.SIG_IGN)
            raise

    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:     # ignored on purpose (nohup, `&`): still ignored
            signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)

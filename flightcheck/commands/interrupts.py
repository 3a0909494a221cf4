"""Ctrl-C and standard output, for every command: one line, never a traceback.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the
command's process and every worker it started (verify's Z3 pools, the
simulator's calibration pool, vLLM replay workers). Left to Python, each of
them prints its own `KeyboardInterrupt` traceback, and a pool's shutdown may
wait for a Z3 query to finish. So the command's own process owns
interruption:

* every child process started through `multiprocessing` starts with SIGINT
  blocked (the signal mask survives fork and exec, and a Python child keeps
  it), so no worker prints anything;
* on SIGINT the command's process kills those children at once, then raises
  `KeyboardInterrupt`, which `flightcheck.cli.main` turns into one line and
  exit code 130 (128 + SIGINT, as shells report it).

A command that answers Ctrl-C itself (check-trace --follow and monitor give
the verdict so far) sets its own SIGINT handler for that time; while it is
set, none of the above happens.

Standard output that cannot be written (`> /dev/full`, a closed pipe) is one
line naming the cause, exit code 2, instead of a traceback at exit.
"""

from __future__ import annotations

import errno
import multiprocessing
import multiprocessing.process
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

INTERRUPTED = 128 + signal.SIGINT          # 130: what a shell reports for a Ctrl-C
STDOUT_LOST = 2

_original_start: Callable[[Any], None] | None = None
_received = False
_watching = False
_deadline: list[threading.Timer] = []         # the exit deadline, once a Ctrl-C armed it
_settings: dict[str, Any] = {"command": "", "exit_after_s": None, "owner": 0}

# A Ctrl-C can fail to end the command on its own: raised inside a finalizer,
# a KeyboardInterrupt is printed and dropped; during a long call into C (a Z3
# query) Python's handler does not even run. As the command, the process is
# ended this long after a Ctrl-C whatever it is doing.
EXIT_AFTER_CTRL_C_S = 5.0


def install(command: str, *, exit_after_s: float | None = None) -> None:
    """Make this process the owner of Ctrl-C (see the module docstring); with
    `exit_after_s`, the process ends that long after a Ctrl-C at the latest.
    Idempotent; a no-op off the main thread, where signals cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        return
    _settings.update(command=command, exit_after_s=exit_after_s, owner=os.getpid())
    signal.signal(signal.SIGINT, _in_main_thread)
    _watch_from_a_thread()
    _start_children_deaf()
    _quiet_teardown_after_ctrl_c()


def _in_main_thread(signum: int, frame: Any) -> None:
    """Python's SIGINT handler (it runs in the main thread, between bytecodes):
    raise KeyboardInterrupt. In a forked child that inherited it, leave quietly."""
    global _received
    if os.getpid() != _settings["owner"]:
        os._exit(INTERRUPTED)
    _received = True
    if _inside_finalizer(frame):          # it would be dropped here: deliver it again shortly
        again = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGINT))
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt


def _watch_from_a_thread() -> None:
    """The C-level handler writes each signal's number to a pipe at once
    (`signal.set_wakeup_fd`); a thread reading it acts even while the main
    thread is inside C: it kills the children, asks Z3 to stop its query, and
    arms the exit deadline."""
    global _watching
    if _watching:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_end,), name="flightcheck-ctrl-c", daemon=True).start()
    _watching = True


def _watch(read_end: int) -> None:
    global _received
    while True:
        received = os.read(read_end, 64)
        if not received:
            return
        if signal.SIGINT not in received or os.getpid() != _settings["owner"]:
            continue
        if signal.getsignal(signal.SIGINT) is not _in_main_thread:
            continue                      # a command handling Ctrl-C itself (check-trace --follow)
        _received = True
        if not _deadline and _settings["exit_after_s"] is not None:   # armed first: nothing below stops it
            deadline = threading.Timer(_settings["exit_after_s"], _exit_now)
            deadline.daemon = True            # a command that ends in time ends as it would
            deadline.start()
            _deadline.append(deadline)
        try:
            kill_children()
            _interrupt_z3()
        except Exception:                     # noqa: BLE001 (the deadline still ends the command)
            pass


def _interrupt_z3() -> None:
    """Make a running Z3 query return at once (its `Context.interrupt`), so
    the main thread gets back to Python and sees the KeyboardInterrupt."""
    z3 = sys.modules.get("z3")
    if z3 is None:
        return
    try:
        z3.main_ctx().interrupt()
    except Exception:                     # noqa: BLE001 (best effort, whatever Z3's state)
        pass


def _exit_now() -> None:
    try:
        kill_children()
    except Exception:                         # noqa: BLE001 (exiting regardless)
        pass
    say_interrupted(_settings["command"])
    os._exit(INTERRUPTED)


def _quiet_teardown_after_ctrl_c() -> None:
    """After a Ctrl-C, what the interruption left half-built complains: in
    finalizers ("Exception ignored in ... __del__") and in the threads of a
    pool whose workers were killed. Noise, not news: silenced then, and only
    then."""
    if getattr(sys.unraisablehook, "_flightcheck", False):
        return
    default_unraisable, default_thread = sys.unraisablehook, threading.excepthook

    def unraisable(report: Any) -> None:
        if not _received:
            default_unraisable(report)

    def thread(report: Any) -> None:
        if not _received:
            default_thread(report)

    unraisable._flightcheck = True                            # type: ignore[attr-defined]
    sys.unraisablehook, threading.excepthook = unraisable, thread


def _inside_finalizer(frame: Any) -> bool:
    """Whether the signal came while a `__del__` ran, where a raised
    KeyboardInterrupt is printed and dropped instead of propagating."""
    for _ in range(64):
        if frame is None:
            return False
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def received() -> bool:
    """Whether a Ctrl-C reached the command: then whatever exception ends it
    (a KeyboardInterrupt that a C library turned into its own error, say) is
    the interruption, not a bug."""
    return _received


def kill_children() -> None:
    """SIGKILL every live child of this process (its `multiprocessing` ones,
    and those registered in flightcheck.children) and reap it."""
    from flightcheck import children

    children.kill_all()
    for child in multiprocessing.active_children():
        try:
            child.kill()
            child.join(timeout=2)
        except (OSError, ValueError, AssertionError):     # already gone, or closed
            pass


def _start_children_deaf() -> None:
    """Wrap `multiprocessing`'s Process.start so each child starts deaf to
    SIGINT (blocked around the fork, unblocked in the parent at once)."""
    global _original_start
    if _original_start is not None:
        return
    _original_start = original = multiprocessing.process.BaseProcess.start

    def start(self: Any) -> None:
        if getattr(self, "_start_method", None) != "fork":
            # The resource tracker, started by the first spawn, unblocks SIGINT
            # in its caller once it runs: start it before the block, not inside.
            multiprocessing.resource_tracker.ensure_running()
        with sigint_blocked():
            original(self)

    multiprocessing.process.BaseProcess.start = start      # type: ignore[method-assign]


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread for the duration: a child forked or
    spawned meanwhile inherits the blocked mask (fork and exec both keep it,
    and Python never unblocks it), so a Ctrl-C never reaches it; one that
    arrives meanwhile stays pending for this process and is delivered when
    the block lifts, never lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def answered() -> None:
    """The command has answered the Ctrl-C (its line is written): further
    ones, or one delivered again, must not end the teardown by SIGINT."""
    as_the_command = _settings["exit_after_s"] is not None      # not a test calling main()
    if as_the_command and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _forget_the_interpreters_uncaught_ctrl_c()


def _forget_the_interpreters_uncaught_ctrl_c() -> None:
    """CPython notes a KeyboardInterrupt that leaves code run by `exec` or
    `eval` of a string as uncaught, even when a caller catches it (Hypothesis
    builds the fuzzers' wrappers by `exec`, dataclasses their methods as a
    module loads), and a program run by `python -m` then ends by SIGINT
    after finalization instead of with its exit code (`_Py_UnhandledKeyboardInterrupt`, read by
    `Py_RunMain`; bpo-1054041). Answered here, the Ctrl-C is caught: clear
    the note, so the exit code stays 130. Elsewhere than CPython: nothing to
    clear."""
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, AttributeError, ValueError, OSError):
        pass


_said = threading.Lock()


def say_interrupted(command: str) -> None:
    """Write the Ctrl-C line to stderr, once per process whoever asks (the
    command as it unwinds, or the deadline if the unwinding takes too long)."""
    if _settings["exit_after_s"] is None:             # main() called by a program or a test
        sys.stderr.write(interrupted_line(command) + "\n")
        return
    if _said.acquire(blocking=False):
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.write(2, (interrupted_line(command) + "\n").encode())


def interrupted_line(command: str) -> str:
    return f"flightcheck {command}: interrupted (Ctrl-C); nothing more was written"


class _WatchedStdout:
    """Standard output as the command writes it, remembering whether a write
    failed: a buffered print can fail in a later call than the one that
    overflowed, and by then a flush may succeed on an emptied buffer."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            self.failure = err
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            self.failure = err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def watched_stdout() -> Iterator[None]:
    """sys.stdout watched for write failures for the duration (restored after)."""
    original = sys.stdout
    sys.stdout = _WatchedStdout(original)                     # type: ignore[assignment]
    try:
        yield
    finally:
        if isinstance(sys.stdout, _WatchedStdout):
            sys.stdout = original


def flush_stdout() -> str | None:
    """Flush standard output; why it cannot be written (one line), or None.
    After a failure stdout is pointed at /dev/null, so the interpreter's own
    flush at exit does not print a second error."""
    failure = getattr(sys.stdout, "failure", None)
    if failure is None:
        try:
            sys.stdout.flush()
        except OSError as err:
            failure = err
    if failure is None:
        return None
    _silence_stdout()
    return stdout_problem(failure)


def stdout_problem(err: OSError) -> str:
    if isinstance(err, BrokenPipeError) or err.errno == errno.EPIPE:
        return "standard output was closed before everything was written (broken pipe)"
    return f"cannot write standard output: {err.strerror or err}"


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    if isinstance(sys.stdout, _WatchedStdout):
        sys.stdout.failure = None
        sys.stdout._stream = open(os.devnull, "w")          # noqa: SIM115 (lives to exit)


def stdout_is_broken() -> bool:
    """Whether standard output can no longer be written (an OSError a command
    caught came from there, not from a bug of ours)."""
    return getattr(sys.stdout, "failure", None) is not None or _flush_fails()


def _flush_fails() -> bool:
    try:
        sys.stdout.flush()
        return False
    except OSError:
        return True

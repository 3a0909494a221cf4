"""The output paths of a command, checked before it does any work
(docs/outputs.md): no output may name an input or another output, and each
must be a place a file can be written.

* Two paths are the same file when they resolve to one path (symbolic links
  followed, `os.path.realpath`) or, for files that exist, when they are one
  inode (`st_dev`, `st_ino`): a hard link or a `/proc/self/fd/N` counts. An
  existing file inside an input directory (a checkpoint's config.json) counts
  as that input.
* An output that exists must be a regular file or a FIFO: a directory or a
  device is refused. A regular file must be writable and its directory must
  take a new file (whole files are written beside their target and renamed).
* A FIFO needs a reader, probed without blocking. A growing trace (a live
  checker reading it) waits up to `FIFO_WAIT_S` for one and says so on
  stderr; a whole file (written at the end) does not wait. The probe's file
  descriptor stays open while the command runs, so a reader that came does not
  see an end of file before the command's own writes.

`claim(...)` raises OutputRefused with the one-line reason (exit 2); the
`Claim` it returns is a context manager that lets the FIFOs go at the end.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

FIFO_WAIT_S = 10.0          # the longest a growing trace waits for a FIFO's reader
_POLL_S = 0.05


@dataclass(frozen=True)
class Output:
    flag: str                   # "--trace"
    path: str
    grows: bool = False         # a trace written as the run goes (a FIFO may wait for its reader)


class OutputRefused(ValueError):
    """Why an output cannot be written: one line, exit code 2."""


class Claim:
    """The outputs a command may write; holds each FIFO's probe open."""

    def __init__(self) -> None:
        self._held: list[int] = []

    def hold(self, fd: int) -> None:
        self._held.append(fd)

    def release(self) -> None:
        while self._held:
            os.close(self._held.pop())

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim(outputs: Iterable[Output | None], inputs: Iterable[tuple[str, str | None]] = ()) -> Claim:
    """Check every output (those whose path is None are left out) against the
    inputs, named (label, path), and each other; OutputRefused if one clashes
    or cannot be written."""
    wanted = [o for o in outputs if o is not None and o.path]
    named = [(label, path) for label, path in inputs if path]
    refuse_clashes(wanted, named)
    held = Claim()
    try:
        for output in wanted:
            fd = _check(output)
            if fd is not None:
                held.hold(fd)
    except BaseException:
        held.release()
        raise
    return held


def refuse_clashes(outputs: list[Output], inputs: list[tuple[str, str]]) -> None:
    seen: list[tuple[Output, _Identity]] = []
    sources = [(label, path, _Identity.of(path)) for label, path in inputs]
    for output in outputs:
        mine = _Identity.of(output.path)
        for label, path, theirs in sources:
            if mine.same(theirs) or mine.inside(theirs):
                how = "is inside" if not mine.same(theirs) else "is the same file as"
                raise OutputRefused(f"{output.flag} {output.path} {how} {label} {path} ({theirs.real}): "
                                    f"an output must not overwrite an input")
        for other, theirs in seen:
            if mine.same(theirs):
                raise OutputRefused(f"{output.flag} {output.path} and {other.flag} {other.path} are the "
                                    f"same file ({mine.real}): give each output its own path")
        seen.append((output, mine))


@dataclass(frozen=True)
class _Identity:
    real: str                          # symbolic links resolved
    inode: tuple[int, int] | None      # (st_dev, st_ino) of an existing file
    is_dir: bool

    @classmethod
    def of(cls, path: str) -> "_Identity":
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError):               # a NUL in the path: _check refuses it
            real = path
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return cls(real, None, False)
        return cls(real, (st.st_dev, st.st_ino), stat.S_ISDIR(st.st_mode))

    def same(self, other: "_Identity") -> bool:
        return self.real == other.real or (self.inode is not None and self.inode == other.inode)

    def inside(self, other: "_Identity") -> bool:
        """An existing file in the input directory `other`."""
        return (other.is_dir and self.inode is not None
                and self.real.startswith(other.real.rstrip(os.sep) + os.sep))


def _check(output: Output) -> int | None:
    """Refuse what cannot be written; a FIFO's probe descriptor to hold."""
    flag, path = output.flag, output.path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        _check_directory(output, os.path.dirname(os.path.realpath(path)))
        return None
    except (OSError, ValueError) as err:
        raise OutputRefused(f"{flag} {path}: {reason(err)}") from None
    if stat.S_ISFIFO(st.st_mode):
        return _wait_for_reader(output)
    if not stat.S_ISREG(st.st_mode):
        raise OutputRefused(f"{flag} {path}: is {_kind(st.st_mode)}, not a regular file "
                            f"(give a file's path, or a FIFO)")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as err:
        raise OutputRefused(f"{flag} {path}: cannot write it ({reason(err)})") from None
    # A growing trace is rewritten in place; a whole file is made beside it and renamed.
    _check_directory(output, os.path.dirname(os.path.realpath(path)), new_file=not output.grows)
    return None


def _check_directory(output: Output, directory: str, new_file: bool = True) -> None:
    """The directory has room and (`new_file`) takes a new file, made and
    removed again."""
    import tempfile

    try:
        if new_file:
            fd, probe = tempfile.mkstemp(prefix=".flightcheck-probe-", dir=directory)
            os.close(fd)
            os.unlink(probe)
        space = os.statvfs(directory)
    except OSError as err:
        raise OutputRefused(f"{output.flag} {output.path}: cannot write it ({reason(err)})") from None
    if space.f_blocks > 0 and space.f_bavail == 0:
        raise OutputRefused(f"{output.flag} {output.path}: cannot write it ({os.strerror(errno.ENOSPC)})")


def _wait_for_reader(output: Output) -> int:
    """Open a FIFO for writing without blocking: at once, or for a growing
    trace within FIFO_WAIT_S; OutputRefused if no reader comes."""
    deadline = time.monotonic() + (FIFO_WAIT_S if output.grows else 0.0)
    said = False
    while True:
        try:
            return os.open(output.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise OutputRefused(f"{output.flag} {output.path}: cannot write it ({reason(err)})") from None
        if time.monotonic() >= deadline:
            waited = f" within {FIFO_WAIT_S:g} s" if output.grows else ""
            raise OutputRefused(f"{output.flag} {output.path}: a FIFO with no reader{waited}; start its "
                                f"reader first")
        if not said:
            print(f"flightcheck: {output.flag} {output.path} is a FIFO with no reader yet; waiting up to "
                  f"{FIFO_WAIT_S:g} s for one", file=sys.stderr, flush=True)
            said = True
        time.sleep(_POLL_S)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def reason(err: BaseException) -> str:
    """The cause of an OSError as the system says it (strerror)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


def write_failed(flag: str, path: str, err: BaseException, consequence: str) -> int:
    """A write that failed after the work was done: one line, exit code 1."""
    sys.stderr.write(f"flightcheck: error: {flag} {path}: {reason(err)}; {consequence}\n")
    return 1

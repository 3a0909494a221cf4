"""How flightcheck writes the files it is asked for, so that no failure leaves a
half file that looks whole (docs/outputs.md).

* A whole file (a result JSON, a PNG, a Perfetto or Chrome trace) is written to
  a temporary file beside its target, synced to disk and renamed over the
  target only once complete: a failed or interrupted write leaves the old file
  (or none) and removes the temporary file. A FIFO (or a pipe, as a shell's
  `>(...)` gives) has no old contents to keep; it is written straight through,
  and only while a reader holds it open.
* A growing file (a trace, which a live checker may read as it grows) is
  written a whole line at a time, each line handed to the kernel as soon as it
  ends: a run that dies leaves every line before it complete. On a write error
  the file is cut back to its last whole line, later lines are dropped, and
  `close()` raises `OutputLost` naming the path, the cause and what was kept.

Standard library only: the runtime, the simulator and the commands all use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable
from typing import BinaryIO


class OutputLost(OSError):
    """A write error after part of a growing file was written: `kept` lines
    (each complete) are in the file, the rest is lost."""

    def __init__(self, cause: OSError, path: str, kept: int) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), path)
        self.kept = kept


def open_for_writing(path: str, *, truncate: bool = True) -> int:
    """A file descriptor for writing `path`, never blocking in open(): a FIFO
    with no reader is ENXIO at once instead of a wait for one."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o666)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a short write is retried; the
    error of a write that cannot go on is raised)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:                       # not expected of a regular file or a pipe
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        view = view[written:]


def is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


class LineFile:
    """A text sink (what `TraceWriter` writes to) that hands the kernel whole
    lines only, each as soon as it ends."""

    def __init__(self, fd: int, path: str) -> None:
        self.path = path
        self.lines = 0                          # complete lines written
        self.failure: OSError | None = None
        self._fd = fd
        self._regular = stat.S_ISREG(os.fstat(fd).st_mode)
        self._size = 0                          # bytes of those lines
        self._pending: list[str] = []
        self.closed = False

    @classmethod
    def open(cls, path: str) -> "LineFile":
        return cls(open_for_writing(path), path)

    def write(self, text: str) -> int:
        if self.failure is None:
            self._pending.append(text)
            if "\n" in text:
                self._write_lines()
        return len(text)

    def _write_lines(self) -> None:
        data = "".join(self._pending)
        cut = data.rfind("\n") + 1
        self._pending = [data[cut:]] if cut < len(data) else []
        payload = data[:cut].encode("utf-8", "surrogateescape")
        try:
            write_all(self._fd, payload)
        except OSError as err:
            self._fail(err)
            return
        self._size += len(payload)
        self.lines += data.count("\n", 0, cut)

    def _fail(self, err: OSError) -> None:
        """Keep the first error, and cut the file back to its last whole line."""
        self.failure = err
        self._pending = []
        if self._regular:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass

    def flush(self) -> None:
        """Every whole line is already written; a partial one waits for its end."""

    def close(self) -> None:
        """Close the file; raise OutputLost if a write failed."""
        if self.closed:
            return
        if self._pending and self.failure is None:      # a last line without its newline
            self.write("\n")
        self.closed = True
        os.close(self._fd)
        if self.failure is not None:
            raise OutputLost(self.failure, self.path, self.lines)


def write_whole(path: str, fill: Callable[[BinaryIO], None]) -> None:
    """Write the file `fill(f)` writes to `path`, atomically (module doc).
    A symbolic link is followed: the file it points to is replaced."""
    if is_fifo(path):
        with os.fdopen(open_for_writing(path, truncate=False), "wb") as f:
            fill(f)
        return
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, _mode_for(target))
        os.replace(temporary, target)
    except BaseException:                       # KeyboardInterrupt too: no temporary file left
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_text(path: str, text: str) -> None:
    write_whole(path, lambda f: f.write(text.encode("utf-8", "surrogateescape")))


def _mode_for(target: str) -> int:
    """The old file's permissions, or a new file's (0o666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask

"""Reading a trace line by line, in bounded memory, from a file, standard
input, a FIFO or a file another process is still writing (`follow`).

A line is read only up to MAX_LINE_BYTES (newline included): a longer line,
or an input with no newline at all (`/dev/zero`), is MalformedTrace at once,
having read at most that much of it. Each line is decoded as UTF-8 with its
newline, so a bad byte is named by its offset in the input as a decoder of
the whole file would name it. (A run of more than MAX_BLANK_RUN blank lines
is refused by the checker, stream.py: a trace has one event per line, and
256 MB of newlines is refused after 64 Ki of them, not read to its end.)

Following (`follow=True`, as `tail -f`): at the end of the input the reader
waits for more instead of stopping, and stops when `stop()` says so (the
checker saw the `end` event, or a signal came), or after `idle` seconds
without a new byte. A regular file is polled; a pipe or FIFO is waited on
with `select`, so that a stop request is seen within POLL_SECONDS even when
no writer writes.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .reading import MalformedTrace, refuse_compressed

MAX_LINE_BYTES = 1 << 24        # 16 MiB: a prompt of 2 Mi token ids (MAX_PROMPT_BLOCKS of 16 tokens) fits
MAX_BLANK_RUN = 1 << 16         # blank lines in a row
POLL_SECONDS = 0.05             # how often a follower looks for more input
CHUNK = 1 << 16


@dataclass
class Follow:
    """How a follower stops: `stop()` true (polled between reads), or
    `idle` seconds (None: never) without a new byte."""

    stop: Callable[[], bool] = lambda: False
    idle: float | None = None


class LineReader:
    """The lines of the input behind file descriptor `fd` (without their
    newline), one at a time; `number` is the last line's 1-based number."""

    def __init__(self, fd: int, follow: Follow | None = None, max_line: int = MAX_LINE_BYTES,
                 owns_fd: bool = False) -> None:
        self.fd = fd
        self.owns_fd = owns_fd               # close() closes it
        self.follow = follow
        self.max_line = max_line
        self.number = 0
        self.offset = 0                      # input bytes before `self.buffer`
        self.buffer = bytearray()
        self.scanned = 0                     # bytes of the buffer known to hold no newline
        self.waited_out: float | None = None  # following: the idle seconds that ended it, if they did
        self.cut_short: int | None = None    # the last line's number, if no newline ended it (a write cut short)
        self.waits = not stat.S_ISREG(os.fstat(fd).st_mode)   # a pipe, FIFO or terminal: select on it

    def __iter__(self) -> Iterator[str]:
        while True:
            end = self.buffer.find(b"\n", self.scanned, self.max_line)
            if end < 0:
                self.scanned = min(len(self.buffer), self.max_line)
                if len(self.buffer) >= self.max_line:
                    if self.number == 0:
                        refuse_compressed(bytes(self.buffer[:8]))
                    raise MalformedTrace(f"line {self.number + 1}: longer than {self.max_line} bytes "
                                         "(the checker reads lines of at most that many)")
                if self._read_more():
                    continue
                if self.buffer:                  # the last line, with no newline after it
                    self.cut_short = self.number + 1
                    yield self._line(len(self.buffer))
                return
            yield self._line(end + 1)

    def _line(self, size: int) -> str:
        raw = bytes(self.buffer[:size])
        del self.buffer[:size]
        self.scanned = 0
        self.number += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if self.number == 1:
                refuse_compressed(raw)
            raise MalformedTrace(f"line {self.number}: not UTF-8 text (byte {self.offset + err.start}: "
                                 f"{err.reason})") from None
        self.offset += size
        return text[:-1] if text.endswith("\n") else text

    def _read_more(self) -> bool:
        """Append input to the buffer; False at the end (of the input, or of
        following it)."""
        try:
            return self._wait_and_read()
        except OSError as err:
            raise MalformedTrace(f"cannot read it: {err.strerror or err}") from None

    def _wait_and_read(self) -> bool:
        if self.follow is None:
            data = os.read(self.fd, CHUNK)
            self.buffer += data
            return bool(data)
        last_byte = time.monotonic()
        while not self.follow.stop():
            if self.waits:
                ready, _, _ = select.select([self.fd], [], [], POLL_SECONDS)
                if ready:
                    data = os.read(self.fd, CHUNK)
                    if not data:
                        return False            # the writer closed the pipe: nothing more can come
                    self.buffer += data
                    return True
            else:
                data = os.read(self.fd, CHUNK)
                if data:
                    self.buffer += data
                    return True
                time.sleep(POLL_SECONDS)
            if self.follow.idle is not None and time.monotonic() - last_byte >= self.follow.idle:
                self.waited_out = self.follow.idle
                return False
        return False

    def close(self) -> None:
        """Close the file it opened (standard input stays open)."""
        if self.owns_fd:
            self.owns_fd = False
            os.close(self.fd)

    def __enter__(self) -> "LineReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drain(self) -> Iterator[str]:
        """The lines already written (a regular file's rest), without waiting:
        after the `end` event a follower still reads what follows it."""
        self.follow = None
        if self.waits:
            return iter(())
        return iter(self)


def open_lines(path: str, follow: Follow | None = None) -> LineReader:
    """The lines of the trace at `path` (`-`: standard input); a FIFO is
    opened as a reader, which waits for a writer. MalformedTrace if it cannot
    be opened."""
    if path == "-":
        return LineReader(sys.stdin.fileno(), follow)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        raise MalformedTrace(f"cannot read it: {err.strerror or err}") from None
    return LineReader(fd, follow, owns_fd=True)

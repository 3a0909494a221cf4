"""The reading end of a recorder's sink (flightcheck/vllm/sinks.py), for
`flightcheck monitor`: the lines of one stream, as they are written.

* `file:PATH`: the file, followed as `tail -f` does (waited for until the
  writer creates it);
* `fifo:PATH`: the named pipe, created here if it does not exist (and then
  removed at the end); the stream ends when the writer closes it;
* `unix:PATH`: a unix-domain socket listened on here (the path must be
  free, and is removed at the end); the first
  writer to connect is the stream, which ends when it closes the connection.

Every source stops when `Follow.stop()` says so (a signal) or after
`Follow.idle` seconds without a byte, a writer that never came included.
Lines are read by the streaming checker's reader (line_reader.py), with its
bound on a line's length.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Iterator

from flightcheck.verification.traces.line_reader import POLL_SECONDS, Follow, LineReader
from flightcheck.verification.traces.reading import MalformedTrace
from flightcheck.vllm.sinks import SinkAddress


class SourceError(MalformedTrace):
    """The sink cannot be read (exit 2 for that stream)."""


@contextmanager
def open_source(address: SinkAddress, follow: Follow,
                ready: Callable[[str], None] = lambda _: None) -> Iterator[LineReader | None]:
    """The stream's lines (a LineReader that follows), or None when it
    stopped or went idle before a writer came. `ready(what)` is called once
    the source waits for its writer (a listener is listening)."""
    opener = {"file": _follow_file, "fifo": _read_fifo, "unix": _listen}[address.kind]
    with opener(address.path, follow, ready) as reader:
        yield reader


def _waited(follow: Follow, since: float) -> bool:
    """Whether to stop waiting: a stop request, or `idle` seconds gone."""
    return follow.stop() or (follow.idle is not None and time.monotonic() - since >= follow.idle)


@contextmanager
def _follow_file(path: str, follow: Follow, ready: Callable[[str], None]) -> Iterator[LineReader | None]:
    ready(f"following {path}")
    since = time.monotonic()
    while not os.path.exists(path):
        if _waited(follow, since):
            yield None
            return
        time.sleep(POLL_SECONDS)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        raise SourceError(f"cannot read it: {err.strerror or err}") from None
    with _reading(fd, follow) as reader:
        yield reader


@contextmanager
def _reading(fd: int, follow: Follow) -> Iterator[LineReader]:
    """A LineReader over `fd`, which is closed at the end (here: LineReader's
    own close asks for standard input's descriptor, which a test run may not have)."""
    try:
        yield LineReader(fd, follow)
    finally:
        os.close(fd)


@contextmanager
def _read_fifo(path: str, follow: Follow, ready: Callable[[str], None]) -> Iterator[LineReader | None]:
    created = not os.path.exists(path)
    if created:
        os.mkfifo(path)
    elif not stat.S_ISFIFO(os.stat(path).st_mode):
        raise SourceError(f"{path} exists and is not a FIFO")
    try:
        # non-blocking: opening waits for no writer, and select sees none until
        # one has opened it (then the end of its writes reads as the end)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        ready(f"reading the FIFO {path}")
        with _reading(fd, follow) as reader:
            yield reader
    finally:
        if created:
            _remove(path)


@contextmanager
def _listen(path: str, follow: Follow, ready: Callable[[str], None]) -> Iterator[LineReader | None]:
    _clear_stale_socket(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(POLL_SECONDS)
        ready(f"listening on {path}")
        since, connection = time.monotonic(), None
        while connection is None and not _waited(follow, since):
            try:
                connection, _ = listener.accept()
            except socket.timeout:
                continue
        listener.close()               # one writer per stream: a second one finds no listener
        _remove(path)
        if connection is None:
            yield None
            return
        connection.setblocking(True)
        with _reading(connection.detach(), follow) as reader:
            yield reader
    finally:
        listener.close()
        _remove(path)


def _clear_stale_socket(path: str) -> None:
    """Refuse a path that is taken: a listener's socket left behind by a
    monitor that was killed is removed by hand (probing it would hand a live
    monitor an empty stream)."""
    if os.path.lexists(path):
        what = "a socket (another monitor's, or a stale one: remove it)" if stat.S_ISSOCK(
            os.lstat(path).st_mode) else "not a socket"
        raise SourceError(f"{path} exists and is {what}")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

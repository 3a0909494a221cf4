"""Where a recorder streams its trace, and how it never holds the engine up.

A deployment names a sink in FLIGHTCHECK_TRACE_SINK:

    file:PATH     a file, written and flushed event by event (`tail -f` it,
                  or `flightcheck monitor file:PATH`)
    fifo:PATH     a named pipe; the reader (`flightcheck monitor fifo:PATH`)
                  creates it, the recorder opens it once a reader is there
    unix:PATH     a local (unix-domain) stream socket the reader listens on
                  (`flightcheck monitor unix:PATH`); the recorder connects

`{pid}` in PATH becomes the engine process's id (as in FLIGHTCHECK_TRACE), so
data-parallel engines each get their own sink.

The engine's thread only encodes an event and appends the line to a bounded
buffer (FLIGHTCHECK_TRACE_BUFFER lines, 65,536 by default); a background
thread drains the buffer into the sink. When the buffer is full (the sink
blocks, is slow, or no reader is there yet) the event is dropped and counted,
never waited for; once there is room again, a `dropped` event carrying the
count is written before the next event (docs/trace-format.md, "`dropped`"),
so a checker knows from which line its verdict no longer holds. A line the
sink refused (a reader that went away) counts as dropped the same way; the
recorder reconnects in the background, and a new connection starts with the
trace's `config` event, then the marker.

FLIGHTCHECK_TRACE_PACE (seconds, test-only) makes the engine's thread sleep
after every event, so a test can watch a short run while it is still going.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from .trace import TraceFile, trace_path_from_env

SINK_ENV = "FLIGHTCHECK_TRACE_SINK"
BUFFER_ENV = "FLIGHTCHECK_TRACE_BUFFER"
PACE_ENV = "FLIGHTCHECK_TRACE_PACE"
DEFAULT_BUFFER = 65536
KINDS = ("file", "fifo", "unix")
RETRY_SECONDS = 0.2          # between attempts to reach a sink that is not there (yet)
CLOSE_SECONDS = 5.0          # how long close() waits for the buffer to drain
DRAIN_SECONDS = 0.005        # how often the drain thread looks at an empty buffer
BATCH_LINES = 4096           # lines written at once, at most


@dataclass(frozen=True)
class SinkAddress:
    """A sink: its kind (file, fifo, unix) and path."""

    kind: str
    path: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}"


def parse_sink(text: str) -> SinkAddress:
    """`kind:PATH`; a bare path (no known kind before a colon) is a file.
    ValueError for an empty path."""
    kind, colon, path = text.partition(":")
    if not colon or kind not in KINDS:
        kind, path = "file", text
    if not path:
        raise ValueError(f"sink {text!r}: no path (expected {' | '.join(k + ':PATH' for k in KINDS)})")
    return SinkAddress(kind, path)


def sink_from_env() -> SinkAddress | None:
    """The sink a deployment set, with `{pid}` replaced; None when unset."""
    text = os.environ.get(SINK_ENV)
    if not text:
        return None
    return parse_sink(text.replace("{pid}", str(os.getpid())))


class TraceWriter(Protocol):
    """What a recorder writes events to: a TraceFile, a StreamedTrace, or both."""

    record_time: bool

    def write(self, event: dict[str, Any], step: int | None = None) -> None: ...

    def close(self) -> None: ...


def open_trace_from_env() -> TraceWriter | None:
    """What a recorder writes to: the FLIGHTCHECK_TRACE file (written in the
    engine's thread, as always), the FLIGHTCHECK_TRACE_SINK stream, both, or
    nothing."""
    path, address = trace_path_from_env(), sink_from_env()
    file = TraceFile.open(path) if path is not None else None
    if address is None:
        return file
    streamed = StreamedTrace(connector(address), capacity=int(os.environ.get(BUFFER_ENV) or DEFAULT_BUFFER),
                             pace=float(os.environ.get(PACE_ENV) or 0.0))
    return streamed if file is None else TeeTrace(file, streamed)


# -- the connections ------------------------------------------------------------------


class Connection(Protocol):
    """One open sink: `write` a line (bytes ending in a newline), `close`."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class Connector(Protocol):
    """Opens the sink; OSError while it cannot be reached (no reader yet)."""

    def __call__(self) -> Connection: ...


class _FileConnection:
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()

    def close(self) -> None:
        self._stream.close()


class _SocketConnection:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def write(self, data: bytes) -> None:
        self._sock.sendall(data, socket.MSG_NOSIGNAL)     # a reader gone: EPIPE, never SIGPIPE

    def close(self) -> None:
        self._sock.close()


def connector(address: SinkAddress) -> Connector:
    """How to open `address`: a file is created (truncated the first time,
    appended to after a failure); a FIFO is opened only once a reader has it
    open (ENXIO until then), then written blocking, in the drain thread; a
    socket is connected to."""
    opened = []

    def open_file() -> Connection:
        directory = os.path.dirname(address.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        stream = open(address.path, "ab" if opened else "wb")
        opened.append(True)
        return _FileConnection(stream)

    def open_fifo() -> Connection:
        if not stat.S_ISFIFO(os.stat(address.path).st_mode):
            raise OSError(f"{address.path} is not a FIFO")
        fd = os.open(address.path, os.O_WRONLY | os.O_NONBLOCK)   # ENXIO: no reader yet
        os.set_blocking(fd, True)
        return _FileConnection(os.fdopen(fd, "wb"))

    def open_socket() -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address.path)
        except OSError:
            sock.close()
            raise
        return _SocketConnection(sock)

    return {"file": open_file, "fifo": open_fifo, "unix": open_socket}[address.kind]


# -- the bounded buffer and its drain thread -------------------------------------------


class StreamedTrace(TraceFile):
    """TraceFile's interface (`write`, `close`, `record_time`) over a bounded
    buffer drained into a sink by a background thread. `write` never blocks:
    a line that does not fit is counted, and the count written as a `dropped`
    event before the next line that fits."""

    def __init__(self, connect: Connector, *, capacity: int = DEFAULT_BUFFER, pace: float = 0.0,
                 record_time: bool = True) -> None:
        super().__init__(None, record_time=record_time)  # type: ignore[arg-type]
        if capacity < 2:
            raise ValueError(f"{BUFFER_ENV}: a buffer of at least 2 lines (an event and a marker), got {capacity}")
        self.capacity, self._pace, self._connect = capacity, pace, connect
        self._lines: deque[bytes] = deque()
        self._lock = threading.Lock()     # no wake-up per event: the drain thread polls
        self._dropped = 0                  # events not buffered since the buffer's last line
        self._lost_at_head = 0             # lines a sink refused, just before the buffer's first line
        self._closing = False
        self._config: bytes | None = None  # the first line: a new connection starts with it
        self.dropped_in_all = 0
        self._thread = threading.Thread(target=self._drain, name="flightcheck-trace-sink", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, event: dict[str, Any], step: int | None = None) -> None:
        line = self._line(event, step).encode("utf-8")
        with self._lock:
            if self._config is None:
                self._config = line
            # the marker and the event, or neither: the marker always precedes what follows the gap
            room = self.capacity - len(self._lines) - (1 if self._dropped else 0)
            if room >= 1 and not self._closing:
                if self._dropped:
                    self._lines.append(self._marker())
                self._lines.append(line)
            else:
                self._dropped += 1
                self.dropped_in_all += 1
        if self._pace:
            time.sleep(self._pace)

    def _marker(self) -> bytes:
        """The `dropped` event for the count so far (the lock is held)."""
        event: dict[str, Any] = {"ev": "dropped", "count": self._dropped}
        self._dropped = 0
        return self._line(event, None).encode("utf-8")

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Drain what is buffered (a last marker if events were dropped) and
        close the sink; gives up after `timeout` seconds on a sink that blocks."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._dropped:
                self._lines.append(self._marker())
        self._thread.join(timeout)
        atexit.unregister(self.close)

    # -- the drain thread ---------------------------------------------------------

    def _drain(self) -> None:
        """Write what is buffered, a batch (up to BATCH_LINES lines) per
        write, looking again every DRAIN_SECONDS when there is nothing: the
        writer never pays for waking this thread."""
        connection: Connection | None = None
        connections = 0
        while True:
            with self._lock:
                batch = list(itertools.islice(self._lines, BATCH_LINES))
                lost, closing = self._lost_at_head, self._closing
            if not batch:
                if closing:
                    break
                time.sleep(DRAIN_SECONDS)
                continue
            if connection is None:
                connection = self._reach(again=connections > 0)
                if connection is None:                    # closing, and the sink never came
                    break
                connections += 1
                continue
            marker = self._line({"ev": "dropped", "count": lost}, None).encode("utf-8") if lost else b""
            try:
                connection.write(marker + b"".join(batch))
            except OSError:                                # the reader went away: the batch is lost
                _quietly_close(connection)
                connection = None
                self._written(batch, lost, failed=True)
            else:
                self._written(batch, lost, failed=False)
        if connection is not None:
            _quietly_close(connection)

    def _written(self, batch: list[bytes], lost: int, failed: bool) -> None:
        """Take the batch off the buffer; if the sink refused it, count its
        lines (the config but the first time: it is resent on the next
        connection) as lost before the buffer's new first line."""
        with self._lock:
            for _ in batch:
                self._lines.popleft()
            if not failed:
                self._lost_at_head -= lost
                return
            refused = sum(1 for line in batch if line is not self._config)
            self._lost_at_head += refused
            self.dropped_in_all += refused

    def _reach(self, again: bool) -> Connection | None:
        """Open the sink, retrying while it is not there (the buffer fills
        meanwhile, and overflows into the count); a connection after the
        first (its reader went away) starts with the config line."""
        while True:
            connection = None
            try:
                connection = self._connect()
                if again and self._config is not None:
                    connection.write(self._config)
                return connection
            except OSError:
                if connection is not None:
                    _quietly_close(connection)
                with self._lock:
                    if self._closing:
                        return None
                time.sleep(RETRY_SECONDS)


def _quietly_close(connection: Connection) -> None:
    try:
        connection.close()
    except OSError:
        pass


class TeeTrace:
    """Both FLIGHTCHECK_TRACE's file and the streamed sink."""

    def __init__(self, *traces: TraceFile) -> None:
        self._traces = traces

    @property
    def record_time(self) -> bool:
        return self._traces[0].record_time

    @record_time.setter
    def record_time(self, value: bool) -> None:
        for trace in self._traces:
            trace.record_time = value

    def write(self, event: dict[str, Any], step: int | None = None) -> None:
        for trace in self._traces:
            trace.write(dict(event), step)

    def close(self) -> None:
        for trace in self._traces:
            trace.close()

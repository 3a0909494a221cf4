"""The recorder's sinks (flightcheck/vllm/sinks.py), without vLLM: the
bounded buffer and its `dropped` marker, and each kind of sink (file, FIFO,
unix socket) written by `StreamedTrace` and read back by the monitor's
reading end (flightcheck/commands/monitor_watch.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flightcheck.commands.monitor_watch import watch
from flightcheck.verification.traces.line_reader import Follow
from flightcheck.vllm import sinks
from flightcheck.vllm.sinks import SinkAddress, StreamedTrace, TeeTrace, connector, parse_sink

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

TRACES = Path(__file__).resolve().parent / "data" / "vllm" / "traces-0.33"
LEGAL = TRACES / "id-reuse-wrong-binding-fresh-id.jsonl"
REUSED = TRACES / "id-reuse-wrong-binding.jsonl"          # S7_output_binding at line 8


def events_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class GatedConnection:
    """A sink whose writes block until `gate` is set: a reader that stalls."""

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.lines: list[dict[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.entered.set()
        self.gate.wait(10)
        self.lines.extend(json.loads(line) for line in data.splitlines())

    def close(self) -> None:
        pass


def test_a_full_buffer_drops_events_counts_them_and_writes_the_count_before_the_next():
    sink = GatedConnection()
    trace = StreamedTrace(lambda: sink, capacity=4, record_time=False)
    trace.write({"ev": "config", "n": 0})
    assert sink.entered.wait(5)                 # the drain thread is stuck writing line 1, still buffered
    for n in range(1, 10):                      # 3 fit beside it, 6 do not
        trace.write({"ev": "arrive", "n": n})
    assert trace.dropped_in_all == 6
    sink.gate.set()
    deadline = time.monotonic() + 5
    while len(sink.lines) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    trace.write({"ev": "arrive", "n": 10})
    trace.close()
    assert sink.lines == [{"ev": "config", "n": 0}, {"ev": "arrive", "n": 1}, {"ev": "arrive", "n": 2},
                          {"ev": "arrive", "n": 3}, {"ev": "dropped", "count": 6}, {"ev": "arrive", "n": 10}]


def test_events_dropped_at_the_end_are_counted_in_a_last_marker():
    sink = GatedConnection()
    trace = StreamedTrace(lambda: sink, capacity=2, record_time=False)
    trace.write({"ev": "config"})
    assert sink.entered.wait(5)
    for n in range(5):
        trace.write({"ev": "arrive", "n": n})
    sink.gate.set()
    trace.close()
    assert sink.lines[-1] == {"ev": "dropped", "count": 4}
    assert [line["ev"] for line in sink.lines] == ["config", "arrive", "dropped"]


def test_writing_never_waits_for_a_sink_that_blocks():
    sink = GatedConnection()
    trace = StreamedTrace(lambda: sink, capacity=8, record_time=False)
    start = time.perf_counter()
    for n in range(2000):
        trace.write({"ev": "arrive", "n": n})
    assert time.perf_counter() - start < 2.0
    assert trace.dropped_in_all >= 2000 - 8
    sink.gate.set()
    trace.close()


def test_sink_addresses_parse_with_a_bare_path_as_a_file(monkeypatch: pytest.MonkeyPatch):
    assert parse_sink("unix:/run/fc.sock") == SinkAddress("unix", "/run/fc.sock")
    assert parse_sink("fifo:t.fifo") == SinkAddress("fifo", "t.fifo")
    assert parse_sink("/tmp/a:b.jsonl") == SinkAddress("file", "/tmp/a:b.jsonl")
    with pytest.raises(ValueError):
        parse_sink("unix:")
    monkeypatch.setenv(sinks.SINK_ENV, "file:/tmp/t-{pid}.jsonl")
    assert sinks.sink_from_env() == SinkAddress("file", f"/tmp/t-{os.getpid()}.jsonl")


def test_both_variables_write_the_file_and_the_stream(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("FLIGHTCHECK_TRACE", str(tmp_path / "plain.jsonl"))
    monkeypatch.setenv(sinks.SINK_ENV, f"file:{tmp_path / 'streamed.jsonl'}")
    trace = sinks.open_trace_from_env()
    assert isinstance(trace, TeeTrace)
    trace.record_time = False
    for event in events_of(LEGAL):
        trace.write(event)
    trace.close()
    assert (tmp_path / "plain.jsonl").read_text() == (tmp_path / "streamed.jsonl").read_text()
    assert [json.loads(x) for x in (tmp_path / "plain.jsonl").read_text().splitlines()] == events_of(LEGAL)


def stream_into(address: SinkAddress, path: Path, delay: float = 0.0) -> threading.Thread:
    """Write the trace at `path` into the sink, as a recorder would, from a thread."""
    def write() -> None:
        trace = StreamedTrace(connector(address), record_time=False)
        for event in events_of(path):
            trace.write(event)
            time.sleep(delay)
        trace.close()
    thread = threading.Thread(target=write)
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["file", "fifo", "unix"])
@pytest.mark.parametrize("trace, status", [(LEGAL, "legal"), (REUSED, "violation")])
def test_each_sink_carries_the_trace_to_the_monitor_which_judges_it_as_check_trace(
        kind: str, trace: Path, status: str, tmp_path: Path):
    address = SinkAddress(kind, str(tmp_path / f"sink.{kind}"))
    lines: list[str] = []
    writer: list[threading.Thread] = []

    def ready(text: str) -> None:
        lines.append(text)
        if not writer:                           # the reading end is there: start writing
            writer.append(stream_into(address, trace))

    outcome = watch(address, Follow(idle=5), ready)
    writer[0].join(5)
    assert outcome.status == status, (outcome, lines)
    if status == "legal":
        assert outcome.events == len(events_of(trace)) and outcome.ended_by == "end event"
    else:
        assert outcome.line == 8 and outcome.property == "S7_output_binding"
        assert any(x.startswith("line 8 (complete event) violates S7_output_binding") for x in lines)


def test_a_socket_reader_that_goes_away_costs_events_and_a_new_one_starts_at_the_config(tmp_path: Path):
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    trace = StreamedTrace(connector(SinkAddress("unix", path)), record_time=False)
    trace.write({"ev": "config"})
    first, _ = listener.accept()
    first.recv(100)
    first.close()
    deadline = time.monotonic() + 10
    n = 0
    while trace.dropped_in_all == 0 and time.monotonic() < deadline:
        trace.write({"ev": "arrive", "n": n})        # the writes fail once the peer is gone
        n += 1
        time.sleep(0.01)
    lost = trace.dropped_in_all
    assert lost > 0
    trace.write({"ev": "end"})                      # the next line reconnects
    second, _ = listener.accept()
    trace.close()
    received = b""
    while chunk := second.recv(1 << 16):
        received += chunk
    events = [json.loads(line) for line in received.decode().splitlines()]
    assert events[0] == {"ev": "config"}
    assert events[1]["ev"] == "dropped" and events[1]["count"] >= 1
    assert events[-1] == {"ev": "end"}
    listener.close()


def test_an_overflow_reaches_the_monitor_as_a_marker_and_cuts_its_verdict(tmp_path: Path):
    """A 4-line buffer and a FIFO no one reads yet: the config and 3 events
    wait, 6 are dropped; once the monitor opens the FIFO the rest flows, the
    marker first, and the verdict holds up to line 4."""
    address = SinkAddress("fifo", str(tmp_path / "engine.fifo"))
    events = events_of(LEGAL)
    trace = StreamedTrace(connector(address), capacity=4, record_time=False)
    for event in events[:10]:
        trace.write(event)
    assert trace.dropped_in_all == 6

    def drained() -> None:
        deadline = time.monotonic() + 10
        while trace._lines and time.monotonic() < deadline:
            time.sleep(0.001)

    def the_rest() -> None:                      # slowly enough that nothing more is dropped
        for event in events[10:]:
            drained()
            trace.write(event)
        trace.close()
    writer = threading.Thread(target=the_rest)
    lines: list[str] = []

    def ready(text: str) -> None:             # the FIFO is open for reading: the rest may come
        lines.append(text)
        if len(lines) == 1:
            writer.start()

    outcome = watch(address, Follow(idle=10), ready)
    writer.join(10)
    assert (outcome.status, outcome.line, outcome.dropped) == ("partial", 5, 6), (outcome, lines)
    assert lines[-1].startswith("verdict holds up to line 4; 6 events dropped after it")


def test_keep_going_reports_the_violation_and_reads_on_to_the_end(tmp_path: Path):
    lines: list[str] = []
    outcome = watch(SinkAddress("file", str(REUSED)), Follow(idle=1), lines.append, keep_going=True)
    assert outcome.status == "violation" and outcome.ended_by == "end event" and outcome.violations >= 1
    assert sum("violates" in line for line in lines) == outcome.violations

"""`flightcheck monitor` (flightcheck/commands/monitor.py) without vLLM: a
`dropped` marker cuts the verdict at the line before it (and check-trace
stops there too), several sinks are checked in parallel with one summary, a
signal (SIGINT: a Ctrl-C) ends it with the verdicts so far, `--idle` ends a stream no one writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flightcheck.commands.monitor_watch import watch
from flightcheck.verification.traces.line_reader import Follow
from flightcheck.vllm.sinks import SinkAddress, StreamedTrace, connector

from .test_trace_sinks import LEGAL, REUSED, events_of

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

ROOT = Path(__file__).resolve().parent.parent


def flightcheck(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flightcheck.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def with_marker(source: Path, target: Path, after: int, lost: int) -> Path:
    """`source` with `lost` lines after line `after` replaced by a marker."""
    lines = source.read_text().splitlines()
    marker = json.dumps({"ev": "dropped", "count": lost})
    target.write_text("\n".join(lines[:after] + [marker] + lines[after + lost:]) + "\n")
    return target


def test_a_dropped_marker_cuts_the_verdict_at_the_line_before_it(tmp_path: Path):
    trace = with_marker(LEGAL, tmp_path / "cut.jsonl", after=10, lost=3)
    monitor = flightcheck("monitor", str(trace), "--idle", "1")
    out, err = monitor.communicate(timeout=60)
    assert monitor.returncode == 4, (out, err)
    assert f"file:{trace}: verdict holds up to line 10; 3 events dropped after it" in out
    # the whole-trace checker stops at the marker too, and says so
    check = flightcheck("check-trace", str(trace))
    out, err = check.communicate(timeout=60)
    assert check.returncode == 2 and "a dropped marker: 3 events lost here" in err, (out, err)


def test_a_violation_before_the_marker_stays_a_violation(tmp_path: Path):
    trace = with_marker(REUSED, tmp_path / "cut.jsonl", after=20, lost=2)
    outcome = watch(SinkAddress("file", str(trace)), Follow(idle=1), lambda _: None)
    assert (outcome.status, outcome.line, outcome.property) == ("violation", 8, "S7_output_binding")


def test_later_markers_add_to_the_count(tmp_path: Path):
    trace = with_marker(LEGAL, tmp_path / "once.jsonl", after=10, lost=3)
    trace = with_marker(trace, tmp_path / "twice.jsonl", after=20, lost=4)
    lines: list[str] = []
    outcome = watch(SinkAddress("file", str(trace)), Follow(idle=1), lines.append)
    assert (outcome.status, outcome.line, outcome.dropped) == ("partial", 11, 7)
    assert lines[-1].startswith("verdict holds up to line 10; 7 events dropped after it")


def wait_for(stream, text: str, count: int = 1, timeout: float = 30) -> list[str]:
    """Lines of `stream` up to the `count`-th that contains `text`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(text in line for line in seen) < count:
        assert time.monotonic() < deadline, seen
        line = stream.readline()
        assert line, seen
        seen.append(line)
    return seen


def write(address: SinkAddress, path: Path, upto: int | None = None) -> StreamedTrace:
    trace = StreamedTrace(connector(address), record_time=False)
    for event in events_of(path)[:upto]:
        trace.write(event)
    return trace


def test_several_sinks_are_checked_in_parallel_with_one_summary(tmp_path: Path):
    engines = [SinkAddress("unix", str(tmp_path / "engine0.sock")), SinkAddress("fifo", str(tmp_path / "engine1"))]
    monitor = flightcheck("monitor", *map(str, engines), "--idle", "20")
    assert monitor.stdout is not None
    wait_for(monitor.stdout, "waiting for the writer", count=2)
    writers = [threading.Thread(target=lambda a=a, t=t: write(a, t).close()) for a, t in zip(engines, (LEGAL, REUSED))]
    for writer in writers:
        writer.start()
    out, err = monitor.communicate(timeout=60)
    assert monitor.returncode == 1, (out, err)
    assert f"{engines[1]}: line 8 (complete event) violates S7_output_binding" in out
    summary = out[out.index("summary:"):].splitlines()
    assert summary[0] == "summary: 2 streams: 1 legal, 1 violation"
    assert summary[1].startswith(f"  {engines[0]}: legal (49 events, profile vllm-0.33; ended by end event)")
    assert summary[2] == f"  {engines[1]}: violation: S7_output_binding at line 8"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_monitor_with_the_verdicts_so_far(signum: int, tmp_path: Path):
    address = SinkAddress("unix", str(tmp_path / "engine.sock"))
    monitor = flightcheck("monitor", str(address), "--json")
    assert monitor.stderr is not None
    wait_for(monitor.stderr, "waiting for the writer")
    trace = write(address, LEGAL, upto=11)          # a run still going: the writer stays connected
    wait_for(monitor.stderr, "the first line came")
    time.sleep(0.5)
    monitor.send_signal(signum)
    out, err = monitor.communicate(timeout=30)
    trace.close()
    summary = json.loads(out)                        # stdout: the summary alone
    assert monitor.returncode == 0 and summary["exit"] == 0, (out, err)
    [stream] = summary["streams"]
    assert (stream["status"], stream["ended_by"], stream["events"]) == ("legal", "signal", 11)
    assert not os.path.exists(address.path)          # the listener's socket is removed


def test_idle_ends_a_stream_no_one_writes(tmp_path: Path):
    monitor = flightcheck("monitor", f"fifo:{tmp_path / 'nobody'}", "--idle", "0.3")
    out, err = monitor.communicate(timeout=60)
    assert monitor.returncode == 2, (out, err)
    assert "no writer: nothing was written (ended by idle)" in out
    assert not (tmp_path / "nobody").exists()        # the FIFO it made is removed

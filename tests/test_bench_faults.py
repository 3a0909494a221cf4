"""`flightcheck bench` under the signals that stop a driver: SIGTERM and
SIGHUP stop it as Ctrl-C does (one line, 128 + the signal's number), the
stages are reaped, and the trace keeps every line before it whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_run_faults import LEFT_AFTER_S, STARTUP_HANG_S, _descendants, _left_after, answer_stop_signals


def _lines(path: Path) -> int:
    try:
        return path.read_text().count("\n")
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_ends_bench_with_one_line_a_whole_trace_and_nothing_left(tmp_path, signum):
    trace = tmp_path / "b.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "flightcheck.cli", "bench", "--pp", "2", "--num-prompts",
                             "400", "--trace", str(trace)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=answer_stop_signals)
    try:
        deadline = time.monotonic() + STARTUP_HANG_S
        while _lines(trace) < 50 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        # the signal must find bench running its workload (50 events written), not starting or done
        assert proc.poll() is None and _lines(trace) >= 50, \
            f"bench wrote {_lines(trace)} trace lines, exit code {proc.poll()}, before the signal"
        pids = _descendants(proc.pid)
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=60)
        left = _left_after(pids, LEFT_AFTER_S)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 128 + signum, err
    assert err.strip() == f"flightcheck: run stopped by {signal.Signals(signum).name}", err
    assert not left, left
    lines = trace.read_text().splitlines(keepends=True)
    assert len(lines) >= 50 and all(line.endswith("\n") for line in lines)
    for line in lines:
        json.loads(line)

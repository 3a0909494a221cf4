"""The live monitor on vLLM's real scheduler (issue 38, point 2): vLLM
0.33.0's scheduler, recorded by `RecordingScheduler` through the replay,
streams its trace into a unix socket that `flightcheck monitor` listens on
in another process; the monitor reports the id-reuse bug (the old request's
token applied to the new one under its reused id: S7_output_binding) while
the replay is still running. The recorder paces itself
(FLIGHTCHECK_TRACE_PACE, test-only) so that the short run lasts a few
seconds."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flightcheck.vllm.replay import ReplayWorker
from flightcheck.vllm.sinks import PACE_ENV, SINK_ENV

from .test_monitor import flightcheck, wait_for
from .vllm_support import DATA, require_venv

VERSION = "0.33.0"
PACE_SECONDS = 0.05            # after each of the run's 49 events: about 2.5 s in all


@pytest.mark.vllm
def test_the_monitor_reports_the_id_reuse_bug_while_vllm_is_still_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    require_venv(VERSION)
    [workload] = [w for w in json.loads((DATA / "workloads-0.33.json").read_text())
                  if w["name"] == "id-reuse-wrong-binding"]
    sink = f"unix:{tmp_path / 'engine.sock'}"
    monitor = flightcheck("monitor", sink, "--idle", "120")
    assert monitor.stdout is not None
    try:
        wait_for(monitor.stdout, "waiting for the writer")
        monkeypatch.setenv(SINK_ENV, sink)            # the worker's environment is this one's
        monkeypatch.setenv(PACE_ENV, str(PACE_SECONDS))
        with ReplayWorker(VERSION) as worker:
            done: list[tuple[dict[str, Any], float]] = []
            replay = threading.Thread(target=lambda: done.append((worker.replay(workload), time.monotonic())))
            replay.start()
            seen = wait_for(monitor.stdout, "violates S7_output_binding", timeout=60)
            reported_at = time.monotonic()
            still_running = replay.is_alive()
            replay.join(60)
        out, err = monitor.communicate(timeout=30)
    finally:
        monitor.kill()
    assert still_running, "the replay had finished before the monitor reported"
    (result, finished_at), = done
    assert result["ending"] == "done" and reported_at < finished_at
    assert f"{sink}: line 8 (complete event) violates S7_output_binding" in "".join(seen)
    assert monitor.returncode == 1 and f"  {sink}: violation: S7_output_binding at line 8" in out, (out, err)

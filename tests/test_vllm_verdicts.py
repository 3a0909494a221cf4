"""check-trace's verdicts on vLLM's own traces (0.8.5 and 0.8.4), judged by
vLLM's ground truth, not by the checker: every trace of correct behaviour is
accepted under the profile its `vllm_version` selects, and each real bug is
rejected at its event (verification/traces/ground_truth.py): 0.8.5's stale
token where it is applied, 0.8.4's counter drift at `end`, its stale
completion at the schedule the cleared in-flight set allows, a trace cut by
a crash at or before its last event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightcheck.verification.traces.check import check_trace, read_events
from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.replay import ReplayWorker

from .vllm_support import DATA, Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

WORKLOADS = {w["name"]: w for w in json.loads((DATA / "workloads.json").read_text())}
PROFILE_OF = {"0.8.5": "vllm-0.8.5", "0.8.4": "vllm-0.8.4"}


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.fixture(params=sorted(PROFILE_OF))
def replay(running: Workers, request: pytest.FixtureRequest) -> ReplayWorker:
    return running[request.param]


def test_every_verdict_agrees_with_vllms_ground_truth(replay: ReplayWorker, tmp_path: Path):
    kinds = []
    for name, workload in WORKLOADS.items():
        trace = tmp_path / f"{name}.jsonl"
        result = replay.replay(workload, trace=str(trace))
        verdict = check_trace(trace)
        assert verdict.profile == PROFILE_OF[replay.version]
        expected = expected_verdict(result, read_events(trace.read_text().split("\n")))
        assert expected.agrees(verdict), (name, expected, verdict.to_json())
        kinds.append(expected.kind)
    assert "legal" in kinds and len(set(kinds)) >= 2      # correct runs and real bugs, both judged


def test_the_real_bugs_are_rejected_at_their_event(running: Workers, tmp_path: Path):
    def verdict_of(version: str, name: str):
        trace = tmp_path / f"{version}-{name}.jsonl"
        running[version].replay(WORKLOADS[name], trace=str(trace))
        events = read_events(trace.read_text().split("\n"))
        return check_trace(trace), events

    stale, events = verdict_of("0.8.5", "stale-token-after-resume")
    assert events[stale.event_index]["ev"] == "complete" and events[stale.event_index]["batch"] == 4
    drift, events = verdict_of("0.8.4", "counter-drift-livelock")
    assert events[drift.event_index]["ev"] == "end"
    crash, events = verdict_of("0.8.4", "stale-completion-crash")
    allowed = events[crash.event_index]
    assert allowed["ev"] == "schedule" and any(x["req"] == "r4" for x in allowed["entries"])
    assert crash.property == "illegal_schedule"

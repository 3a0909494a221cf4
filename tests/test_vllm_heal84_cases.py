"""The three "healed" 0.8.4 runs of the hunt over seeds 300-330 (campaigns
`python -m flightcheck.vllm.campaign --versions 0.8.5,0.8.4 --reuse-ids
--no-mutants`, with `--spec-tokens 2` for seed 305 index 96, none for seed
315 index 85, `--spec-tokens 3` for seed 328 index 9; the workload and the
trace of each kept in tests/data/vllm/heal84), where the campaign's ground
truth (replay.py `findings`) reported "scheduled_req_ids disagrees with the
batches in flight: extra [...]" and check-trace accepted: counted as misses.

Each is one drift of vLLM 0.8.4's in-flight set: a running request is
preempted while its batch is in flight (`Scheduler.schedule`'s running loop:
`self.running.pop()`, to `waiting`), the batch completes and
`Scheduler.update_from_output`, which walks `self.running` only, leaves the
id in `scheduled_req_ids`; the request is admitted again a step or a few
later (the waiting loop never reads the set), and that batch's completion
removes the id: healed. In between, the extra id is read by 0.8.4 in two
places only: the running loop's skip, which never meets it (the request is
in `waiting`), and `get_num_unscheduled_requests`, the gate of
`EngineCore.step_with_batch_queue`, which stayed open at every step of the
three drifts (other requests were unscheduled): the engine's own record has
no gated completion, no stall, and the runs end `done`. The id changed
nothing vLLM did, so the runs are correct, as the positional ground truth
(verification/traces/ground_truth.py) and check-trace say; the campaign's
ground truth now names the drift by its effects, not by the id alone
(replay.py `_in_flight_set_findings`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightcheck.verification.traces.ground_truth import expected_verdict
from flightcheck.vllm.campaign import check_verdict, verdict
from flightcheck.vllm.differential import decisions, read_trace
from flightcheck.vllm.replay import ReplayWorker, findings

from .vllm_support import DATA, require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

HEALED = DATA / "heal84"
# stem -> the one in-flight-set mismatch vLLM 0.8.4's replay records (its
# step, the extra id) and the engine step of the schedule that resumes the
# request with the extra id (where the drift heals)
DRIFTS = {
    "084_sync_drift_healed_seed305_96": ({"step": 22, "extra": ["r0"], "missing": []}, 19),
    "084_sync_drift_healed_seed315_85": ({"step": 49, "extra": ["r3"], "missing": []}, 43),
    "084_sync_drift_healed_seed328_9": ({"step": 10, "extra": ["r1"], "missing": []}, 12),
}


def _result(mismatch: dict[str, Any], **engine: Any) -> dict[str, Any]:
    """A 0.8.4 replay's result as both ground truths read it: a run that ended
    `done` with this one in-flight-set mismatch and the engine's record."""
    return {"vllm_version": "0.8.4", "ending": "done", "batches_in_flight": 0, "stalls": [],
            "ground_truth": {"stale_tokens": [], "partial_chunk_tokens": [], "in_flight_set_mismatches": [mismatch]},
            "waits_in_flight": [], "gated_completions": [], **engine}


def _resumed_at(events: list[dict[str, Any]], req_id: str, after_step: int) -> int:
    """The engine step of the first schedule after `after_step` that admits `req_id` from its start."""
    return next(e["engine_step"] for e in events if e["ev"] == "schedule" and e["step"] > after_step
                and any(x["req"] == req_id and x["start"] == 0 for x in e["entries"]))


@pytest.mark.parametrize("stem", sorted(DRIFTS))
def test_a_healed_drift_is_a_correct_run_for_both_ground_truths_and_check_trace(stem: str) -> None:
    mismatch, resumed = DRIFTS[stem]
    trace = HEALED / f"{stem}.jsonl"
    events = read_trace(trace)
    (extra,) = mismatch["extra"]
    # the request the id is kept for was preempted before the mismatch and is admitted again after it
    assert any(extra in e["preempted"] for e in events if e["ev"] == "schedule" and e["step"] < mismatch["step"])
    assert _resumed_at(events, extra, mismatch["step"]) == resumed
    check = check_verdict(trace)
    assert check["ok"] and not check.get("unchecked"), check
    result = _result(mismatch)
    assert findings(result) == []
    assert verdict(result, check) == ("accepted, correct run", "accepted")
    assert expected_verdict(result, events).kind == "legal"


@pytest.mark.parametrize("stem", sorted(DRIFTS))
def test_what_an_extra_id_changes_is_still_a_finding(stem: str) -> None:
    mismatch, _ = DRIFTS[stem]
    trace = HEALED / f"{stem}.jsonl"
    check, events = check_verdict(trace), read_trace(trace)
    # Had the id closed the gate at a completion where vLLM's schedule() forms a batch without it (E-b): a
    # finding, rejected at that completion (a miss on this trace, whose engine never did so); where
    # schedule() forms nothing without it, the engine completes there either way: none.
    at = next(e["engine_step"] for e in events if e["ev"] == "complete" and e["step"] >= mismatch["step"])
    forced = _result(mismatch, gated_completions=[{"step": at, "stale": mismatch["extra"], "would_schedule": True}])
    assert findings(forced) and verdict(forced, check)[0] == "accepted, MISSED bug"
    assert expected_verdict(forced, events).kind == "bug"
    same = _result(mismatch, gated_completions=[{"step": at, "stale": mismatch["extra"], "would_schedule": False}])
    assert findings(same) == [] and expected_verdict(same, events).kind == "legal"
    # the run the id stuck: named by its ending
    assert findings({**_result(mismatch), "ending": "stuck", "unfinished": mismatch["extra"]})
    # an id missing while its batch is in flight lets the running loop schedule the request twice
    missing = _result({**mismatch, "missing": mismatch["extra"], "extra": []})
    assert findings(missing) == [f"scheduled_req_ids disagrees with the batches in flight at step "
                                 f"{mismatch['step']}: extra [], missing {mismatch['extra']}"]
    assert expected_verdict(missing, events).kind == "bug"


@pytest.fixture(scope="module")
def replay_084() -> Iterator[ReplayWorker]:
    require_venv("0.8.4")
    with ReplayWorker("0.8.4") as worker:
        yield worker


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(DRIFTS))
def test_each_healed_drift_replayed_on_vllm_0_8_4_changes_nothing_vllm_does(stem: str, replay_084: ReplayWorker,
                                                                            tmp_path: Path) -> None:
    mismatch, _ = DRIFTS[stem]
    raw = json.loads((HEALED / f"{stem}.workload.json").read_text())
    trace = tmp_path / "t.jsonl"
    result = replay_084.replay(raw, trace=str(trace))
    assert decisions(read_trace(trace)) == decisions(read_trace(HEALED / f"{stem}.jsonl"))
    assert result["ground_truth"]["in_flight_set_mismatches"] == [mismatch]
    # the engine's own record: the gate never closed on the id with a batch queued, no idle, the run is over
    assert (result["ending"], result["gated_completions"], result["stalls"]) == ("done", [], [])
    assert findings(result) == []
    assert verdict(result, check_verdict(trace))[0] == "accepted, correct run"

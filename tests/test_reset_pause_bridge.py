"""Reset and pause across the bridge (docs/request-states.md, "Reset and
pause"): the workload's `events`, the campaign feature, the reference's
run with its trace checked by check-trace, and (with the vLLM venvs)
vLLM 0.33 and 0.34, sync and async, against the reference and the checker."""

from __future__ import annotations

import copy
import os

import pytest

from flightcheck.verification.traces.check import check_events
from flightcheck.vllm.differential import decisions, run_reference
from flightcheck.vllm.features import registered
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.workload import WorkloadError, workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")   # the reference's traces are checked

WORKLOAD = {
    "name": "reset-pause-1", "seed": 3,
    "config": {"num_stages": 2, "max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 4,
               "num_blocks": 40, "max_model_len": 128, "prefix_caching": True},
    "prefixes": {"p": 8},
    "requests": [{"id": "0", "prompt_len": 12, "prefix": "p", "max_tokens": 8},
                 {"id": "1", "prompt_len": 10, "prefix": "p", "max_tokens": 6, "arrival_step": 1},
                 {"id": "2", "prompt_len": 9, "prefix": "p", "max_tokens": 5, "arrival_step": 6}],
    "events": [{"step": 4, "reset": {"running": True}}, {"step": 5, "pause": "all"},
               {"step": 8, "pause": "new"}, {"step": 10, "pause": "none"},
               {"step": 12, "reset": {"running": False}}, {"step": 14, "reset": {"running": True}}],
}


def test_events_are_read_in_step_order_and_bad_ones_refused():
    events = workload_from_json(WORKLOAD).events
    assert [e.step for e in events] == [4, 5, 8, 10, 12, 14]
    assert events[0].reset_running is True and events[1].pause == "all" and events[1].pause_value == 2
    for bad in ([{"step": 1}], [{"step": 1, "pause": "some"}], [{"step": -1, "pause": "all"}],
                [{"step": 1, "reset": {"running": 1}}], [{"step": 1, "pause": "all", "reset": {}}], {}):
        with pytest.raises(WorkloadError):
            workload_from_json({**WORKLOAD, "events": bad})


def test_the_campaign_feature_adds_events_ending_unpaused_beside_a_connector_too():
    assert "reset-pause" in [f.name for f in registered()]
    workloads = campaign_workloads(0, 120, features_of="0.34.0")
    with_events = [w for w in workloads if "events" in w]
    assert len(with_events) >= 5           # drawn where none of the features it excludes was
    for w in with_events:
        assert "reset-pause" in w["features"]
        paused = [e["pause"] for e in w["events"] if "pause" in e]
        assert not paused or paused[-1] == "none"
    assert sum(w["config"].get("kv_connector") is not None for w in with_events) >= 3   # tests/test_reset_pause_kv.py
    assert not any("events" in w for w in campaign_workloads(0, 40, features_of="0.8.5"))


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_reference_runs_the_events_and_its_trace_is_legal(profile):
    run = run_reference(copy.deepcopy(WORKLOAD), profile)
    assert run.ending == "done"
    kinds = [e["ev"] for e in run.events]
    assert kinds.count("reset") == 3 and kinds.count("pause") == 3
    first_reset = next(e for e in run.events if e["ev"] == "reset")
    assert first_reset["running"] and first_reset["ok"] and first_reset["preempted"] == ["1", "0"]
    assert any(e["ev"] == "reset" and not e["ok"] for e in run.events)   # blocks held: no reset
    assert any(e["ev"] == "complete" and e.get("dropped") for e in run.events)
    assert check_events(run.events).ok
    assert ("reset", True, ("1", "0"), True) in decisions(run.events)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_reset_pause_workloads_agree_with_vllm(version: str, async_scheduling: bool) -> None:
    """The campaign's reset-pause workloads of seed 0 and the one above:
    identical to the reference, and check-trace's verdict vLLM's ground truth."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    from flightcheck.vllm.lora_workload import without_lora_features   # the workloads as first run

    workloads = [without_lora_features(w) for w in campaign_workloads(0, 40, features_of=version) if "events" in w]
    workloads.append(copy.deepcopy(WORKLOAD))
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == len(workloads) and report.unexplained == []
    # every verdict is vLLM's ground truth: no false rejection, no miss
    assert set(report.verdicts) <= {"accepted, correct run", "rejected, real bug"}
    # the hand-written workload runs identically; the seed's draws combine reset and pause with
    # other features, whose vLLM bugs are named deviations (a partial chunk's token dropped, sync;
    # a KV rollback keeping placeholders, async), each a run check-trace rejects as the bug it is
    deviated = {name for names in report.deviation_workloads.values() for name in names}
    assert WORKLOAD["name"] not in deviated
    assert report.identical == len(workloads) - len(deviated)
    # drafts beside reset and pause (docs/request-states.md, "Features together"): under
    # synchronous pipeline parallelism vLLM samples a drafted request's position twice
    # (the drafts_handed_over_at_submission deviation)
    double_sampled = report.deviation_workloads.get("drafts_handed_over_at_submission", [])
    assert not (async_scheduling and double_sampled)
    assert all("spec-decoding" in w.get("features", ()) for w in workloads if w["name"] in double_sampled)
    assert report.verdicts.get("rejected, real bug", 0) >= len(double_sampled)

"""The KV connector's differential: the readings both sides share (the
differential's `decisions`) and the reference's fixes found by the kv
campaign (docs/kv-connector.md, "Differential against vLLM")."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from flightcheck.vllm.differential import decisions, profile_for, run_reference
from flightcheck.vllm.generate import campaign_workloads

from .vllm_support import require_venv

pytestmark = pytest.mark.usefixtures("both_checkers")   # the campaign checks traces

CONFIG = {"ev": "config", "kv_connector": {"consumer": True, "producer": False,
                                           "load_failure_policy": "fail", "max_inflight_loads": None}}


def _workload(index: int) -> dict:
    return campaign_workloads(0, index + 1, family="kv-connector", mid_step_inputs=True)[index]


def test_error_finish_written_twice_by_vllm_counts_once() -> None:
    # vLLM's recorder: in finish_requests (before the complete), again after the update
    vllm = [CONFIG, {"ev": "kv_failed", "req": "a", "from_block": 1},
            {"ev": "finish", "req": "a", "reason": "error", "held": False},
            {"ev": "complete", "batch": 1, "tokens": {"a": [5]}, "dropped": ["a"]},
            {"ev": "finish", "req": "a", "reason": "error", "held": False}]
    # the reference: after the complete, held for a load's report
    reference = [CONFIG, {"ev": "kv_failed", "req": "a", "from_block": 1},
                 {"ev": "complete", "batch": 1, "tokens": {"a": [5]}, "dropped": ["a"]},
                 {"ev": "finish", "req": "a", "reason": "error", "held": True}]
    assert decisions(vllm) == decisions(reference) == [
        ("kv_failed", "a", 1), ("complete", (), ("a",)), ("finish", "a", "error")]


def test_error_finish_before_the_next_complete_stays_before_it() -> None:
    events = [CONFIG, {"ev": "complete", "batch": 1, "tokens": {"a": [5]}, "dropped": []},
              {"ev": "finish", "req": "b", "reason": "error"},
              {"ev": "complete", "batch": 2, "tokens": {"a": [6]}, "dropped": []}]
    assert [d[0] for d in decisions(events)] == ["complete", "finish", "complete"]


def test_error_finish_after_a_completion_still_waits_for_its_own_batch() -> None:
    # vLLM: batch 1 completes, then batch 2's update writes its failure and the
    # finish before batch 2's `complete`; the reference writes the finish after it
    vllm = [CONFIG, {"ev": "complete", "batch": 1, "tokens": {"b": [4]}, "dropped": []},
            {"ev": "kv_failed", "req": "a", "from_block": 1},
            {"ev": "finish", "req": "a", "reason": "error"},
            {"ev": "complete", "batch": 2, "tokens": {"a": [5]}, "dropped": ["a"]}]
    reference = [CONFIG, {"ev": "complete", "batch": 1, "tokens": {"b": [4]}, "dropped": []},
                 {"ev": "kv_failed", "req": "a", "from_block": 1},
                 {"ev": "complete", "batch": 2, "tokens": {"a": [5]}, "dropped": ["a"]},
                 {"ev": "finish", "req": "a", "reason": "error"}]
    assert decisions(vllm) == decisions(reference)
    assert decisions(vllm)[-1] == ("finish", "a", "error")


def test_aborted_sync_load_still_reports_its_failure() -> None:
    # r2's sync load (fail_whole) is aborted while its batch is in flight: the
    # connector still reports its blocks with that batch (vLLM's does)
    raw = _workload(14)
    assert raw["name"] == "diff-kv-connector-wait-0-14"
    ours = decisions(run_reference(raw, profile_for("0.34.0", False)).events, block_offset=1)
    assert ("kv_failed", "r2", 0) in ours
    assert ours.index(("abort", "r2")) < ours.index(("kv_failed", "r2", 0))


def test_shared_invalid_block_fails_every_holder_but_reports_the_load_once() -> None:
    # r0's sync load fails from block 1; r1 (running) and r3 (parked for its own
    # async load) hold that block through a prefix hit: under the fail policy
    # all three finish by error (vLLM's _update_requests_with_invalid_blocks
    # over kv_holding_waiting and running), one kv_failed (r0's own load)
    raw = _workload(55)
    ours = decisions(run_reference(raw, profile_for("0.34.0", False), vllm_outputs=True).events,
                     block_offset=1)
    assert [d for d in ours if d[0] == "kv_failed"] == [("kv_failed", "r0", 1)]
    errors = [d[1] for d in ours if d[0] == "finish" and d[2] == "error"]
    assert sorted(errors) == ["r0", "r1", "r3"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_kv_campaign_of_30_workloads_has_no_unexplained_differential(version: str, async_scheduling: bool) -> None:
    """Issue 36's acceptance, cut to 30 workloads per version and mode
    (`flightcheck vllm campaign --kv-connector --workloads 30 --no-mutants`)."""
    if os.environ.get("FLIGHTCHECK_SKIP_VLLM"):
        pytest.skip("FLIGHTCHECK_SKIP_VLLM")
    from flightcheck.vllm.campaign import run_version

    workloads = campaign_workloads(0, 30, family="kv-connector", mid_step_inputs=True)
    report = run_version(version, workloads, 0, False, lambda line: None, async_scheduling)
    assert report.workloads == 30 and report.differential_not_run == 0
    assert report.unexplained == []


def test_a_load_waiting_with_nothing_else_to_run_is_not_stuck() -> None:
    # r3 parks once r2's send frees its blocks; meanwhile only transfers are
    # pending: engine.py counts them as progress on the reference's side too
    raw = _workload(6)
    run = run_reference(raw, profile_for("0.34.0", False))
    assert run.ending == "done"
    assert ("schedule", (), (), (("r3", 9),)) in decisions(run.events, block_offset=1)


def test_the_long_prefill_threshold_counts_parked_loads_as_waiting() -> None:
    # r2 is the only waiting request, r3 is parked for its load: vLLM's
    # get_request_counts counts kv_holding_waiting, so the threshold (6) holds
    raw = _workload(25)
    ours = decisions(run_reference(raw, profile_for("0.34.0", False)).events, block_offset=1)
    r2 = [entry for d in ours if d[0] == "schedule" for entry in d[1] if entry[0] == "r2"]
    assert r2[0][1:3] == (8, 6)


def test_the_fail_policys_error_order_is_the_configured_one() -> None:
    # r0 and r1 fail in one output; vLLM finishes them iterating a set (its
    # hash seed's order, which the recorder fixes), the differential replays
    # the order vLLM's trace shows
    raw = _workload(22)
    name = profile_for("0.34.0", False)
    by_id = decisions(run_reference(raw, name, vllm_outputs=True).events, block_offset=1)
    reversed_ = decisions(run_reference(raw, name, vllm_outputs=True, kv_error_order=("r1", "r0")).events,
                          block_offset=1)
    assert by_id != reversed_
    assert decisions(run_reference(raw, name, vllm_outputs=True, kv_error_order=("r0",)).events,
                     block_offset=1) == by_id


def test_error_order_is_tried_after_any_deviation_not_only_the_error_finish() -> None:
    # vLLM 0.34.0, seed 59 index 6 of `--kv-connector --spec-tokens 1`: drafts
    # handed over at submission come first; later r0, r3 and r2 fail (policy
    # "fail") and vLLM finished them r0, r3, r2 (the recorder's scan order of
    # the set), so r2 freed the shared block 1 last: r1 is allocated
    # (1, 9, 7, 6), not (9, 1, 7, 6); the conforming run is rerun in that order
    from flightcheck.vllm.differential import compare, read_trace

    stem = Path(__file__).parent / "data" / "kv" / "vllm" / "034_fail_policy_errors_in_set_order_after_drafts_deviation"
    raw = json.loads(stem.with_suffix(".workload.json").read_text())
    result = json.loads(stem.with_suffix(".result.json").read_text())
    name = profile_for("0.34.0", False)
    comparison = compare(raw["name"], result, read_trace(stem.with_suffix(".jsonl")), run_reference(raw, name),
                         run_reference(raw, name, vllm_outputs=True),
                         lambda order: run_reference(raw, name, vllm_outputs=True, kv_error_order=order))
    assert comparison.deviation == "drafts_handed_over_at_submission"
    assert comparison.explained, comparison.first_difference


def test_empty_batches_still_queued_take_their_steps_before_the_input_wait() -> None:
    # `--versions 0.34.0 --kv-connector --async --seed 72`, index 19: four idle
    # steps left one empty batch queued; the loop jumped to r2's arrival (step
    # 11) with it still there, so r2 arrived inside step 11's wait and ran a
    # step late, and after its rollback the decode stagger held its recompute
    # past its abort at step 20; vLLM's engine steps through the queue
    # (EngineCoreProc.has_work), takes r2 before step 11 and recomputes it at 19
    raw = campaign_workloads(72, 20, family="kv-connector", mid_step_inputs=True)[19]
    raw = {**raw, "config": {**raw["config"], "async_scheduling": True}}
    events = run_reference(raw, profile_for("0.34.0", True), vllm_outputs=True).events
    order = [(e["ev"], e.get("batch")) for e in events
             if e["ev"] == "abort" and e["req"] == "r2"
             or e["ev"] == "schedule" and any(x["req"] == "r2" and x["start"] == 0 for x in e["entries"])]
    assert order[0] == ("schedule", 3)


# vLLM 0.33.0 sync, `--all-features --spec-tokens 3` seed 103 index 35
# (tests/test_vllm_hunt34_cases.py JOINT_FAILURES): r0's and r2's sync loads
# fail in one output under the fail policy, and vLLM frees both tables in one
# `finish_requests(error_req_ids, FINISHED_ERROR)` (0.33/0.34
# `Scheduler.update_from_output`), iterating a set: its order would follow
# the worker's PYTHONHASHSEED (`list({"r0", "r2"})` differs between seeds 0
# and 1). The recorder hands vLLM the ids one by one in its scan order
# (recording.py `_fc_scan_order`: running order here, r2 before r0), the
# trace says so, and r1's later table depends on it.
JOINT_FAILURES = Path(__file__).parent / "data" / "vllm" / "hunt34" / \
    "033_sync_fail_policy_joint_failures_evict_then_finish_seed103_35"


def test_two_failed_loads_freed_in_one_step_are_rerun_once_in_the_traces_order() -> None:
    from flightcheck.vllm.differential import compare, errors_in_trace_order, first_difference, read_trace

    raw = json.loads(JOINT_FAILURES.with_suffix(".workload.json").read_text())
    events = read_trace(JOINT_FAILURES.with_suffix(".jsonl"))
    assert errors_in_trace_order(events) == ("r2", "r0")           # not id order
    theirs, name = decisions(events), profile_for("0.33.0", False)
    in_id_order = run_reference(raw, name, vllm_outputs=True)
    assert first_difference(theirs, decisions(in_id_order.events, block_offset=1)) is not None
    asked: list[tuple[str, ...]] = []

    def rerun(order: tuple[str, ...]) -> Any:
        asked.append(order)
        return run_reference(raw, name, vllm_outputs=True, kv_error_order=order)

    result = {"ending": "done", "vllm_version": "0.33.0", "async_scheduling": False}
    comparison = compare(raw["name"], result, events, run_reference(raw, name), in_id_order, rerun)
    assert comparison.explained, comparison.first_difference
    assert asked == [("r2", "r0")]                                 # one rerun, no search over orders
    swapped = [dict(e, req="r0") if e.get("ev") == "finish" and e.get("req") == "r2" and e.get("reason") == "error"
               else dict(e, req="r2") if e.get("ev") == "finish" and e.get("req") == "r0" and e.get("reason") == "error"
               else e for e in events]
    asked.clear()
    assert not compare(raw["name"], result, swapped, run_reference(raw, name), in_id_order, rerun).explained
    assert asked == []                       # the trace's order is id order: the conforming run already had it


@pytest.mark.vllm
@pytest.mark.slow
def test_the_recorders_error_order_does_not_follow_the_hash_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay worker inherits the caller's environment and pins no
    PYTHONHASHSEED: the order of two failed loads freed in one step is the
    recorder's, the same trace under two seeds that iterate the set apart."""
    require_venv("0.33.0")
    from flightcheck.vllm.campaign import ReplayJob, replay_workload
    from flightcheck.vllm.differential import errors_in_trace_order, read_trace
    from flightcheck.vllm.replay import ReplayWorker

    raw = json.loads(JOINT_FAILURES.with_suffix(".workload.json").read_text())
    traces = []
    for seed in ("0", "1"):                  # list({"r0", "r2"}) is r2, r0 under seed 0 and r0, r2 under 1
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        with ReplayWorker("0.33.0") as worker, tempfile.TemporaryDirectory() as scratch:
            trace = Path(scratch) / "trace.jsonl"
            worker.replay(raw, trace=str(trace))
            traces.append(trace.read_text().splitlines()[1:])            # the config line has a timestamp
            assert errors_in_trace_order(read_trace(trace)) == ("r2", "r0"), seed
            replayed = replay_workload(worker, ReplayJob("0.33.0", False, 0, raw, 0))
        assert replayed.comparison is not None and replayed.comparison.explained, replayed.comparison.describe()
    assert traces[0] == traces[1]

"""vLLM 0.33.0's real scheduler through the replay: its engine loop
(`EngineCore.step_with_batch_queue`: schedule every step, empty batches in
the queue, aborts right before an output is processed), the recorder on its
`Scheduler`, and the request-id reuse bug (docs/vllm-0.33-id-reuse.md)
shown from vLLM's own state on minimal workloads, each beside the same
workload with a fresh id, which finishes normally.

Workloads: tests/data/vllm/workloads-0.33.json (each says why it is there)
and the 0.8.x named workloads (tests/data/vllm/workloads.json). One replay
worker serves the module (importing vLLM 0.33 costs 10-40 s).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightcheck.cli import main
from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm import RECORDER
from flightcheck.vllm.replay import ReplayError, ReplayWorker, findings

from .test_vllm_engine_scenario import EXPECTED_STEPS, replayed_steps
from .test_vllm_engine_scenario import WORKLOAD as ENGINE_WORKLOAD
from .vllm_support import DATA, Workers, require_venv, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

VERSION = "0.33.0"
WORKLOADS = {w["name"]: w for w in json.loads((DATA / "workloads-0.33.json").read_text())}
WORKLOADS_08 = {w["name"]: w for w in json.loads((DATA / "workloads.json").read_text())}
REUSE = ("id-reuse-wrong-binding", "id-reuse-hang", "id-reuse-assertion")


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.fixture
def replay(running: Workers) -> ReplayWorker:
    return running[VERSION]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# vLLM's test_engine_core_concurrent_batches as its 0.33-era version asserts
# it, call by call of step_with_batch_queue(): what the call scheduled, which
# batch it completed (None: it returned without blocking), and the queue's
# length afterwards. Scheduling and completing now happen in one call: the
# new batch is appended, the queue is full (2), the oldest is popped.
EXPECTED_CALLS = [
    ({"0": 10}, None, 1),                       # Batch 1; returns None
    ({"0": 2, "1": 8}, {"0": 10}, 1),           # Batch 2; finishes Batch 1 (returns {})
    ({"1": 4}, {"0": 2, "1": 8}, 1),            # Batch 3; finishes Batch 2: req0's first token
    ({"0": 1}, {"1": 4}, 1),                    # Batch 4; finishes Batch 3: req1's first token
    ({"1": 1}, {"0": 1}, 1),                    # Batch 5; finishes Batch 4
]


def test_vllm_engine_test_scenario_replays_on_0_33_as_on_0_8_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    require_venv(VERSION)
    workload, trace = tmp_path / "workload.json", tmp_path / "trace.jsonl"
    workload.write_text(json.dumps(ENGINE_WORKLOAD))
    code = main(["vllm", "replay", str(workload), "--vllm-version", VERSION, "--trace", str(trace), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    (result,) = report["workloads"]
    assert result["vllm_version"] == VERSION and result["ending"] == "done" and not result["findings"]
    assert result["scheduler_cls"] == RECORDER
    steps, written = replayed_steps(trace)
    # The same events, in the same order, as vLLM 0.8.5's test asserts.
    assert steps[:len(EXPECTED_STEPS)] == EXPECTED_STEPS
    calls = [(c["scheduled"], c["completed"], c["queue"]) for c in result["engine_steps"]]
    assert calls[:len(EXPECTED_CALLS)] == EXPECTED_CALLS
    # The closing loop: every call consumes one output until request 0 finishes.
    assert all(c[1] for c in calls[1:len(steps) // 2])
    assert written[0]["vllm_version"] == VERSION and written[-1]["ev"] == "end"
    # Its vllm_version selects the vllm-0.33 profile, which accepts it ...
    verdict = check_trace(trace)
    assert verdict.ok and verdict.profile == "vllm-0.33", verdict
    # ... and under 0.8.5's rules, forced, this trace is legal too.
    assert check_trace(trace, profile="vllm-0.8.5").ok


def test_the_recorder_changes_no_decision_of_vllm_0_33(replay: ReplayWorker, tmp_path: Path):
    covered = {"preemption": False, "abort": False, "prefix hit": False, "empty batch": False,
               "stale output delivered to a preempted request": False}
    for name, workload in {**WORKLOADS, **WORKLOADS_08}.items():
        trace = tmp_path / f"{name}.jsonl"
        recorded = replay.replay(workload, trace=str(trace))
        plain = replay.replay(workload, recorder=False)
        assert plain["scheduler_cls"] == "vllm.v1.core.sched.scheduler.Scheduler"
        for key in ("batches", "outputs", "ending", "steps", "unfinished", "exception", "engine_steps"):
            assert recorded[key] == plain[key], f"{name}: {key} differs with the recorder"
        for event in events(trace):
            covered["empty batch"] |= bool(event.get("empty_batches_before")) or "empty_batch" in event
            if event["ev"] == "schedule":
                covered["preemption"] |= bool(event["preempted"])
                covered["prefix hit"] |= any(x["cached"] > 0 for x in event["entries"])
            elif event["ev"] == "complete":
                covered["stale output delivered to a preempted request"] |= any(
                    event["tokens"].get(req) and req not in event.get("dropped", []) for req in event.get("stale", []))
            covered["abort"] |= event["ev"] == "abort"
    assert all(covered.values()), covered


def test_the_0_8_workloads_run_cleanly_on_0_33(replay: ReplayWorker, tmp_path: Path):
    """0.8.5's stale token, 0.8.4's drift and crash do not happen on 0.33's
    sync scheduler (docs/vllm-semantics.md §"vLLM 0.33: stale output, counters and reused ids": deliver mode defers the resumption)."""
    for name, workload in WORKLOADS_08.items():
        result = replay.replay(workload, trace=str(tmp_path / f"{name}.jsonl"))
        assert result["ending"] == "done" and not findings(result), (name, findings(result))
        truth = result["ground_truth"]
        assert truth["negative_counters"] == [] and truth["in_flight_counter_mismatches"] == []


def test_empty_batches_take_queue_slots_and_are_written_as_optional_fields(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay.replay(WORKLOADS_08["tight-pool-k3"], trace=str(trace))
    depth = WORKLOADS_08["tight-pool-k3"]["config"]["num_stages"]
    empties = [c for c in result["engine_steps"] if c["scheduled"] == {}]
    assert empties and max(c["queue"] for c in result["engine_steps"]) < depth
    # Every empty batch scheduled is completed, in FIFO order, and the trace
    # names each once in each role.
    notes = [n for e in events(trace) for n in e.get("empty_batches_before", [])]
    notes += [{"ev": "schedule", "empty_batch": e["empty_batch"]} for e in events(trace) if "empty_batch" in e]
    scheduled = sorted(n["empty_batch"] for n in notes if n["ev"] == "schedule")
    completed = [n["empty_batch"] for n in notes if n["ev"] == "complete"]
    assert scheduled == list(range(1, len(empties) + 1)) and completed == sorted(completed) == scheduled


def test_an_abort_from_the_aborts_queue_lands_right_before_the_output_is_processed(replay: ReplayWorker,
                                                                                      tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay.replay(WORKLOADS["abort-via-aborts-queue"], trace=str(trace))
    assert result["ending"] == "done" and not findings(result)
    trail = [e for e in events(trace) if e["ev"] in ("schedule", "abort", "complete")]
    abort = next(i for i, e in enumerate(trail) if e["ev"] == "abort")
    # The step the abort arrived in scheduled r0's next chunk (batch 3) first,
    # then applied the abort, then processed batch 2's output, dropped.
    assert trail[abort - 1]["ev"] == "schedule" and trail[abort - 1]["batch"] == 3
    assert trail[abort + 1] == {**trail[abort + 1], "ev": "complete", "batch": 2, "dropped": ["r0"]}
    # Delivered through the input queue instead, the abort precedes that step's schedule.
    as_input = json.loads(json.dumps(WORKLOADS["abort-via-aborts-queue"]))
    del as_input["requests"][0]["abort_via"]
    plain = replay.replay(as_input)
    assert [b for b in plain["batches"]] == [{"r0": 8}, {"r0": 8}]


def _reuse_trail(trace: Path) -> tuple[list[dict[str, Any]], int, int]:
    """The trace, the index of the second `arrive` of r0, and of the
    `complete` of batch 1 (the old r0's batch)."""
    written = events(trace)
    again = [i for i, e in enumerate(written) if e["ev"] == "arrive" and e["req"] == "r0"][1]
    applied = next(i for i, e in enumerate(written) if e["ev"] == "complete" and e["batch"] == 1)
    return written, again, applied


def test_a_reused_id_binds_the_old_batch_s_token_to_the_new_request(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay.replay(WORKLOADS["id-reuse-wrong-binding"], trace=str(trace))
    truth = result["ground_truth"]
    assert truth["stale_tokens"] == [{"step": 4, "batch": 1, "req": "r0", "why": "aborted and re-added"}]
    assert truth["negative_counters"] == [{"step": 4, "req": "r0", "counter": "num_in_flight_tokens", "value": -4}]
    assert result["ending"] == "done"
    written, again, applied = _reuse_trail(trace)
    # Old r0 aborted, new r0 added, then batch 1's token applied to it (not dropped).
    assert written[again - 2]["ev"] == "abort" and again < applied
    assert written[applied]["tokens"]["r0"] and "r0" not in written[applied].get("dropped", [])


def test_a_reused_id_hangs_the_engine_on_a_negative_stale_count(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay.replay(WORKLOADS["id-reuse-hang"], trace=str(trace))
    assert (result["ending"], result["unfinished"], result["batches_in_flight"]) == ("stuck", ["r0"], 0)
    counters = {(n["req"], n["counter"]) for n in result["ground_truth"]["negative_counters"]}
    assert counters == {("r0", "num_in_flight_tokens"), ("r0", "num_stale_output_tokens")}
    written = events(trace)
    preempted = [i for i, e in enumerate(written) if e["ev"] == "schedule" and "r0" in e["preempted"]]
    assert preempted and not any(e["ev"] == "schedule" and any(x["req"] == "r0" for x in e["entries"])
                                 for e in written[preempted[-1] + 1:])
    # The engine spins on empty batches (0.33's has_work counts the queue) and the trace ends.
    assert result["engine_steps"][-1]["scheduled"] == {} and written[-1]["ev"] == "end"


def test_a_reused_id_kills_the_engine_on_the_stale_count_assertion(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay.replay(WORKLOADS["id-reuse-assertion"], trace=str(trace))
    assert result["ending"] == "exception"
    assert "in update_from_output: assert request.num_stale_output_tokens >= 0" in result["exception"]
    assert result["ground_truth"]["stale_tokens"][0]["why"] == "aborted and re-added"
    written = events(trace)
    assert written[-1]["ev"] != "end"          # cut short where vLLM died


@pytest.mark.parametrize("name", REUSE)
def test_the_same_workload_with_a_fresh_id_finishes_normally(replay: ReplayWorker, name: str):
    reused = replay.replay(WORKLOADS[name])
    fresh = replay.replay(WORKLOADS[f"{name}-fresh-id"])
    assert findings(reused)
    assert fresh["ending"] == "done" and not findings(fresh)
    assert fresh["ground_truth"]["negative_counters"] == [] == fresh["ground_truth"]["in_flight_counter_mismatches"]


def test_the_sync_recorder_refuses_to_stand_in_for_the_async_scheduler(replay: ReplayWorker):
    workload = json.loads(json.dumps(WORKLOADS["id-reuse-wrong-binding-fresh-id"]))
    workload["config"].update(num_stages=1, async_scheduling=True)
    with pytest.raises(ReplayError, match="records vLLM's synchronous Scheduler, but this engine runs with async"):
        replay.replay(workload)


def _mixed_workloads(first: int, count: int) -> list[dict[str, Any]]:
    """`scripts/vllm-workloads.py mixed FIRST FIRST+COUNT` (the README's figures' family)."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "scripts" / "vllm-workloads.py"
    spec = importlib.util.spec_from_file_location("vllm_workloads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [module.mixed(seed) for seed in range(first, first + count)]


def test_check_trace_accepts_every_correct_0_33_run_under_the_0_33_profile(replay: ReplayWorker, tmp_path: Path):
    """Generated workloads (the first 12 of `mixed`: the threshold with a lone
    request, the free queue's head, the full-sequence gate, EOS before the
    length cap among them), the 0.8.x named workloads and the fresh-id twins:
    vLLM's ground truth finds nothing wrong, and check-trace, picking the
    profile from the trace's vllm_version, accepts each. The id-reuse runs
    are rejected where the old batch's token is applied to the new request."""
    from flightcheck.verification.traces.ground_truth import expected_verdict
    chosen = _mixed_workloads(0, 12) + list(WORKLOADS_08.values()) + list(WORKLOADS.values())
    for workload in chosen:
        trace = tmp_path / f"{workload['name']}.jsonl"
        result = replay.replay(workload, trace=str(trace))
        expected = expected_verdict(result, events(trace))
        verdict = check_trace(trace)
        assert verdict.profile == "vllm-0.33"
        if workload["name"] in REUSE:
            assert expected.kind == "bug" and not verdict.ok, workload["name"]
            assert verdict.event_index == expected.latest and verdict.property == "S7_output_binding"
            continue
        assert expected.kind == "legal", (workload["name"], expected)
        assert verdict.ok, (workload["name"], verdict)

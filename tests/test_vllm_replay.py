"""Replays through vLLM's real scheduler (0.8.5 and 0.8.4): the recorder
changes no decision, is the class vLLM's engine core resolves by name, and
the ground truth the replay reads from vLLM's own state shows vLLM's real
bugs on the workloads that hit them.

Workloads: tests/data/vllm/workloads.json (each says why it is there). One
replay worker per version serves the whole module (importing vLLM costs
10-40 s).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm import RECORDER
from flightcheck.vllm.replay import ReplayWorker, findings

from .vllm_support import DATA, Workers, workers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("both_checkers")]

WORKLOADS = {w["name"]: w for w in json.loads((DATA / "workloads.json").read_text())}
VERSIONS = ("0.8.5", "0.8.4")


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.fixture(params=VERSIONS)
def replay(running: Workers, request: pytest.FixtureRequest) -> ReplayWorker:
    return running[request.param]


@pytest.fixture
def replay_085(running: Workers) -> ReplayWorker:
    return running["0.8.5"]


@pytest.fixture
def replay_084(running: Workers) -> ReplayWorker:
    return running["0.8.4"]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_recorder_changes_no_decision_of_vllm(replay: ReplayWorker, tmp_path: Path):
    covered = {"preemption": False, "abort": False, "prefix hit": False, "two chunks in flight": False}
    for name, workload in WORKLOADS.items():
        trace = tmp_path / f"{name}.jsonl"
        recorded = replay.replay(workload, trace=str(trace))
        plain = replay.replay(workload, recorder=False)
        assert plain["scheduler_cls"] == "vllm.v1.core.sched.scheduler.Scheduler"
        for key in ("batches", "outputs", "ending", "steps", "unfinished", "exception"):
            assert recorded[key] == plain[key], f"{name} on {replay.version}: {key} differs with the recorder"
        in_flight: list[set[str]] = []
        for event in events(trace):
            if event["ev"] == "schedule":
                covered["preemption"] |= bool(event["preempted"])
                covered["prefix hit"] |= any(x["cached"] > 0 for x in event["entries"])
                names = {x["req"] for x in event["entries"]}
                covered["two chunks in flight"] |= any(names & earlier for earlier in in_flight)
                if event["batch"] is not None:
                    in_flight.append(names)
            elif event["ev"] == "complete":
                in_flight.pop(0)
            covered["abort"] |= event["ev"] == "abort"
    # The comparison means something only if the workloads make vLLM do these.
    required = {"preemption", "abort", "prefix hit"} | ({"two chunks in flight"} if replay.version == "0.8.5" else set())
    assert required <= {what for what, seen in covered.items() if seen}, covered


def test_the_replay_builds_the_recorder_from_its_qualified_name_as_vllm_does(replay: ReplayWorker):
    result = replay.replay(WORKLOADS["no-cache-k2"])
    assert result["scheduler_cls"] == RECORDER and result["scheduler_is_vllm_scheduler"]


def test_the_trace_header_names_the_version_and_what_it_reads_from_vllm(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    replay.replay(WORKLOADS["tight-pool-k3"], trace=str(trace))
    config = events(trace)[0]
    assert config["vllm_version"] == replay.version and config["writer"] == "flightcheck.vllm.recorder"
    assert (config["num_blocks"], config["usable_blocks"], config["num_stages"]) == (12, 11, 3)
    if replay.version == "0.8.4":     # scheduled_req_ids; KVCacheManager(num_preallocate_tokens=64)
        assert (config["policy"], config["num_preallocate_tokens"]) == ("one-batch-per-request", 64)
    else:
        assert (config["policy"], config["num_preallocate_tokens"]) == ("continue-prefill", 0)


def test_every_admission_records_its_whole_block_table(replay: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    replay.replay(WORKLOADS["preemptions-with-prefix-hits"], trace=str(trace))
    block_size = events(trace)[0]["block_size"]
    admissions = [x for e in events(trace) if e["ev"] == "schedule" for x in e["entries"] if x["start"] == x["cached"]
                  and (x["cached"] > 0 or x["start"] == 0)]
    assert admissions
    for x in admissions:
        needed = -(-(x["start"] + x["n"]) // block_size)
        if replay.version == "0.8.4":      # allocate_slots preallocates ahead
            assert len(x["block_ids"]) >= needed
        else:
            assert len(x["block_ids"]) == needed


def test_correct_0_8_5_runs_with_preemptions_and_prefix_hits_are_legal(replay_085: ReplayWorker, tmp_path: Path):
    for name in ("preemptions-with-prefix-hits", "preemptions-with-prefix-hits-2"):
        trace = tmp_path / f"{name}.jsonl"
        result = replay_085.replay(WORKLOADS[name], trace=str(trace))
        assert result["ending"] == "done" and not findings(result)
        assert check_trace(trace).ok, check_trace(trace)


def test_0_8_5_appends_a_stale_token_to_a_resumed_request(replay_085: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay_085.replay(WORKLOADS["stale-token-after-resume"], trace=str(trace))
    assert result["ground_truth"]["stale_tokens"] == [
        {"step": 11, "batch": 4, "req": "r2", "why": "preempted and resumed"}]
    # In the trace: r2 preempted (batch 4 in flight), resumed, then batch 4's token applied to it.
    trail = [e for e in events(trace) if e["ev"] in ("schedule", "complete")]
    preempted = next(i for i, e in enumerate(trail) if "r2" in e.get("preempted", []))
    resumed = next(i for i, e in enumerate(trail) if i > preempted and e["ev"] == "schedule"
                   and any(x["req"] == "r2" for x in e["entries"]))
    applied = next(i for i, e in enumerate(trail) if e["ev"] == "complete" and e["batch"] == 4)
    assert preempted < resumed < applied
    assert trail[applied]["tokens"]["r2"] and "r2" not in trail[applied].get("dropped", [])


def test_0_8_5_blocks_on_input_with_an_aborted_batch_in_flight(replay_085: ReplayWorker):
    result = replay_085.replay(WORKLOADS["aborted-batch-left-in-flight"])
    assert (result["ending"], result["batches_in_flight"]) == ("blocked_in_flight", 1)
    assert findings(result) == ["the run ended blocked_in_flight with 1 batches in flight"]


def test_0_8_4_livelocks_on_a_preempted_request_left_in_scheduled_req_ids(replay_084: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay_084.replay(WORKLOADS["counter-drift-livelock"], trace=str(trace))
    assert (result["ending"], result["unfinished"], result["batches_in_flight"]) == ("stuck", ["r1"], 0)
    (mismatch,) = result["ground_truth"]["in_flight_set_mismatches"]
    assert (mismatch["extra"], mismatch["missing"]) == (["r1"], [])
    written = events(trace)
    assert written[-1] == {"ev": "end"}       # the run is over: check-trace judges liveness there
    preempting = next(e for e in written if e["ev"] == "schedule" and "r1" in e["preempted"])
    assert preempting["step"] < mismatch["step"]


def test_0_8_4_drift_that_heals_is_still_reported(replay_084: ReplayWorker):
    result = replay_084.replay(WORKLOADS["counter-drift-heals"])
    assert result["ending"] == "done" and result["ground_truth"]["in_flight_set_mismatches"]
    # reported, yet no finding: only extra ids, and the engine's gate never closed on them
    assert not any(m["missing"] for m in result["ground_truth"]["in_flight_set_mismatches"])
    assert result["gated_completions"] == [] and findings(result) == []


def test_0_8_4_crashes_after_a_stale_completion_clears_scheduled_req_ids(replay_084: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay_084.replay(WORKLOADS["stale-completion-crash"], trace=str(trace))
    assert result["ending"] == "exception"
    assert "in schedule: assert num_new_tokens > 0" in result["exception"]
    assert {"extra": [], "missing": ["r4"]}.items() <= result["ground_truth"]["in_flight_set_mismatches"][0].items()
    written = events(trace)
    assert written[-1]["ev"] != "end"         # cut short where vLLM died: no claim that the run is over
    r4_entries = [e["batch"] for e in written if e["ev"] == "schedule" and any(x["req"] == "r4" for x in e["entries"])]
    assert len(r4_entries) >= 2


def test_0_8_5_appends_a_token_sampled_for_a_chunk_it_scheduled_as_partial(replay_085: ReplayWorker, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    result = replay_085.replay(WORKLOADS["token-for-a-partial-chunk"], trace=str(trace))
    (partial,) = result["ground_truth"]["partial_chunk_tokens"]
    assert (partial["batch"], partial["req"]) == (24, "r4") and not result["ground_truth"]["stale_tokens"]
    written = events(trace)
    scheduled = next(x for e in written if e["ev"] == "schedule" and e["batch"] == 24 for x in e["entries"]
                     if x["req"] == "r4")
    assert scheduled["samples"] is False
    applied = next(i for i, e in enumerate(written) if e["ev"] == "complete" and e["batch"] == 24)
    assert written[applied]["tokens"]["r4"] and "r4" not in written[applied].get("dropped", [])
    # check-trace, independently, rejects the trace at that very event.
    verdict = check_trace(trace)
    assert (verdict.ok, verdict.event_index, verdict.property) == (False, applied, "S5_one_sample_per_prefill")


@pytest.mark.slow
def test_a_single_stage_engine_replays(replay: ReplayWorker, tmp_path: Path):
    """One pipeline stage, no pipeline parallelism: 0.8.x's VllmConfig asks
    the platform whether V0's async output processor is supported, which
    raised NotImplementedError on a machine without one, and the replay
    failed before vLLM's scheduler was built (the bridge now turns that
    processor off: no V1 scheduler uses it)."""
    workload = {"name": "one-stage", "seed": 3, "max_steps": 200,
                "config": {"num_stages": 1, "max_num_batched_tokens": 8, "max_num_seqs": 1, "block_size": 4,
                           "num_blocks": 6, "max_model_len": 16},
                "requests": [{"id": "r0", "prompt_len": 6, "max_tokens": 3},
                             {"id": "r1", "prompt_len": 3, "max_tokens": 2, "arrival_step": 1}]}
    trace = tmp_path / "one-stage.jsonl"
    recorded = replay.replay(workload, trace=str(trace))
    assert recorded["ending"] == "done" and not findings(recorded)
    assert events(trace)[0]["num_stages"] == 1
    assert check_trace(trace).ok

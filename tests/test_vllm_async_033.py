"""vLLM 0.33.0's `AsyncScheduler` through the replay (issue 22 point 2):
`RecordingAsyncScheduler` records it, the replay builds it with the V2 model
runner's settings (batch queue K + 1 read from vLLM's own
`max_concurrent_batches`, decode stagger K), the fabricated model samples
each decode at the position after its placeholders; the differential
compares the reference's `vllm-0.33-async` profile with it batch for batch
(output placeholders included) on Hypothesis-generated workloads.

Long runs: `python -m flightcheck.vllm.campaign --workloads N --versions 0.33.0 --async`.
check-trace judges every replayed async trace against vLLM's ground truth
(correct runs accepted, runs where vLLM's own state shows the id-reuse bug
rejected).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flightcheck.cli import main
from flightcheck.reference.config import SchedulerConfig
from flightcheck.reference.kv_cache_manager import KVCacheManager
from flightcheck.reference.scheduler import Scheduler
from flightcheck.vllm import ASYNC_RECORDER
from flightcheck.vllm.campaign import check_verdict, compare_workload, verdict, with_async_scheduling
from flightcheck.vllm.differential import decisions, profile_for, read_trace, run_reference
from flightcheck.vllm.generate import campaign_workloads, generate_workload
from flightcheck.vllm.replay import ReplayError, ReplayWorker, findings

from .test_vllm_differential import HypothesisPicker
from .vllm_support import DATA, Workers, workers

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

VERSION = "0.33.0"

WORKLOAD: dict[str, Any] = {
    "name": "async-overlap", "seed": 3,
    "config": {"num_stages": 2, "max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 4,
               "num_blocks": 40, "max_model_len": 128, "prefix_caching": True, "async_scheduling": True},
    "requests": [{"id": "a", "prompt_len": 10, "max_tokens": 6},
                 {"id": "b", "prompt_len": 7, "max_tokens": 5, "arrival_step": 2},
                 {"id": "c", "prompt_len": 5, "max_tokens": 2, "arrival_step": 3}]}


@pytest.fixture(scope="module")
def running() -> Iterator[Workers]:
    yield from workers()


@pytest.fixture
def replay(running: Workers) -> ReplayWorker:
    return running[VERSION]


def schedule_calls(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every schedule() call in order (the recorder writes the empty ones in
    `empty_batches_before` of the next event), each as its entries."""
    calls: list[list[dict[str, Any]]] = []
    for event in events:
        calls.extend([] for item in event.get("empty_batches_before", ()) if item["ev"] == "schedule")
        if event["ev"] == "schedule":
            calls.append(event["entries"])
    return calls


@pytest.mark.vllm
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_the_async_recorder_runs_vllm_s_async_scheduler_with_the_v2_runner_settings(
        replay: ReplayWorker, tmp_path: Path, stages: int):
    raw = json.loads(json.dumps(WORKLOAD))
    raw["config"]["num_stages"] = stages
    trace = tmp_path / "async.jsonl"
    result = replay.replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    assert result["scheduler_cls"] == ASYNC_RECORDER and result["async_scheduling"]
    assert result["batch_queue_depth"] == stages + 1          # vLLM's max_concurrent_batches
    assert result["ending"] == "done" and findings(result) == []
    events = read_trace(trace)
    config = events[0]
    assert (config["async_scheduling"], config["batch_queue_depth"], config["decode_stagger"]) == (
        True, stages + 1, stages)
    # Every empty batch is noted, so check-trace counts the stagger's calls
    # exactly (the recorder's `step` counts its own calls, not engine steps).
    assert config["notes_empty_batches"] is True
    # A decode scheduled while the previous sampling entry of its request is in flight.
    in_flight: dict[int, set[str]] = {}
    overlapped: set[str] = set()
    for event in events:
        if event["ev"] == "schedule" and event["batch"] is not None:
            sampling = {e["req"] for e in event["entries"] if e["samples"]}
            overlapped |= sampling & set().union(set(), *in_flight.values())
            in_flight[event["batch"]] = sampling
            assert all("placeholders" in e for e in event["entries"])
        elif event["ev"] == "complete":
            in_flight.pop(event["batch"])
    assert {"a", "b"} <= overlapped
    # Two sampling entries of one request are at least K schedule() calls apart.
    last: dict[str, int] = {}
    gaps: list[int] = []
    for index, entries in enumerate(schedule_calls(events)):
        for entry in entries:
            if entry["samples"]:
                if entry["req"] in last:
                    gaps.append(index - last[entry["req"]])
                last[entry["req"]] = index
    assert gaps and min(gaps) >= stages and stages in gaps
    # max_tokens: c (2 tokens) never has more than 2 outputs + placeholders.
    outputs = {"c": 0}
    for event in events:
        if event["ev"] == "complete":
            outputs["c"] += len(event["tokens"].get("c", ())) if "c" not in event.get("dropped", ()) else 0
        if event["ev"] == "schedule":
            for entry in event["entries"]:
                if entry["req"] == "c":
                    assert outputs["c"] + entry["placeholders"] <= 2


@pytest.mark.vllm
def test_recording_changes_nothing_vllm_s_plain_async_scheduler_runs_the_same(replay: ReplayWorker):
    recorded = replay.replay(WORKLOAD, scheduler_cls=ASYNC_RECORDER)
    plain = replay.replay(WORKLOAD, recorder=False)
    assert plain["scheduler_cls"] == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    for key in ("batches", "outputs", "ending", "engine_steps", "batch_queue_depth"):
        assert recorded[key] == plain[key], key


@pytest.mark.vllm
def test_each_recorder_refuses_the_other_engine(replay: ReplayWorker):
    with pytest.raises(ReplayError, match="records vLLM's synchronous Scheduler, but this engine runs with async"):
        replay.replay(WORKLOAD)                            # the default recorder: sync
    sync = {**WORKLOAD, "config": {**WORKLOAD["config"], "async_scheduling": False}}
    with pytest.raises(ReplayError, match="records vLLM's AsyncScheduler, but this engine runs synchronous"):
        replay.replay(sync, scheduler_cls=ASYNC_RECORDER)


def test_the_async_reference_profile_serves_vllm_0_33_0_with_async_scheduling():
    assert profile_for(VERSION, async_scheduling=True) == "vllm-0.33-async"
    with pytest.raises(ValueError):
        profile_for("0.8.5", async_scheduling=True)


def compare_async(running: Workers, raw: dict[str, Any], tmp: Path) -> Any:
    trace = tmp / f"{raw['name']}.jsonl"
    result = running[VERSION].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
    return result, compare_workload(raw, result, read_trace(trace), profile_for(VERSION, True))[0]


@pytest.mark.vllm
def test_the_async_reference_equals_vllm_s_async_scheduler_batch_for_batch(
        running: Workers, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("differential-async")
    running[VERSION]                              # start the worker outside Hypothesis' clock
    seen = {"identical": 0, "placeholders_above_one": 0}

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        raw = with_async_scheduling(generate_workload(HypothesisPicker(data), "hypothesis-async",
                                                      data.draw(st.integers(0, 10**6))))
        note(json.dumps(raw))
        result, comparison = compare_async(running, raw, tmp)
        assert comparison.equal, comparison.describe()
        seen["identical"] += 1
        category, detail = verdict(result, check_verdict(tmp / f"{raw['name']}.jsonl"))
        assert category == "accepted, correct run", detail
        seen["placeholders_above_one"] += any(
            entry[6] > 1 for item in decisions(read_trace(tmp / f"{raw['name']}.jsonl"))
            if item[0] == "schedule" for entry in item[1])

    check()
    assert seen["identical"] > 0 and seen["placeholders_above_one"] > 0, seen


@pytest.mark.vllm
def test_the_sync_reference_is_told_apart_from_vllm_s_async_scheduler(running: Workers, tmp_path: Path):
    """The comparison can fail: the sync profile on the same async runs
    differs from vLLM's AsyncScheduler (placeholders left out of the
    comparison, so the batches themselves differ)."""
    for raw in [with_async_scheduling(w) for w in campaign_workloads(1, 3)]:
        trace = tmp_path / f"{raw['name']}.jsonl"
        running[VERSION].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
        strip = lambda items: [(i[0], tuple(e[:6] for e in i[1]), i[2]) if i[0] == "schedule" else i
                               for i in items]
        theirs = strip(decisions(read_trace(trace)))
        assert theirs == strip(decisions(run_reference(raw, "vllm-0.33-async").events, block_offset=1))
        assert theirs != strip(decisions(run_reference(raw, "vllm-0.33").events, block_offset=1))


@pytest.mark.vllm
def test_the_cli_replays_with_async_scheduling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                running: Workers):
    running[VERSION]
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({**WORKLOAD, "config": {**WORKLOAD["config"], "async_scheduling": False}}))
    trace = tmp_path / "t.jsonl"
    assert main(["vllm", "replay", str(workload), "--vllm-version", VERSION, "--async",
                 "--trace", str(trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workloads"][0]["async_scheduling"] and report["workloads"][0]["batch_queue_depth"] == 3
    assert read_trace(trace)[0]["async_scheduling"] is True
    assert main(["vllm", "replay", str(workload), "--async"]) == 2       # 0.8.5 has no AsyncScheduler


NAMED = json.loads((DATA / "workloads-0.33.json").read_text())
REUSE = ("id-reuse-wrong-binding", "id-reuse-hang", "id-reuse-assertion")


@pytest.mark.vllm
@pytest.mark.parametrize("raw", NAMED, ids=[w["name"] for w in NAMED])
def test_the_named_0_33_workloads_under_async_scheduling_with_vllm_s_own_placeholders(
        running: Workers, raw: dict[str, Any], tmp_path: Path):
    """Ground truth from AsyncScheduler's state: with fresh ids its
    placeholders keep their invariants and the reference equals vLLM; with a
    reused id the old request's token settles a placeholder of the new one
    (none of whose sampling entries had returned), and the difference is the
    named id-reuse deviation."""
    result, comparison = compare_async(running, with_async_scheduling(raw), tmp_path)
    breaches = result["ground_truth"]["placeholder_mismatches"]
    if raw["name"] in REUSE:
        assert comparison.explained and comparison.deviation == "reused_id_output_dropped", comparison.describe()
        assert [b["rule"] for b in breaches] == ["placeholders = sampling entries in flight"]
    else:
        assert comparison.equal, comparison.describe()
        assert breaches == [] and findings(result) == [] and result["ending"] == "done"


# -- each async rule is pinned by vLLM: the reference with one rule broken ------------------

def _guard_off_by_one(scheduler: Any, request: Any) -> bool:
    placeholders = request.num_output_placeholders
    if placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                             > request.num_prompt_tokens + request.max_tokens):
        return True
    return scheduler.current_step < request.next_decode_eligible_step


def _stagger_ignored(scheduler: Any, request: Any) -> bool:
    placeholders = request.num_output_placeholders
    return placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens)


def _placeholders_kept_on_preemption(scheduler: Any, request: Any) -> None:
    kept = request.num_output_placeholders
    Scheduler._mark_stale(scheduler, request)
    request.num_output_placeholders = kept


BROKEN_RULES: dict[str, list[tuple[Any, str, Any]]] = {
    "max_tokens guard off by one": [(Scheduler, "_is_async_skipped", _guard_off_by_one)],
    "decode stagger ignored": [(Scheduler, "_is_async_skipped", _stagger_ignored)],
    "placeholders not reset on preemption": [(Scheduler, "_mark_stale", _placeholders_kept_on_preemption)],
    "no block caching of settled tokens at update": [(KVCacheManager, "cache_blocks", lambda *_: None)],
    "batch queue K deep, not K + 1": [
        (SchedulerConfig, "batch_queue_depth", property(lambda config: config.num_pipeline_stages))],
}


@pytest.mark.vllm
def test_vllm_tells_the_reference_apart_when_any_one_async_rule_is_broken(
        running: Workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Seed 1's first 20 workloads with async scheduling: the reference equals
    vLLM's AsyncScheduler on all of them, and with any one of its async rules
    broken it differs on at least one (measured on all 300 of seed 1: guard
    off by one 258, stagger ignored 297, placeholders kept on preemption 13,
    no caching at update 33, queue K deep 299)."""
    workloads = [with_async_scheduling(raw) for raw in campaign_workloads(1, 20)]
    theirs = []
    for raw in workloads:
        trace = tmp_path / f"{raw['name']}.jsonl"
        running[VERSION].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER)
        theirs.append(decisions(read_trace(trace)))

    def differing() -> list[str]:
        return [raw["name"] for raw, vllm in zip(workloads, theirs)
                if decisions(run_reference(raw, "vllm-0.33-async").events, block_offset=1) != vllm]

    assert differing() == []
    for rule, patches in BROKEN_RULES.items():
        with monkeypatch.context() as patch:
            for owner, name, value in patches:
                patch.setattr(owner, name, value)
            assert differing(), f"{rule}: vLLM does not tell it apart"


@pytest.mark.vllm
def test_check_trace_agrees_with_vllm_s_state_on_async_runs_with_reused_ids(
        running: Workers, tmp_path_factory: pytest.TempPathFactory):
    """With request ids reused after an abort, vLLM 0.33's AsyncScheduler
    binds an old batch's output to the new request (the id-reuse bug) on some
    runs: check-trace rejects exactly those (vLLM's state is the ground
    truth) and accepts the others."""
    tmp = tmp_path_factory.mktemp("check-async-reuse")
    running[VERSION]
    seen: dict[str, int] = {}

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        raw = with_async_scheduling(generate_workload(HypothesisPicker(data), "hypothesis-async-reuse",
                                                      data.draw(st.integers(0, 10**6)), reuse_ids=True))
        note(json.dumps(raw))
        result, _ = compare_async(running, raw, tmp)
        category, detail = verdict(result, check_verdict(tmp / f"{raw['name']}.jsonl"))
        assert category in ("accepted, correct run", "rejected, real bug"), detail
        seen[category] = seen.get(category, 0) + 1

    check()
    assert seen.get("accepted, correct run", 0) > 0, seen


"""The priority policy across the bridge (docs/request-states.md,
"Priority scheduling"): the workload keys, the campaign's feature, the
reference's hand-back and victim order on a workload of #23347's shape and
of #49097's (its trace legal for the spec's `vllm-0.34` profile), and, with
vLLM's venvs, the same workloads on vLLM 0.33.0 and 0.34.0, sync and async:
decisions equal to the reference's and check-trace's verdict legal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flightcheck.reference.priority as reference_priority
from flightcheck.verification.traces.check import check_trace
from flightcheck.vllm.differential import decisions, read_trace, run_reference
from flightcheck.vllm.features import features_of
from flightcheck.vllm.generate import RandomPicker
from flightcheck.vllm.priority_workload import FEATURE
from flightcheck.vllm.workload import WorkloadError, workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")

# #23347's shape: r0 (priority 1) is admitted first with a prompt of two
# chunks; r1 (priority 0) joins it beside its second chunk, so the two run in
# the same batches, r0 first. The pool of 4 blocks fills; when r1 needs a
# block, r0 (scheduled before it in the same call) is the victim and is
# handed back.
VICTIM_SCHEDULED = {
    "name": "priority-victim-scheduled", "seed": 7, "max_steps": 200,
    "config": {"num_stages": 2, "max_num_batched_tokens": 4, "max_num_seqs": 2, "block_size": 2,
               "num_blocks": 5, "max_model_len": 8, "prefix_caching": False, "policy": "priority"},
    "requests": [{"id": "r0", "prompt_len": 5, "max_tokens": 3, "arrival_step": 0, "priority": 1},
                 {"id": "r1", "prompt_len": 2, "max_tokens": 3, "arrival_step": 1, "priority": 0}],
}
# #49097's shape: r0 (priority 1), in flight and skipped, is the victim of
# r1 behind it; r2 behind r1 must still be scheduled in the same call.
VICTIM_SKIPPED = {
    "name": "priority-victim-skipped", "seed": 7, "max_steps": 200,
    "config": {"num_stages": 2, "max_num_batched_tokens": 4, "max_num_seqs": 3, "block_size": 2,
               "num_blocks": 5, "max_model_len": 6, "prefix_caching": False, "policy": "priority"},
    "requests": [{"id": "r0", "prompt_len": 2, "max_tokens": 3, "arrival_step": 0, "priority": 1},
                 {"id": "r1", "prompt_len": 1, "max_tokens": 3, "arrival_step": 1, "priority": 0},
                 {"id": "r2", "prompt_len": 1, "max_tokens": 3, "arrival_step": 1, "priority": 0}],
}


def _preempted(events: list[dict[str, Any]]) -> list[list[str]]:
    return [e["preempted"] for e in events if e["ev"] == "schedule" and e.get("preempted")]


def test_the_workload_keys_are_read_and_checked():
    workload = workload_from_json(VICTIM_SCHEDULED)
    assert workload.config.policy == "priority"
    assert [s.priority for s in workload.requests] == [1, 0]
    assert workload_from_json({**VICTIM_SCHEDULED, "config": {**VICTIM_SCHEDULED["config"], "policy": "fcfs"}}
                              ).config.policy == "fcfs"
    with pytest.raises(WorkloadError, match="config.policy"):
        workload_from_json({**VICTIM_SCHEDULED, "config": {**VICTIM_SCHEDULED["config"], "policy": "lifo"}})
    bad = {**VICTIM_SCHEDULED, "requests": [{**VICTIM_SCHEDULED["requests"][0], "priority": "high"}]}
    with pytest.raises(WorkloadError, match=r"requests\[0\]\.priority"):
        workload_from_json(bad)


def test_the_feature_sets_the_policy_and_priorities_and_keeps_a_connectors_pool():
    assert FEATURE.name in {f.name for f in features_of("0.34.0")} and FEATURE.name in {f.name for f in features_of("0.33.0")}
    assert FEATURE.name not in {f.name for f in features_of("0.8.5")}
    raw = json.loads(json.dumps(VICTIM_SKIPPED))
    del raw["config"]["policy"]
    FEATURE.apply(RandomPicker(3), raw)
    assert raw["config"]["policy"] == "priority" and all(0 <= r["priority"] <= 2 for r in raw["requests"])
    workload_from_json(raw)
    # with a KV connector (the pair meets: docs/request-states.md, "Features together"):
    # the policy and priorities, the connector's pool and seats left as they are
    config = {"num_stages": 2, "kv_connector": {}, "max_model_len": 32, "block_size": 4, "num_blocks": 40,
              "max_num_seqs": 1}
    for seed in range(8):
        with_connector = {**raw, "config": dict(config), "requests": [{}, {}]}
        FEATURE.apply(RandomPicker(seed), with_connector)
        assert with_connector["config"] == {**config, "policy": "priority"}
        assert all(0 <= r["priority"] <= 2 for r in with_connector["requests"])


def test_the_reference_hands_a_victim_scheduled_in_the_same_call_back(monkeypatch, tmp_path: Path):
    handed_back: list[str] = []
    original = reference_priority.PriorityPolicy._hand_back
    monkeypatch.setattr(reference_priority.PriorityPolicy, "_hand_back",
                        lambda self, batch, victim: (handed_back.append(victim.request_id),
                                                     original(self, batch, victim)))
    run = run_reference(VICTIM_SCHEDULED, "vllm-0.34")
    assert run.ending == "done"
    assert handed_back and set(handed_back) == {"r0"}
    assert ["r0"] in _preempted(run.events)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in run.events))
    verdict = check_trace(trace).to_json()
    assert verdict["ok"], verdict


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
@pytest.mark.parametrize("raw", [VICTIM_SCHEDULED, VICTIM_SKIPPED], ids=lambda w: w["name"])
def test_the_references_priority_traces_are_legal_for_the_spec(raw, profile, tmp_path: Path):
    run = run_reference(raw if "async" not in profile else
                        {**raw, "config": {**raw["config"], "async_scheduling": True}}, profile)
    assert run.ending == "done" and _preempted(run.events) == [["r0"]]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in run.events))
    verdict = check_trace(trace).to_json()
    assert verdict["ok"], verdict


# --- against vLLM's real scheduler (its venvs: FLIGHTCHECK_SKIP_VLLM=1 skips)


@pytest.fixture(scope="module")
def running() -> Iterator[Any]:
    from .vllm_support import workers
    yield from workers()


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("raw", [VICTIM_SCHEDULED, VICTIM_SKIPPED], ids=lambda w: w["name"])
def test_vllm_agrees_with_the_reference_and_check_trace_accepts_it(running, raw, version, async_scheduling,
                                                                    tmp_path: Path):
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.replay import findings
    raw = {**raw, "config": {**raw["config"], "async_scheduling": async_scheduling}}
    trace = tmp_path / "trace.jsonl"
    result = running[version].replay(raw, trace=str(trace), scheduler_cls=ASYNC_RECORDER if async_scheduling else None)
    assert result["ending"] == "done" and not findings(result), result
    events = read_trace(trace)
    profile = f"vllm-{version.rsplit('.', 1)[0]}" + ("-async" if async_scheduling else "")
    reference = run_reference(raw, profile).events
    assert decisions(events) == decisions(reference, block_offset=1)
    assert _preempted(events) == _preempted(reference) == [["r0"]]
    verdict = check_trace(trace).to_json()
    assert verdict["ok"], verdict

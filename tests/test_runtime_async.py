"""Asynchronous scheduling for real (the reference's `vllm-0.33-async`
profile: output placeholders, a K + 1 deep batch queue, decodes K schedule()
calls apart) over the runtime with sampled-token feedback: the scheduler
places a request's next decode before its previous token exists, and stage
0 takes that token from the last stage when the batch reaches it.

Float64 greedy outputs: async (PP = 2 and 3, real stage processes) equal
sync scheduling on the same pipeline (`vllm-0.33`), PP = 1, and a dense
full-recompute decode, token for token. The traces show it is asynchronous:
a request's sampling entry is scheduled while its previous one is still in
flight (never under sync).

The workload is small (8 requests, the tiny preset) with an EOS the model
emits, aborts while a batch is in flight, and a pool that preempts.
The sync runs' traces pass check-trace under `vllm-0.33`; check-trace of
async traces is the checker's work, not tested here.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flightcheck.reference import SchedulerConfig
from flightcheck.runtime import (LocalExecutor, PipelineExecutor, RunFailed, RuntimeTraceWriter,
                                 StageSpec, WeightSource, generate)
from flightcheck.runtime.workload import mixed_workload
from flightcheck.verification.traces.check import check_trace

from .fixtures import dense_oracle

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

torch.set_num_threads(1)

SOURCE = WeightSource(seed=1)
WORKLOAD = mixed_workload(2, 8, abort_fraction=0.25, max_tokens=(4, 12))
POOL = dict(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=96, block_size=4,
            num_blocks=28)
SYNC, ASYNC = "vllm-0.33", "vllm-0.33-async"


@pytest.fixture(scope="module")
def oracle() -> tuple[int, dict[str, list[int]]]:
    """An EOS id the model emits (so some requests stop) and the dense greedy outputs."""
    return dense_oracle(SOURCE, WORKLOAD, POOL["max_model_len"])


def run(executor, tmp_path, k: int, profile: str, eos: int):
    cfg = SchedulerConfig(num_pipeline_stages=k, profile=profile, **POOL)
    path = tmp_path / f"{profile}-pp{k}.jsonl"
    executor.reset()
    with open(path, "w") as sink:
        result = generate(executor, cfg, WORKLOAD, eos_token_id=eos,
                          trace=RuntimeTraceWriter(sink, eos_token_id=eos))
    # The trace names its profile (the checker selects it by the `profile`
    # key); under async it notes every empty batch, which the stagger counts.
    check = check_trace(path)
    assert check.ok and check.profile == profile, (check.profile, check.property, check.message)
    return result, [json.loads(line) for line in open(path)]


def assert_matches(result, expected: dict[str, list[int]]) -> None:
    for r in result.requests:
        want = expected[r.req_id]
        if r.finish_reason == "abort":
            assert list(r.output_token_ids) == want[:len(r.output_token_ids)], r.req_id
        else:
            assert list(r.output_token_ids) == want, r.req_id


def assert_same_outputs(*results) -> None:
    """Token for token, request by request; an aborted request (its abort
    lands when a batch of it is in flight, which depends on the schedule)
    only as a prefix of the other runs' output."""
    for runs in zip(*(r.requests for r in results)):
        finished = [list(r.output_token_ids) for r in runs if r.finish_reason != "abort"]
        assert all(out == finished[0] for out in finished), runs[0].req_id
        longest = max((list(r.output_token_ids) for r in runs), key=len)
        for r in runs:
            assert list(r.output_token_ids) == longest[:len(r.output_token_ids)], r.req_id


def decodes_scheduled_while_previous_in_flight(events: list[dict]) -> int:
    """Pairs of consecutive sampling entries of one request whose later
    batch was scheduled before the earlier batch completed."""
    scheduled_at: dict[int, int] = {}
    completed_at: dict[int, int] = {}
    sampling: dict[str, list[int]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        if e["ev"] == "schedule" and e["batch"] is not None:
            scheduled_at[e["batch"]] = i
            for entry in e["entries"]:
                if entry["samples"]:
                    sampling[entry["req"]].append(e["batch"])
        elif e["ev"] == "complete":
            completed_at[e["batch"]] = i
    return sum(1 for batches in sampling.values() for a, b in zip(batches, batches[1:])
               if scheduled_at[b] < completed_at.get(a, len(events)))


def features(events: list[dict]) -> dict[str, int]:
    depth = max_depth = 0
    for e in events:
        if e["ev"] == "schedule" and e["batch"] is not None:
            depth += 1
            max_depth = max(max_depth, depth)
        elif e["ev"] == "complete":
            depth -= 1
    return {
        "overlapping_decodes": decodes_scheduled_while_previous_in_flight(events),
        "max_in_flight": max_depth,
        "preemptions": sum(len(e["preempted"]) for e in events if e["ev"] == "schedule"),
        "stops": sum(1 for e in events if e["ev"] == "finish" and e["reason"] == "stop"),
        "dropped": sum(len(e.get("dropped", [])) for e in events if e["ev"] == "complete"),
        "placeholders": sum(1 for e in events if e["ev"] == "schedule"
                            for x in e["entries"] if x.get("placeholders", 0) > 1),
    }


def test_async_scheduling_needs_the_feedback(oracle):
    """With or without drafts (drafts under async: test_runtime_async_drafts.py)."""
    eos, _ = oracle
    snapshot_only = LocalExecutor(SOURCE, 2, POOL["num_blocks"], POOL["block_size"],
                                  dtype=torch.float64, num_spec_tokens=2)
    for num_spec_tokens in (0, 2):
        with pytest.raises(ValueError, match="feedback=True"):
            generate(snapshot_only, SchedulerConfig(num_pipeline_stages=2, profile=ASYNC,
                                                    num_spec_tokens=num_spec_tokens, **POOL),
                     WORKLOAD, eos_token_id=eos)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_in_process_async_equals_sync_and_the_dense_decode(oracle, tmp_path, k):
    """All stages in this process (tokens through the in-process channel)."""
    eos, expected = oracle
    executor = LocalExecutor(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                             dtype=torch.float64, feedback=True)
    sync, sync_events = run(executor, tmp_path, k, SYNC, eos)
    asynchronous, async_events = run(executor, tmp_path, k, ASYNC, eos)
    assert_same_outputs(asynchronous, sync)
    assert_matches(asynchronous, expected)
    f = features(async_events)
    assert f["overlapping_decodes"] > 0 and f["placeholders"] > 0, f
    assert f["max_in_flight"] <= k + 1 and f["stops"] > 0 and f["dropped"] > 0, f
    assert features(sync_events)["overlapping_decodes"] == 0
    if k > 1:
        assert f["preemptions"] > 0, f
        assert executor.inbox is not None and executor.inbox.num_dropped > 0


@pytest.mark.parametrize("k", [2, 3])
def test_async_pipeline_equals_sync_and_pp1_token_for_token(oracle, tmp_path, k):
    """Real stage processes (tokens over gloo from the last stage's process
    to stage 0's): async ≡ sync on the same pipeline ≡ PP = 1 ≡ dense, and
    the async trace has K + 1 batches in flight and decodes of one request
    scheduled while the previous one is in the pipeline."""
    eos, expected = oracle
    single = LocalExecutor(SOURCE, 1, POOL["num_blocks"], POOL["block_size"],
                           dtype=torch.float64, feedback=True)
    pp1, _ = run(single, tmp_path, 1, ASYNC, eos)
    with PipelineExecutor.spawn(StageSpec(SOURCE, k, POOL["num_blocks"], POOL["block_size"],
                                          "float64", feedback=True)) as executor:
        sync, sync_events = run(executor, tmp_path, k, SYNC, eos)
        asynchronous, async_events = run(executor, tmp_path, k, ASYNC, eos)
    assert_same_outputs(asynchronous, sync, pp1)
    assert_matches(asynchronous, expected)
    f = features(async_events)
    assert f["overlapping_decodes"] > 0 and f["max_in_flight"] == k + 1, f
    assert f["preemptions"] > 0 and f["stops"] > 0, f
    assert features(sync_events)["overlapping_decodes"] == 0


def test_killing_the_last_stage_while_stage_0_waits_for_its_tokens_names_it_and_reaps_all(
        tmp_path):
    """Async scheduling, PP = 2: stage 0 blocks on tokens only the last stage
    sends. Killing the last stage mid-run fails the run within seconds,
    naming the killed stage (not stage 0, whose feedback receive broke), and
    every process is reaped."""
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_model_len=128,
                          block_size=4, num_blocks=64, num_pipeline_stages=2, profile=ASYNC)
    workload = mixed_workload(4, 12, max_tokens=(30, 40))
    executor = PipelineExecutor.spawn(StageSpec(WeightSource(seed=2), 2, 64, 4, "float32",
                                                feedback=True))
    victim = executor.processes[-1]
    killed_at: list[float] = []

    def progress(done: int, total: int, tokens: int) -> None:
        if tokens >= 20 and not killed_at:
            os.kill(victim.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

    try:
        with pytest.raises(RunFailed) as info:
            generate(executor, cfg, workload, progress=progress)
        detected = time.monotonic() - killed_at[0]
    finally:
        executor.close()
    assert detected < 10.0, detected
    assert f"stage 1 (pid {victim.pid}) was killed by SIGKILL" in str(info.value), info.value
    assert all(p.exitcode is not None for p in executor.processes)
    Path(executor.log_path).unlink()                  # kept after a failure, for the user

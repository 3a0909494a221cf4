"""The reference writes traces in the trace format of docs/trace-format.md."""

from __future__ import annotations

import io
import json

from flightcheck.reference import (Engine, Request, SamplingParams, Scheduler, SchedulerConfig,
                                   ScriptedExecutor, TraceWriter, make_scheduler)


def traced_engine(cfg: SchedulerConfig) -> tuple[Engine, io.StringIO]:
    sink = io.StringIO()
    return Engine(make_scheduler(cfg, TraceWriter(sink)), ScriptedExecutor()), sink


def events(sink: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in sink.getvalue().splitlines()]


def test_trace_is_off_by_default():
    scheduler = make_scheduler(SchedulerConfig())
    assert type(scheduler) is Scheduler and not hasattr(scheduler, "trace")


def test_concurrent_batches_trace_records_every_event_in_order():
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=2, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=2,
                          enable_prefix_caching=False)
    engine, sink = traced_engine(cfg)
    engine.add_request(Request("0", list(range(12)), SamplingParams(max_tokens=2)))
    engine.add_request(Request("1", list(range(100, 112)), SamplingParams(max_tokens=2)))
    engine.run()
    engine.scheduler.trace.end()
    evs = events(sink)
    assert evs[0] == {
        "ev": "config", "num_stages": 2, "max_num_batched_tokens": 10, "max_num_seqs": 2,
        "block_size": 16, "num_blocks": 16, "max_model_len": 64,
        "long_prefill_token_threshold": 0, "num_spec_tokens": 0, "prefix_caching": False,
        "policy": "continue-prefill", "profile": "vllm-0.8.5", "num_preallocate_tokens": 0, "release_order": "forward",
        "writer": "flightcheck.reference"}
    assert evs[1]["ev"] == "arrive" and evs[1]["prompt_len"] == 12 and evs[1]["max_tokens"] == 2
    assert evs[1]["prompt_token_ids"] == list(range(12))
    assert evs[3] == {"ev": "schedule", "batch": 1, "step": 1, "preempted": [], "entries": [
        {"req": "0", "start": 0, "n": 10, "cached": 0, "drafts": 0, "samples": False,
         "block_ids": [0]}]}
    assert evs[4]["entries"] == [
        {"req": "0", "start": 10, "n": 2, "cached": 0, "drafts": 0, "samples": True, "block_ids": []},
        {"req": "1", "start": 0, "n": 8, "cached": 0, "drafts": 0, "samples": False, "block_ids": [1]}]
    assert evs[5] == {"ev": "complete", "batch": 1, "step": 3, "tokens": {"0": []}}
    kinds = [e["ev"] for e in evs]
    assert kinds.count("finish") == 2 and kinds[-1] == "end"
    assert {e["reason"] for e in evs if e["ev"] == "finish"} == {"length"}
    steps = [e["step"] for e in evs if "step" in e]
    assert steps == sorted(steps)
    # Every finish follows the complete that caused it.
    for i, e in enumerate(evs):
        if e["ev"] == "finish":
            assert evs[i - 1]["ev"] in ("complete", "finish")


def test_trace_records_preemption_orphaned_tokens_aborts_and_drops():
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=160,
                          block_size=16, num_blocks=10, num_pipeline_stages=2)
    engine, sink = traced_engine(cfg)
    engine.add_request(Request("0", list(range(80)), SamplingParams(max_tokens=3)))
    engine.step()
    engine.add_request(Request("1", list(range(1000, 1080)), SamplingParams(max_tokens=3)))
    engine.step()                       # B2: r1
    engine.step()                       # B1 completes: r0's first token
    engine.step()                       # B3: r0 decode, r1 preempted while in flight
    engine.step()                       # B2 completes: orphaned, token kept
    engine.abort_request("0")           # r0's decode batch B3 still in flight
    engine.complete_oldest_step()       # B3 completes: dropped
    evs = events(sink)
    (pre,) = [e for e in evs if e["ev"] == "schedule" and e["preempted"]]
    assert pre["batch"] == 3 and pre["preempted"] == ["1"]
    assert pre["entries"][0]["block_ids"] == [9]      # r1's freed tail block, reused
    complete2 = next(e for e in evs if e["ev"] == "complete" and e["batch"] == 2)
    assert complete2["tokens"] == {"1": [1080]} and "dropped" not in complete2
    assert [e["req"] for e in evs if e["ev"] == "abort"] == ["0"]
    complete3 = next(e for e in evs if e["ev"] == "complete" and e["batch"] == 3)
    assert complete3["dropped"] == ["0"]


def test_admission_with_a_prefix_hit_records_it_as_cached_and_in_start():
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_pipeline_stages=1)
    engine, sink = traced_engine(cfg)
    engine.add_request(Request("a", list(range(10)), SamplingParams(max_tokens=1)))
    engine.run()
    engine.add_request(Request("b", list(range(10)), SamplingParams(max_tokens=1)))
    engine.run()
    sched_b = [e for e in events(sink) if e["ev"] == "schedule"][-1]
    assert sched_b["entries"] == [{"req": "b", "start": 8, "n": 2, "cached": 8, "drafts": 0,
                                   "samples": True, "block_ids": [0, 1, 3]}]   # hits first


def test_trace_of_drafts_records_scheduled_and_proposed_drafts():
    from flightcheck.reference import Sample
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_spec_tokens=2)
    sink = io.StringIO()
    engine = Engine(make_scheduler(cfg, TraceWriter(sink)),
                    ScriptedExecutor(lambda r, n, d: Sample(7, len(d), (8, 9))))
    engine.add_request(Request("a", list(range(5)), SamplingParams(max_tokens=4)))
    engine.run()
    evs = events(sink)
    assert [e["next_drafts"] for e in evs if e["ev"] == "complete" and "next_drafts" in e][0] == {"a": 2}
    assert [e["entries"][0]["drafts"] for e in evs if e["ev"] == "schedule"] == [0, 2]

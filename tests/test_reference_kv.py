"""The reference's KV connector (reference/connector.py, kv_transfer.py,
kv_waiting.py; docs/kv-connector.md), one behaviour per test on a tiny
scenario, then random runs under every profile with a connector checking
the scheduler's self-consistency, the step fence and that nothing leaks.
Replay workloads with a connector: tests/test_reference_kv_replay.py."""

from __future__ import annotations

import io
import json
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from flightcheck.reference import ModelRunnerOutput, Request, RequestStatus, SamplingParams, SchedulerConfig, TraceWriter
from flightcheck.reference.connector import KvConnectorConfig, KvOffer
from flightcheck.reference.consistency import consistency_errors, leak_errors
from flightcheck.reference.profiles import PROFILES
from flightcheck.reference.request import KvLoad
from flightcheck.reference.trace import TracingScheduler

PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS
KV_PROFILES = ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")


@dataclass
class Run:
    """A traced scheduler driven like vLLM 0.33's engine: every schedule()
    is queued (empty ones too), the oldest completes when the queue is
    full or nothing is left to schedule; sampling entries return token 7."""
    scheduler: TracingScheduler
    sink: io.StringIO
    queue: deque = field(default_factory=deque)

    @property
    def depth(self) -> int:
        return self.scheduler.config.batch_queue_depth

    def schedule(self) -> Any:
        output = self.scheduler.schedule()
        self.queue.append(output)
        assert not consistency_errors(self.scheduler)
        return output

    def complete(self) -> Any:
        output = self.queue.popleft()
        tokens = {e.req_id: [7] if e.samples else [] for e in output.entries}
        self.scheduler.update_from_output(output, ModelRunnerOutput.from_tokens(tokens))
        assert not consistency_errors(self.scheduler)
        return output

    def step(self) -> None:
        if len(self.queue) < self.depth and self.scheduler.has_requests():
            self.schedule()
            if len(self.queue) < self.depth:
                return
        if self.queue:
            self.complete()

    def run_to_end(self, limit: int = 300) -> None:
        for _ in range(limit):
            if not self.scheduler.has_requests() and not self.queue:
                assert not leak_errors(self.scheduler)
                return
            self.step()
        raise AssertionError("the run did not end")

    def events(self, ev: str | None = None) -> list[dict[str, Any]]:
        events = [json.loads(line) for line in self.sink.getvalue().splitlines()]
        return [e for e in events if ev is None or e["ev"] == ev]


def make_run(profile: str = "vllm-0.33", stages: int = 1, connector: KvConnectorConfig | None = None,
             **knobs: Any) -> Run:
    settings: dict[str, Any] = dict(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32, block_size=4,
                                    num_blocks=24, enable_prefix_caching=True, num_pipeline_stages=stages,
                                    profile=profile, kv_connector=connector or KvConnectorConfig())
    settings.update(knobs)
    sink = io.StringIO()
    return Run(TracingScheduler(SchedulerConfig(**settings), TraceWriter(sink, eos_token_id=2)), sink)


def add(run: Run, name: str, num_prompt: int = 16, offer: KvOffer | None = None, max_tokens: int = 3,
        first: int | None = None) -> Request:
    first = 100 * (len(run.scheduler.requests) + 1) if first is None else first
    request = Request(name, list(range(first, first + num_prompt)), SamplingParams(max_tokens=max_tokens),
                      eos_token_id=2)
    request.kv_offer = offer
    run.scheduler.add_request(request)
    return request


def entries(output: Any) -> list[tuple[str, int, int, int]]:
    return [(e.req_id, e.num_computed_tokens, e.num_new_tokens, e.external) for e in output.entries]


# -- the version table ---------------------------------------------------------

KV_RULES = ("kv_async_loads", "kv_load_failures", "kv_send_after_finish", "kv_aborted_load_held",
            "kv_step_fence", "kv_holding_first", "kv_load_reservation", "kv_producer_drops_stale")


def test_each_version_has_the_connector_rules_the_design_table_gives():
    for old in ("vllm-0.8.5", "vllm-0.8.4"):
        assert not any(getattr(PROFILES[old], rule) for rule in KV_RULES + ("kv_async_waiting_queue",))
    for name in ("vllm-0.33", "vllm-0.33-async"):
        assert all(getattr(PROFILES[name], rule) for rule in KV_RULES)
        assert not PROFILES[name].kv_async_waiting_queue
    for name in ("vllm-0.34", "vllm-0.34-async"):
        assert all(getattr(PROFILES[name], rule) for rule in KV_RULES)
        assert PROFILES[name].kv_async_waiting_queue


# -- sync and async hits ---------------------------------------------------------

def test_a_sync_hit_is_computed_at_schedule_time_and_loaded_by_the_batch():
    run = make_run()
    add(run, "a", 16, KvOffer(hit=8))
    assert entries(run.schedule()) == [("a", 8, 8, 8)]
    assert run.scheduler.requests["a"].num_computed_tokens == 16
    schedule = run.events("schedule")[0]["entries"][0]
    assert (schedule["start"], schedule["cached"], schedule["external"]) == (8, 8, 8)


def test_a_sync_hit_leaves_the_last_token_to_compute_and_an_async_one_may_cover_all():
    run = make_run()
    add(run, "a", 8, KvOffer(hit=16))
    assert entries(run.schedule()) == [("a", 4, 4, 4)]     # 7 tokens, cut to whole blocks
    run = make_run()
    b = add(run, "b", 8, KvOffer(hit=16, load_async=True))
    assert entries(run.schedule()) == [] and b.num_computed_tokens == 8 and b.status == PARKED
    run.complete()
    assert entries(run.schedule()) == [("b", 7, 1, 0)]   # promoted: the last token is recomputed


def test_an_async_load_parks_until_reported_load_steps_outputs_later():
    run = make_run(stages=2)
    a = add(run, "a", 16, KvOffer(hit=8, load_async=True, load_steps=3))
    output = run.schedule()
    assert output.kv_loads == [("a", 8)] and a.status == PARKED and a.kv_load is KvLoad.IN_FLIGHT
    assert run.events("schedule")[0]["kv_loads"] == [{"req": "a", "start": 8}]
    for _ in range(2):
        run.schedule()
        run.complete()
        assert a.status == PARKED and not run.queue[-1].entries
    run.schedule()
    run.complete()                            # the third output brings finished_recving
    assert a.kv_load is KvLoad.RECEIVED and run.events("kv_received")
    assert entries(run.schedule()) == [("a", 8, 8, 0)]
    assert a.status == RequestStatus.RUNNING and a.kv_load is KvLoad.NONE
    run.run_to_end()


def test_the_connector_offers_a_load_once_and_nothing_after_a_preemption():
    run = make_run(num_blocks=8, max_num_batched_tokens=32)
    add(run, "b", 12, max_tokens=8)
    a = add(run, "a", 16, KvOffer(hit=8), max_tokens=8)
    assert entries(run.schedule()) == [("b", 0, 12, 0), ("a", 8, 8, 8)]
    for _ in range(10):                       # decodes until a preempts itself (no block left)
        run.complete()
        if "a" in run.schedule().preempted_req_ids:
            break
    assert a.status == RequestStatus.PREEMPTED
    run.run_to_end()
    later = [x for e in run.events("schedule")[1:] for x in e["entries"] if x["req"] == "a"]
    assert later and all(x["external"] == 0 for x in later)
    assert run.scheduler.connector.get_num_new_matched_tokens(a, 0) == (0, False)


# -- loaded requests first, 0.34's queue and limit -------------------------------

def test_a_landed_load_is_not_starved_by_a_blocked_plain_waiting_request():
    # vLLM #45388: the landed request holds its blocks; a plain waiting
    # request that cannot be admitted must not stand in front of it.
    run = make_run(num_blocks=10, max_num_batched_tokens=32)
    loaded = add(run, "loaded", 16, KvOffer(hit=16, load_async=True))
    run.schedule()
    big = add(run, "big", 28)                 # needs 7 blocks: never fits beside the load's 4
    run.complete()
    assert loaded.kv_load is KvLoad.RECEIVED
    assert entries(run.schedule()) == [("loaded", 15, 1, 0)]
    assert big.status == RequestStatus.WAITING


def test_0_34_starts_loads_only_within_the_limit_and_in_loads_only_mode():
    run = make_run("vllm-0.34", connector=KvConnectorConfig(max_inflight_loads=1), max_num_seqs=1)
    for name in "abc":
        add(run, name, 16, KvOffer(hit=8, load_async=True))
    add(run, "plain", 8)
    sched = run.scheduler
    assert [r.request_id for r in sched.waiting if sched._may_load_async(r)] == ["a", "b", "c"]
    output = run.schedule()                   # a's load starts; plain takes the one running slot
    assert output.kv_loads == [("a", 8)] and entries(output) == [("plain", 0, 8, 0)]
    run.complete()                            # a lands; it counts until it is scheduled
    assert run.schedule().kv_loads == []      # loads-only mode: b waits for the limit
    run.run_to_end()
    loads = [load["req"] for e in run.events("schedule") for load in e.get("kv_loads", [])]
    assert loads == ["a", "b", "c"]


def test_0_33_has_no_load_limit_queue():
    run = make_run("vllm-0.33", connector=KvConnectorConfig(max_inflight_loads=1))
    for name in "abc":
        add(run, name, 16, KvOffer(hit=8, load_async=True))
    assert [load for load, _ in run.schedule().kv_loads] == ["a", "b", "c"]


# -- failures --------------------------------------------------------------------

def test_a_failed_async_load_recomputes_from_zero_or_from_its_first_invalid_block():
    run = make_run()
    whole = add(run, "whole", 16, KvOffer(hit=12, load_async=True, fail_whole=True))
    part = add(run, "part", 16, KvOffer(hit=12, load_async=True, fail_from_block=2))
    run.schedule()
    run.complete()
    assert [(e["req"], e["from_block"]) for e in run.events("kv_failed")] == [("whole", 0), ("part", 2)]
    assert whole.num_computed_tokens == 0 and part.num_computed_tokens == 8
    assert entries(run.schedule()) == [("whole", 0, 16, 0)]     # its blocks released, recomputed
    run.complete()
    assert entries(run.schedule()) == [("whole", 16, 1, 0), ("part", 8, 8, 0)]
    run.run_to_end()


def test_a_failed_sync_load_rolls_back_every_counter_under_async_scheduling():
    # The correct rollback (#49250): the request recomputes from the failed
    # block, every entry of it in flight is dropped, its placeholders reset.
    run = make_run("vllm-0.33-async", stages=1)    # K + 1 = 2 batches in flight
    a = add(run, "a", 16, KvOffer(hit=12, fail_from_block=1), max_tokens=4)
    first = run.schedule()
    assert entries(first) == [("a", 12, 4, 12)]
    second = run.schedule()                   # the decode on a placeholder, in flight
    assert entries(second) == [("a", 16, 1, 0)] and a.num_output_placeholders == 2
    run.complete()                            # the first batch reports blocks 1.. invalid
    assert a.num_computed_tokens == 4 and a.num_output_placeholders == 0
    assert a.num_stale_output_tokens == a.num_in_flight_tokens == 1 and a.drop_stale_output
    assert run.events("complete")[-1]["dropped"] == ["a"]
    run.complete()                            # the decode in flight is dropped too
    assert a.num_output_tokens == 0 and a.num_stale_output_tokens == 0
    assert entries(run.schedule()) == [("a", 4, 12, 0)]
    run.run_to_end()
    assert a.num_output_tokens == 4


def test_the_fail_policy_finishes_the_request_with_an_error_and_frees_its_blocks():
    run = make_run(connector=KvConnectorConfig(load_failure_policy="fail"))
    add(run, "sync", 16, KvOffer(hit=8, fail_from_block=0))
    add(run, "async", 16, KvOffer(hit=8, load_async=True, fail_whole=True))
    run.schedule()
    run.complete()
    finishes = {e["req"]: e["reason"] for e in run.events("finish")}
    assert finishes == {"sync": "error", "async": "error"}
    assert run.events("complete")[0]["dropped"] == ["sync"]
    assert not run.scheduler.has_requests() or run.scheduler.finished_req_ids
    run.run_to_end()


# -- aborts, sends, the fence, producer preemption --------------------------------

def test_an_aborted_load_holds_its_blocks_until_its_report():
    run = make_run("vllm-0.34", connector=KvConnectorConfig(max_inflight_loads=1))
    add(run, "a", 16, KvOffer(hit=8, load_async=True, load_steps=2))
    add(run, "b", 16, KvOffer(hit=8, load_async=True))
    run.schedule()
    run.scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    sched = run.scheduler
    assert "a" in sched.kv_held and sched._aborted_kv_loads == {"a"}
    assert run.events("abort") == [{"ev": "abort", "req": "a", "step": 1, "held": True}]
    free = sched.kv_cache_manager.get_num_free_blocks()
    assert run.schedule().kv_loads == []      # the aborted load still counts against the limit
    run.complete()
    assert sched.kv_cache_manager.get_num_free_blocks() == free
    run.complete()                            # its finished_recving: the blocks go
    assert not sched.kv_held and sched.kv_cache_manager.get_num_free_blocks() == free + 2
    assert run.schedule().kv_loads == [("b", 8)]
    run.run_to_end()


def test_a_producer_holds_a_finished_request_blocks_until_the_send_reports():
    run = make_run(connector=KvConnectorConfig(consumer=False, producer=True))
    add(run, "a", 8, KvOffer(send_steps=2), max_tokens=1)
    run.schedule()
    run.complete()
    assert run.events("finish") == [{"ev": "finish", "req": "a", "reason": "length", "step": 2, "held": True}]
    sched = run.scheduler
    assert "a" in sched.kv_held and sched.has_requests() and sched.kv_cache_manager.get_num_free_blocks() == 22
    run.schedule()
    run.complete()
    assert "a" in sched.kv_held
    run.schedule()
    run.complete()
    assert run.events("kv_sent")[0]["req"] == "a" and not sched.kv_held
    assert sched.kv_cache_manager.get_num_free_blocks() == 24


def test_the_step_fence_holds_a_finished_request_blocks_until_its_batches_are_processed():
    run = make_run("vllm-0.33-async", stages=1)     # K + 1 = 2 batches in flight, a consumer
    sched = run.scheduler
    assert sched._defer_block_free
    a = add(run, "a", 8, max_tokens=1)
    run.schedule()                            # the prefill, sampling
    run.schedule()                            # skipped by the max_tokens guard: an empty batch
    run.complete()                            # a finishes while nothing of it is in flight
    assert not sched.deferred_frees
    b = add(run, "b", 8, max_tokens=2)
    run.schedule()
    run.schedule()                            # b's decode on its placeholder, in flight
    run.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert [len(blocks) for _, blocks in sched.deferred_frees] == [3]   # fenced by b's last batch
    run.complete()                            # the empty batch
    run.complete()                            # b's prefill: its decode is still in flight
    assert sched.deferred_frees
    run.complete()
    assert not sched.deferred_frees and a.is_finished()
    assert not make_run("vllm-0.33", stages=1).scheduler._defer_block_free
    assert not make_run("vllm-0.33", stages=2, connector=KvConnectorConfig(consumer=False)).scheduler._defer_block_free


def test_a_producer_preemption_drops_the_victims_in_flight_output():
    for producer in (False, True):
        run = make_run("vllm-0.33", stages=2, num_blocks=8, max_num_batched_tokens=32,
                       connector=KvConnectorConfig(producer=producer))
        add(run, "a", 12, max_tokens=8)
        b = add(run, "b", 12, max_tokens=8)
        run.schedule()
        run.complete()
        while "b" not in run.schedule().preempted_req_ids:
            run.complete()
        assert b.drop_stale_output == producer


# -- random runs ----------------------------------------------------------------

def _random_run(seed: int, profile: str) -> None:
    rng = random.Random(seed)
    bs = rng.choice([2, 4])
    connector = KvConnectorConfig(consumer=rng.random() < 0.8, producer=rng.random() < 0.5,
                                  load_failure_policy=rng.choice(["recompute", "fail"]),
                                  max_inflight_loads=rng.choice([None, 1, 2]))
    run = make_run(profile, stages=rng.choice([1, 2, 3]), connector=connector, block_size=bs,
                   max_num_batched_tokens=rng.choice([8, 16, 32]), max_num_seqs=rng.choice([1, 2, 4]),
                   num_blocks=rng.choice([16, 24, 40]) * 4 // bs, enable_prefix_caching=rng.random() < 0.7,
                   long_prefill_token_threshold=rng.choice([0, 0, 6]))
    arrivals = []
    for i in range(rng.randint(1, 6)):
        tokens = ([5] * rng.choice([0, bs, 2 * bs]) + [rng.randrange(10, 50) for _ in range(rng.randint(1, 20))])[:28]
        fail = rng.random()
        offer = KvOffer(hit=bs * rng.randint(0, 5), load_async=rng.random() < 0.6, load_steps=rng.randint(1, 3),
                        fail_from_block=rng.randint(0, 4) if fail < 0.25 else None, fail_whole=0.25 <= fail < 0.35,
                        send_steps=rng.randint(1, 3)) if rng.random() < 0.8 else None
        request = Request(str(i), tokens, SamplingParams(max_tokens=rng.randint(1, 4)), eos_token_id=2)
        request.kv_offer = offer
        arrivals.append((rng.randint(0, 8), request))
    aborts = {str(i): rng.randint(0, 15) for i in range(len(arrivals)) if rng.random() < 0.2}
    tables: dict[int, list[list[int]]] = {}
    for step in range(400):
        for _, request in [a for a in arrivals if a[0] == step]:
            run.scheduler.add_request(request)
        for req_id in [r for r, at in aborts.items() if at == step]:
            run.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
        if step > 20 and not run.scheduler.has_requests() and not run.queue:
            assert not leak_errors(run.scheduler)
            return
        if len(run.queue) < run.depth and run.scheduler.has_requests():
            output = run.schedule()
            tables[id(output)] = [run.scheduler.kv_cache_manager.get_block_ids(e.req_id) for e in output.entries]
            if len(run.queue) < run.depth:
                continue
        if run.scheduler._defer_block_free:   # KV1: no block an in-flight batch references is free
            free = set(run.scheduler.kv_cache_manager.block_pool.free_block_queue)
            assert not any(free & set(ids) for output in run.queue for ids in tables[id(output)])
        if run.queue:
            run.complete()
    raise AssertionError(f"seed {seed} under {profile} did not end")


@pytest.mark.parametrize("profile", KV_PROFILES)
def test_random_runs_stay_consistent_fenced_and_leak_nothing(profile):
    for seed in range(40):
        _random_run(seed, profile)

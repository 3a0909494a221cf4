"""The reference's `vllm-0.33-async` profile (reference/profiles.py): vLLM
0.33.0's `AsyncScheduler` with the V2 model runner under pipeline
parallelism K. Output placeholders let a decode go out while the previous
one is in flight; decodes of one request are `decode_stagger` (= K)
schedule() calls apart; the max_tokens guard stops scheduling once the
steps in flight surely reach max_tokens; preemption resets the placeholders;
the engine's batch queue is K + 1 deep (reference/drive.py
`VLLM_0_33_ASYNC_LOOP`); the trace carries the async keys."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest

from flightcheck.reference import (Engine, ModelRunnerOutput, Request, RequestStatus, SamplingParams,
                                   Scheduler, SchedulerConfig, ScriptedExecutor, TraceWriter)
from flightcheck.reference.consistency import consistency_errors
from flightcheck.reference.drive import VLLM_0_33_ASYNC_LOOP
from flightcheck.reference.engine import loop_for_config
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.reference.scripted_executor import Sample
from flightcheck.reference.trace import TracingScheduler

EOS = 2
ASYNC = "vllm-0.33-async"


def config(**overrides: Any) -> SchedulerConfig:
    knobs: dict[str, Any] = dict(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64,
                                 block_size=4, num_blocks=32, enable_prefix_caching=False,
                                 num_pipeline_stages=2, profile=ASYNC)
    knobs.update(overrides)
    return SchedulerConfig(**knobs)


def request(name: str, num_prompt: int, max_tokens: int = 8, first: int = 10) -> Request:
    return Request(name, list(range(first, first + num_prompt)), SamplingParams(max_tokens=max_tokens),
                   eos_token_id=EOS)


class Observed(Scheduler):
    """Records, per schedule() call (vLLM's `current_step`), the sampling
    entries it scheduled, and checks the async invariants after every call."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.sampling_steps: dict[str, list[int]] = {}
        self.violations: list[str] = []
        self.placeholders_in_flight: dict[str, int] = {}

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        for request_, entry in zip(output.entries, output.entries):
            live = self.requests[entry.req_id]
            if not live.is_prefill_chunk:
                self.sampling_steps.setdefault(entry.req_id, []).append(self.current_step)
        self._check()
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self._check()
        return outputs

    def _check(self) -> None:
        for request_ in self.running:
            placeholders = request_.num_output_placeholders
            if placeholders < 0:
                self.violations.append(f"{request_.request_id}: placeholders {placeholders}")
            # IA2: the outputs and the steps in flight never pass max_tokens.
            if request_.num_output_tokens + placeholders > request_.max_tokens:
                self.violations.append(f"{request_.request_id}: {request_.num_output_tokens} outputs + "
                                       f"{placeholders} placeholders > max_tokens {request_.max_tokens}")
            # IA1: past prefill (no drafts), num_computed = num_tokens + placeholders - 1.
            if not request_.is_prefill_chunk and request_.num_computed_tokens > 0 and (
                    request_.num_computed_tokens != request_.num_tokens + placeholders - 1):
                self.violations.append(f"{request_.request_id}: computed {request_.num_computed_tokens} != "
                                       f"{request_.num_tokens} + {placeholders} - 1")
        for request_ in self.waiting:
            if request_.num_output_placeholders != 0:
                self.violations.append(f"{request_.request_id} waits with placeholders")


def run(scheduler: Scheduler, requests: list[Request], eos_every: int = 0) -> list[Any]:
    def sample(req_id: str, position: int, drafts: Any) -> Sample:
        if eos_every and position % eos_every == 0:
            return Sample(EOS)
        return Sample(1000 + position)

    engine = Engine(scheduler, ScriptedExecutor(sample, keeps_sampled_tokens=True))
    for item in requests:
        engine.add_request(item)
    return engine.run()


# -- the profile and the loop -----------------------------------------------------

def test_the_async_profile_is_0_33_plus_async_with_a_queue_one_deeper_and_the_stagger_k():
    sync, async_ = SchedulerConfig(profile="vllm-0.33"), config(num_pipeline_stages=3)
    assert not sync.async_scheduling and sync.decode_stagger == 0 and sync.batch_queue_depth == 1
    assert async_.async_scheduling and async_.decode_stagger == 3 and async_.batch_queue_depth == 4
    for name, value in vars(sync.version_profile).items():
        if name not in ("name", "async_scheduling", "placeholder_drafts", "engine_loop", "skips_unused_drafts"):
            assert getattr(async_.version_profile, name) == value, name
    # async takes its drafts as placeholders (AsyncScheduler._update_after_schedule), sync with the output
    assert async_.version_profile.placeholder_drafts and not sync.version_profile.placeholder_drafts
    # 0.33 marks skip_drafts only with the V2 model runner, which async scheduling runs (can_skip_drafts)
    assert async_.version_profile.skips_unused_drafts and not sync.version_profile.skips_unused_drafts
    engine = Engine(Scheduler(async_), ScriptedExecutor(keeps_sampled_tokens=True))
    assert engine.loop is VLLM_0_33_ASYNC_LOOP and loop_for_config(async_) is VLLM_0_33_ASYNC_LOOP
    assert engine.max_concurrent_batches == 4


# -- a decode while the previous one is in flight ---------------------------------------

def test_a_decode_is_scheduled_while_its_previous_decode_is_still_in_flight():
    scheduler = Scheduler(config(num_pipeline_stages=1))
    scheduler.add_request(request("a", 6))
    first = scheduler.schedule()                        # the prefill: samples, one placeholder
    a = scheduler.requests["a"]
    assert [(e.req_id, e.num_computed_tokens, e.num_new_tokens) for e in first.entries] == [("a", 0, 6)]
    assert a.num_output_placeholders == 1 and a.num_computed_tokens == 6 and a.num_tokens == 6
    second = scheduler.schedule()                       # its token is not back: scheduled anyway
    assert [(e.req_id, e.num_computed_tokens, e.num_new_tokens, e.samples) for e in second.entries] == [
        ("a", 6, 1, True)]
    assert a.num_output_placeholders == 2 and a.num_computed_tokens == 7 and a.num_tokens == 6
    # The same under the sync profile: the decode waits for the token.
    sync = Scheduler(config(num_pipeline_stages=1, profile="vllm-0.33"))
    sync.add_request(request("a", 6))
    sync.schedule()
    assert sync.schedule().entries == []
    # Tokens come back in order and settle the placeholders one by one.
    scheduler.update_from_output(first, ModelRunnerOutput.from_tokens({"a": [100]}))
    assert a.num_output_placeholders == 1 and a.output_token_ids == [100]
    scheduler.update_from_output(second, ModelRunnerOutput.from_tokens({"a": [101]}))
    assert a.num_output_placeholders == 0 and a.num_computed_tokens == a.num_tokens - 1


def test_the_engine_really_overlaps_two_sampling_entries_of_one_request():
    for stages in (1, 2, 3):
        sink = io.StringIO()
        scheduler = TracingScheduler(config(num_pipeline_stages=stages), TraceWriter(sink))
        run(scheduler, [request("a", 5, max_tokens=6), request("b", 7, max_tokens=6, first=50)])
        in_flight: dict[int, set[str]] = {}
        overlapped = set()
        for event in map(json.loads, sink.getvalue().splitlines()):
            if event["ev"] == "schedule" and event["batch"] is not None:
                sampling = {e["req"] for e in event["entries"] if e["samples"]}
                overlapped |= sampling & set().union(*in_flight.values()) if in_flight else set()
                in_flight[event["batch"]] = sampling
            elif event["ev"] == "complete":
                in_flight.pop(event["batch"])
        assert overlapped == {"a", "b"}, stages


# -- the stagger --------------------------------------------------------------------------

@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_decodes_of_one_request_are_spaced_by_the_stagger(stages: int):
    scheduler = Observed(config(num_pipeline_stages=stages, max_num_batched_tokens=6))
    run(scheduler, [request("a", 9, max_tokens=7), request("b", 3, max_tokens=9, first=40),
                    request("c", 12, max_tokens=5, first=70)])
    assert scheduler.violations == []
    for name, steps in scheduler.sampling_steps.items():
        gaps = [later - earlier for earlier, later in zip(steps, steps[1:])]
        assert gaps and min(gaps) >= stages, (name, steps)
    # Some decode went out exactly at the stagger: the rule binds, not something slower.
    assert any(later - earlier == stages for steps in scheduler.sampling_steps.values()
               for earlier, later in zip(steps, steps[1:]))


def test_without_the_stagger_decodes_go_out_on_consecutive_calls():
    # The stagger is what spaces them: with it off (next_decode_eligible_step
    # never set) one request's sampling entries go out back to back.
    scheduler = Observed(config(num_pipeline_stages=3))
    scheduler._decode_stagger = 0
    run(scheduler, [request("a", 4, max_tokens=6)])
    steps = scheduler.sampling_steps["a"]
    assert any(later - earlier == 1 for earlier, later in zip(steps, steps[1:]))


# -- the max_tokens guard ------------------------------------------------------------------

def test_no_decode_past_max_tokens_counting_placeholders():
    scheduler = Scheduler(config(num_pipeline_stages=1))
    scheduler.add_request(request("a", 6, max_tokens=1))
    scheduler.schedule()                                # the prefill samples the only token
    a = scheduler.requests["a"]
    # num_computed + 2 - placeholders = 6 + 2 - 1 >= 6 + 1: skipped, nothing else to do.
    assert a.num_output_placeholders == 1 and scheduler.schedule().entries == []
    # max_tokens 2: the prefill and one decode go out before any token is back.
    scheduler2 = Scheduler(config(num_pipeline_stages=1))
    scheduler2.add_request(request("a", 6, max_tokens=2))
    prefill = scheduler2.schedule()
    assert [e.num_new_tokens for e in scheduler2.schedule().entries] == [1]   # token 2 of 2
    a = scheduler2.requests["a"]
    assert a.num_output_placeholders == 2
    # The first token back: 1 output, 1 placeholder; 7 + 2 - 1 >= 6 + 2: skipped.
    scheduler2.update_from_output(prefill, ModelRunnerOutput.from_tokens({"a": [100]}))
    assert (a.num_output_tokens, a.num_output_placeholders, a.num_computed_tokens) == (1, 1, 7)
    assert scheduler2.schedule().entries == []
    # vLLM's guard counts one placeholder as sure (the others may be drafts
    # that get rejected): with no token back it does not stop a third call
    # from scheduling (outputs 0 + 1 < 2). Under the engine that call cannot
    # come before a completion: the queue (K + 1 = 2 here) is full.
    scheduler3 = Scheduler(config(num_pipeline_stages=1))
    scheduler3.add_request(request("a", 6, max_tokens=2))
    scheduler3.schedule()
    scheduler3.schedule()
    assert [e.num_new_tokens for e in scheduler3.schedule().entries] == [1]


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_outputs_plus_placeholders_never_pass_max_tokens_and_without_the_guard_they_do(stages: int):
    requests_ = lambda: [request("a", 5, max_tokens=1), request("b", 3, max_tokens=2, first=40),
                         request("c", 4, max_tokens=3, first=70)]
    guarded = Observed(config(num_pipeline_stages=stages))
    outputs = run(guarded, requests_())
    assert guarded.violations == []
    assert sorted(o.request_id for o in outputs if o.finish_reason == "length") == ["a", "b", "c"]
    # The guard is what holds it: with it off the stagger alone lets a
    # request run past max_tokens (its over-scheduled tokens are dropped).
    unguarded = Observed(config(num_pipeline_stages=stages))
    unguarded._is_async_skipped = lambda r: unguarded.current_step < r.next_decode_eligible_step  # type: ignore[method-assign]
    run(unguarded, requests_())
    assert any("> max_tokens" in v for v in unguarded.violations)


# -- preemption -----------------------------------------------------------------------------

def test_placeholders_are_reset_on_preemption():
    # Two requests, a pool that cannot hold both as they grow: b is preempted
    # while its decodes are in flight.
    cfg = config(num_pipeline_stages=2, num_blocks=5, max_model_len=10, block_size=2,
                 max_num_batched_tokens=8)
    scheduler = Scheduler(cfg)
    scheduler.add_request(request("a", 4, max_tokens=6))
    scheduler.add_request(request("b", 3, max_tokens=6, first=40))
    outputs: list[SchedulerOutput] = []
    preempted_with: list[int] = []
    for _ in range(30):
        b = scheduler.requests.get("b")
        before = b.num_output_placeholders if b is not None else 0
        output = scheduler.schedule()
        if "b" in output.preempted_req_ids:
            preempted_with.append(before)
            assert scheduler.requests["b"].num_output_placeholders == 0
            assert scheduler.requests["b"].status == RequestStatus.PREEMPTED
        outputs.append(output)
        if len(outputs) > 2:
            done = outputs.pop(0)
            scheduler.update_from_output(done, ModelRunnerOutput.from_tokens(
                {e.req_id: [1000 + e.num_computed_tokens + e.num_new_tokens] for e in done.entries if e.samples}))
        if preempted_with:
            break
    assert preempted_with and preempted_with[0] > 0    # it had placeholders when preempted
    assert consistency_errors(scheduler) == []


@pytest.mark.parametrize("seed", range(12))
def test_random_runs_keep_the_async_invariants(seed: int):
    rng = random.Random(seed)
    cfg = config(num_pipeline_stages=rng.choice([1, 2, 3, 4]), num_blocks=rng.choice([8, 12, 32]),
                 block_size=2, max_model_len=16, max_num_batched_tokens=rng.choice([4, 8, 16]),
                 enable_prefix_caching=rng.random() < 0.5,
                 drop_stale_output=rng.random() < 0.3)
    scheduler = Observed(cfg)
    requests_ = [request(f"r{i}", rng.randint(1, 8), rng.randint(1, 7), first=rng.choice([10, 10, 500]))
                 for i in range(rng.randint(1, 5))]
    outputs = run(scheduler, requests_, eos_every=rng.choice([0, 5, 7]))
    assert scheduler.violations == []
    assert {o.request_id for o in outputs if o.finish_reason} == {r.request_id for r in requests_}
    assert consistency_errors(scheduler) == []


# -- the trace ------------------------------------------------------------------------------

def test_the_trace_carries_the_async_keys_and_placeholders_per_entry():
    sink = io.StringIO()
    scheduler = TracingScheduler(config(num_pipeline_stages=2), TraceWriter(sink))
    run(scheduler, [request("a", 5, max_tokens=4)])
    events = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert events[0]["async_scheduling"] is True
    assert events[0]["batch_queue_depth"] == 3 and events[0]["decode_stagger"] == 2
    entries = [e for ev in events if ev["ev"] == "schedule" for e in ev["entries"]]
    assert [e["placeholders"] for e in entries][:2] == [1, 2]
    # A sync trace has none of them.
    sink = io.StringIO()
    sync = TracingScheduler(config(profile="vllm-0.33"), TraceWriter(sink))
    run(sync, [request("a", 5, max_tokens=4)])
    events = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert "async_scheduling" not in events[0]
    assert all("placeholders" not in e for ev in events if ev["ev"] == "schedule" for e in ev["entries"])

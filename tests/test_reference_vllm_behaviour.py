"""vLLM's own V1 scheduler and engine tests (docs/vllm-semantics.md §"vLLM's own tests the project replays"), rewritten for the
reference: the same scenarios and the same assertions, our own code."""

from __future__ import annotations

import pytest

from flightcheck.reference import (Engine, ModelRunnerOutput, Request, RequestStatus, Sample,
                                   SamplingParams, Scheduler, SchedulerConfig, ScriptedExecutor)
from flightcheck.reference.consistency import consistency_errors, leak_errors


def make_request(req_id: str, prompt_len: int, max_tokens: int = 16, *, base: int = 0) -> Request:
    # Distinct tokens per request unless the test shares a base on purpose.
    return Request(req_id, [base + i for i in range(prompt_len)], SamplingParams(max_tokens=max_tokens))


def runner_output(scheduler_output, tokens: dict[str, list[int]],
                  drafts: dict[str, list[int]] | None = None) -> ModelRunnerOutput:
    """The tokens a worker returns for a batch: [] for every unnamed entry."""
    return ModelRunnerOutput.from_tokens(
        {e.req_id: tokens.get(e.req_id, []) for e in scheduler_output.entries}, drafts)


# ---------------------------------------------------------------------------
# tests/v1/engine/test_engine_core.py::test_engine_core_concurrent_batches
# ---------------------------------------------------------------------------

def test_engine_pipelines_prefill_chunks_and_alternates_decodes_with_two_batches_in_flight():
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=2, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=2,
                          enable_prefix_caching=False)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    sched = engine.scheduler
    engine.add_request(make_request("0", 12, 5, base=0))
    engine.add_request(make_request("1", 12, 5, base=100))

    def newest():
        return engine.batch_queue[-1][0]

    # 1. Batch 1 = (req0: 10); the counter is advanced at schedule time.
    assert engine.step() is None
    assert len(engine.batch_queue) == 1
    assert newest().num_scheduled_tokens == {"0": 10}
    assert sched.requests["0"].num_computed_tokens == 10

    # 2. Batch 2 = (req0: 2, req1: 8): req0 has two prefill chunks in flight.
    assert engine.step() is None
    assert len(engine.batch_queue) == 2
    assert newest().num_scheduled_tokens == {"0": 2, "1": 8}
    assert sched.requests["0"].num_computed_tokens == 12
    assert sched.requests["1"].num_computed_tokens == 8
    assert len(sched.waiting) + len(sched.running) == 2

    # 3. The queue is full: the step completes batch 1 (a partial chunk: no token).
    assert engine.step() == []

    # 4. Batch 3 = (req1: 4); req0 waits for its first token.
    assert engine.step() is None
    assert len(engine.batch_queue) == 2
    assert newest().num_scheduled_tokens == {"1": 4}

    # 5. Completing batch 2 gives req0 its first token.
    outputs = engine.step()
    assert outputs is not None and len(outputs) == 1 and outputs[0].request_id == "0"
    assert sched.requests["0"].num_tokens == 13

    # 6. Batch 4 = (req0: 1).
    assert engine.step() is None
    assert newest().num_scheduled_tokens == {"0": 1}

    # 7. Completing batch 3 gives req1 its first token.
    outputs = engine.step()
    assert outputs is not None and len(outputs) == 1 and outputs[0].request_id == "1"
    assert sched.requests["1"].num_tokens == 13

    # 8. Batch 5 = (req1: 1).
    assert engine.step() is None
    assert newest().num_scheduled_tokens == {"1": 1}

    # 9. From here even steps consume one output (alternating requests, one
    #    more token each time) and odd steps schedule.
    _alternate_decodes_until_one_finishes(engine, sched)
    engine.run()
    assert leak_errors(sched) == []


def _alternate_decodes_until_one_finishes(engine: Engine, sched: Scheduler) -> None:
    """Even steps consume one output, alternating requests, one more token
    each time; odd steps schedule and return None."""
    expected = [sched.requests["0"].num_tokens + 1, sched.requests["1"].num_tokens + 1]
    step, req = 0, 0
    while len(sched.waiting) + len(sched.running) == 2:
        outputs = engine.step()
        if step % 2 == 0:
            assert outputs is not None and len(outputs) == 1
            assert outputs[0].request_id == str(req)
            if str(req) in sched.requests:
                assert sched.requests[str(req)].num_tokens == expected[req]
            expected[req] += 1
            req = 1 - req
        else:
            assert outputs is None
        step += 1


# ---------------------------------------------------------------------------
# tests/v1/core/test_scheduler.py::test_schedule_concurrent_batches
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_second_request_is_scheduled_while_the_first_is_in_flight(enable_prefix_caching):
    cfg = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=2, max_model_len=2048,
                          block_size=16, num_blocks=256, num_pipeline_stages=2,
                          enable_prefix_caching=enable_prefix_caching)
    sched = Scheduler(cfg)
    sched.add_request(make_request("0", 512, base=0))
    out0 = sched.schedule()
    assert out0.num_scheduled_tokens == {"0": 512}

    # r1 arrives and is scheduled while r0's batch is in flight; r0 is skipped.
    sched.add_request(make_request("1", 512, base=10_000))
    out1 = sched.schedule()
    assert out1.num_scheduled_tokens == {"1": 512}

    sched.update_from_output(out0, runner_output(out0, {"0": [7]}))
    # r0 decodes exactly one token while r1's batch is still in flight.
    out2 = sched.schedule()
    assert out2.num_scheduled_tokens == {"0": 1}
    sched.update_from_output(out1, runner_output(out1, {"1": [8]}))
    assert sched.requests["1"].output_token_ids == [8]
    assert consistency_errors(sched) == []


def test_prefix_hit_on_blocks_cached_at_schedule_time_while_still_in_flight():
    cfg = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=2, max_model_len=2048,
                          block_size=16, num_blocks=256, num_pipeline_stages=2)
    sched = Scheduler(cfg)
    sched.add_request(make_request("0", 512))
    out0 = sched.schedule()
    sched.add_request(make_request("1", 512))          # the same prompt
    out1 = sched.schedule()
    # All 32 blocks are cached but the last token is recomputed: 31 blocks hit.
    (entry,) = out1.entries
    assert (entry.num_computed_tokens, entry.num_new_tokens, entry.num_cached_tokens) == (496, 16, 496)
    assert entry.block_ids[:31] == out0.entries[0].new_block_ids[:31]
    assert entry.samples


# ---------------------------------------------------------------------------
# test_preempt_during_execution (#20739)
# ---------------------------------------------------------------------------

def test_request_preempted_while_in_flight_still_gets_its_token():
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=160,
                          block_size=16, num_blocks=10, num_pipeline_stages=2)
    sched = Scheduler(cfg)
    sched.add_request(make_request("0", 80, base=0))
    out0 = sched.schedule()
    assert out0.num_scheduled_tokens == {"0": 80}
    sched.add_request(make_request("1", 80, base=1000))
    out1 = sched.schedule()                             # r0 in flight, r1 admitted
    assert out1.num_scheduled_tokens == {"1": 80}
    assert sched.kv_cache_manager.get_num_free_blocks() == 0

    sched.update_from_output(out0, runner_output(out0, {"0": [41]}))
    out2 = sched.schedule()                             # r0 needs a 6th block: r1 goes
    assert out2.num_scheduled_tokens == {"0": 1}
    assert out2.preempted_req_ids == ["1"]
    r1 = sched.requests["1"]
    assert r1.status == RequestStatus.PREEMPTED and r1.num_computed_tokens == 0

    outputs = sched.update_from_output(out1, runner_output(out1, {"1": [42]}))
    assert r1.output_token_ids == [42]                   # from a complete context: kept
    assert r1.num_computed_tokens == 0                   # the recompute will include it
    assert [o.request_id for o in outputs] == ["1"]
    assert consistency_errors(sched) == []


def test_request_preempted_while_in_flight_may_finish_while_preempted():
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=160,
                          block_size=16, num_blocks=10, num_pipeline_stages=2)
    sched = Scheduler(cfg)
    sched.add_request(make_request("0", 80, base=0))
    out0 = sched.schedule()
    sched.add_request(make_request("1", 80, max_tokens=1, base=1000))
    out1 = sched.schedule()
    sched.update_from_output(out0, runner_output(out0, {"0": [41]}))
    sched.schedule()                                    # preempts r1
    outputs = sched.update_from_output(out1, runner_output(out1, {"1": [42]}))
    assert outputs[0].finish_reason == "length"
    assert "1" not in sched.requests and all(r.request_id != "1" for r in sched.waiting)
    assert consistency_errors(sched) == []


# ---------------------------------------------------------------------------
# test_schedule_concurrent_partial_requests (long_prefill_token_threshold)
# ---------------------------------------------------------------------------

def test_long_prefill_threshold_splits_the_budget_400_400_224():
    cfg = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=3, max_model_len=2048,
                          block_size=16, num_blocks=512, long_prefill_token_threshold=400)
    sched = Scheduler(cfg)
    for i in range(3):
        sched.add_request(make_request(str(i), 800, base=1000 * i))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    sched.update_from_output(out, runner_output(out, {}))
    out = sched.schedule()                                # the next chunks
    assert out.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    # Only the requests whose prompts were completed sample.
    assert [e.samples for e in out.entries] == [True, True, False]


def test_only_the_request_that_completed_its_prompt_samples():
    """test_schedule_partial_requests: outputs [[0], [], []]."""
    cfg = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=3, max_model_len=2048,
                          block_size=16, num_blocks=512)
    sched = Scheduler(cfg)
    for i, n in enumerate((500, 800, 800)):
        sched.add_request(make_request(str(i), n, base=1000 * i))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"0": 500, "1": 524}
    engine_like = ScriptedExecutor(lambda r, n, d: 5)
    result = engine_like.submit(out).result()
    assert result.sampled_token_ids == [[5], []]
    sched.update_from_output(out, result)
    assert sched.requests["0"].output_token_ids == [5]
    assert sched.requests["1"].output_token_ids == []


# ---------------------------------------------------------------------------
# test_stop_via_update_from_output
# ---------------------------------------------------------------------------

def _decoding_scheduler(**cfg_overrides) -> Scheduler:
    cfg = dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, block_size=4,
               num_blocks=64, num_spec_tokens=3)
    cfg.update(cfg_overrides)
    return Scheduler(SchedulerConfig(**cfg))


def _run_to_decode(sched: Scheduler, drafts: dict[str, list[int]]):
    """Prefill every waiting request, then schedule one step with `drafts`."""
    out = sched.schedule()
    sched.update_from_output(out, runner_output(out, {e.req_id: [1] for e in out.entries}, drafts))
    return sched.schedule()


def test_eos_stops_and_trims_the_tokens_after_it():
    sched = _decoding_scheduler()
    sched.add_request(Request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=10), eos_token_id=99))
    out = _run_to_decode(sched, {"a": [10, 99, 12]})
    assert out.scheduled_spec_decode_tokens == {"a": (10, 99, 12)}
    (res,) = sched.update_from_output(out, runner_output(out, {"a": [10, 99, 12, 13]}))
    assert (res.new_token_ids, res.finish_reason) == ([10, 99], "stop")
    assert leak_errors(sched) == []


def test_stop_token_id_stops_with_stop_reason():
    sched = _decoding_scheduler()
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=(7,))))
    out = _run_to_decode(sched, {"a": [7, 8]})
    (res,) = sched.update_from_output(out, runner_output(out, {"a": [7, 8, 9]}))
    assert (res.new_token_ids, res.finish_reason, res.stop_reason) == ([7], "stop", 7)


def test_max_tokens_truncates_accepted_drafts():
    sched = _decoding_scheduler()
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3)))
    out = _run_to_decode(sched, {"a": [10, 11, 12]})
    (res,) = sched.update_from_output(out, runner_output(out, {"a": [10, 11, 12, 13]}))
    assert (res.new_token_ids, res.finish_reason) == ([10, 11], "length")
    assert leak_errors(sched) == []


def test_ignore_eos_keeps_going_until_max_tokens():
    sched = _decoding_scheduler()
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True),
                              eos_token_id=99))
    out = _run_to_decode(sched, {"a": [99, 99]})
    (res,) = sched.update_from_output(out, runner_output(out, {"a": [99, 99, 99]}))
    assert (res.new_token_ids, res.finish_reason) == ([99, 99, 99], "length")


def test_max_model_len_caps_the_request():
    sched = _decoding_scheduler(max_model_len=8)
    sched.add_request(Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=10)))
    out = _run_to_decode(sched, {"a": [10, 11, 12]})
    # Drafts are clipped at max_model_len: KV for positions 6 and 7 only.
    assert out.num_scheduled_tokens == {"a": 2} and out.scheduled_spec_decode_tokens == {"a": (10,)}
    (res,) = sched.update_from_output(out, runner_output(out, {"a": [10, 13]}))
    assert res.finish_reason == "length" and res.new_token_ids == [10]
    assert leak_errors(sched) == []


# ---------------------------------------------------------------------------
# Spec decode accounting (test_schedule_spec_decoding_stats)
# ---------------------------------------------------------------------------

def test_rejected_drafts_are_subtracted_from_num_computed_tokens():
    sched = _decoding_scheduler()
    sched.add_request(make_request("a", 10))
    out = _run_to_decode(sched, {"a": [20, 21, 22]})
    request = sched.requests["a"]
    assert out.num_scheduled_tokens == {"a": 4}          # 1 known + 3 drafts
    assert request.num_computed_tokens == 14              # 11 known + 3 drafts
    # One draft accepted, then the bonus token: 2 drafts rejected.
    sched.update_from_output(out, runner_output(out, {"a": [20, 30]}, {"a": [40]}))
    assert request.num_tokens == 13
    assert request.num_computed_tokens == 12              # = num_tokens - 1
    assert request.spec_token_ids == (40,)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 2} and out.entries[0].num_computed_tokens == 12


def test_empty_output_for_a_draft_step_changes_no_counter():
    """test_spec_decoding_stats_empty_output: no tokens must not count as -1 accepted."""
    sched = _decoding_scheduler()
    sched.add_request(make_request("a", 10))
    out = _run_to_decode(sched, {"a": [20, 21]})
    before = sched.requests["a"].num_computed_tokens
    assert sched.update_from_output(out, runner_output(out, {})) == []
    assert sched.requests["a"].num_computed_tokens == before


def test_all_drafts_accepted_advance_by_drafts_plus_one():
    sched = _decoding_scheduler()
    sched.add_request(make_request("a", 10))
    engine = Engine(sched, ScriptedExecutor(lambda r, n, d: Sample(500 + n, len(d), (1, 2))))
    engine.step(), engine.step()          # prefill, then its token (proposes 2 drafts)
    assert sched.requests["a"].spec_token_ids == (1, 2)
    engine.step(), engine.step()          # decode 1 + 2 drafts, all accepted
    request = sched.requests["a"]
    assert request.num_tokens == 14 and request.num_computed_tokens == 13

"""Every reference mutant does observable damage on a scenario made for it,
and the correct scheduler does not, on the same scenario."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightcheck.reference import (Engine, ModelRunnerOutput, Request, RequestStatus, Sample,
                                   SamplingParams, Scheduler, SchedulerConfig, ScriptedExecutor)
from flightcheck.reference.consistency import leak_errors
from flightcheck.verification.mutants import reference as M
from flightcheck.verification.mutants.patching import reference_applied


@pytest.fixture
def mutant(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The mutant a test is parametrized with (indirectly; None: the correct
    scheduler), its edits in force for the length of the test."""
    with reference_applied(request.param):
        yield request.param


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def concurrent_engine(mutant: str | None, **kwargs) -> Engine:
    """The concurrent-batches engine test's setup: budget 10, K=2, two 12-token prompts."""
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=2, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=2,
                          enable_prefix_caching=False)
    engine = Engine(Scheduler(cfg), ScriptedExecutor(**kwargs))
    engine.add_request(Request("0", prompt(12), SamplingParams(max_tokens=5)))
    engine.add_request(Request("1", prompt(12, 100), SamplingParams(max_tokens=5)))
    return engine


def test_every_mutant_has_a_test_here():
    tested = {name for name in M.MUTANTS if f"test_{name}_" in "".join(globals())}
    assert tested == set(M.MUTANTS)


@pytest.mark.parametrize("mutant", [None, M.ADVANCE_AT_COMPLETION], indirect=True)
def test_advance_at_completion_schedules_the_same_prefill_tokens_twice(mutant):
    engine = concurrent_engine(mutant)
    engine.step()
    batch2 = engine.schedule_step()
    starts = {e.req_id: e.num_computed_tokens for e in batch2.entries}
    if mutant is None:
        assert starts == {"0": 10, "1": 0}
    else:
        assert starts["0"] == 0                 # tokens 0..9 of r0 again, still in flight


def _three_chunk_run(mutant: str | None) -> tuple[Engine, ScriptedExecutor]:
    cfg = SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=1, max_model_len=64,
                          block_size=16, num_blocks=16, num_pipeline_stages=3,
                          enable_prefix_caching=False)
    executor = ScriptedExecutor()
    engine = Engine(Scheduler(cfg), executor)
    engine.add_request(Request("r", prompt(30), SamplingParams(max_tokens=3)))
    for _ in range(3):
        engine.step()                           # three chunks of r in flight
    return engine, executor


@pytest.mark.parametrize("mutant", [None, M.SHARED_SNAPSHOT], indirect=True)
def test_shared_snapshot_makes_the_worker_see_a_later_batchs_positions(mutant):
    engine, executor = _three_chunk_run(mutant)
    engine.run()
    seen = [(e.start, e.n, e.sampled) for batch in executor.executed[:3] for e in batch]
    if mutant is None:
        assert seen == [(0, 10, False), (10, 10, False), (20, 10, True)]
    else:
        assert seen[1] == (20, 10, True)        # batch 2 read batch 3's snapshot...
        assert seen[2] == (30, 1, True)         # ...and batch 3 read batch 4's


@pytest.mark.parametrize("mutant", [None, M.FINAL_CHUNK_FROM_LIVE_COUNTER], indirect=True)
def test_final_chunk_from_live_counter_keeps_a_partial_chunks_sample(mutant):
    # A worker that samples every chunk (vLLM <= 0.8.2) leaves the filter to the scheduler.
    engine = concurrent_engine(mutant, sample_every_chunk=True)
    engine.step(), engine.step()                # B1 = (r0: 10), B2 = (r0: 2, r1: 8)
    outputs = engine.step()                     # B1 completes: r0's counter already says 12
    if mutant is None:
        assert outputs == []
    else:
        assert [o.request_id for o in outputs] == ["0"]   # a token from 10 of 12 prompt tokens


def test_the_correct_scheduler_ignores_samples_of_partial_chunks():
    plain, every = concurrent_engine(None), concurrent_engine(None, sample_every_chunk=True)
    assert plain.run() == every.run()


@pytest.mark.parametrize("mutant", [None, M.SNAPSHOT_OMITS_PREFIX_HIT], indirect=True)
def test_snapshot_omits_prefix_hit_hangs_a_request_with_a_prefix_hit(mutant):
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=128,
                          block_size=16, num_blocks=16, num_pipeline_stages=2)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    engine.add_request(Request("a", prompt(40), SamplingParams(max_tokens=2)))
    engine.run()
    engine.add_request(Request("b", prompt(40), SamplingParams(max_tokens=2)))  # hits 32 tokens
    if mutant is None:
        engine.run()
        assert leak_errors(engine.scheduler) == []
    else:
        with pytest.raises(RuntimeError, match="stuck"):
            engine.run()
        b = engine.scheduler.requests["b"]
        assert b.num_output_tokens == 0 and b.num_computed_tokens == b.num_tokens


def _spec_decode_engine(mutant: str | None, accept: int) -> Engine:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_spec_tokens=2)
    engine = Engine(Scheduler(cfg), ScriptedExecutor(lambda r, n, d: Sample(500 + n, accept, (7, 8))))
    engine.add_request(Request("a", prompt(10), SamplingParams(max_tokens=20)))
    return engine


@pytest.mark.parametrize("mutant", [None, M.REJECTIONS_NOT_SUBTRACTED], indirect=True)
def test_rejections_not_subtracted_leaves_a_hole_of_uncomputed_tokens(mutant):
    engine = _spec_decode_engine(mutant, accept=0)
    for _ in range(4):
        engine.step()                           # prefill, token + drafts, drafts rejected
    a = engine.scheduler.requests["a"]
    assert a.num_tokens == 12
    if mutant is None:
        assert a.num_computed_tokens == 11
    else:
        assert a.num_computed_tokens == 13      # counts two rejected drafts as computed


@pytest.mark.parametrize("mutant", [None, M.DECODE_WHILE_TOKEN_IN_FLIGHT], indirect=True)
def test_decode_while_token_in_flight_schedules_a_token_that_does_not_exist_yet(mutant):
    engine = concurrent_engine(mutant)
    engine.step(), engine.step(), engine.step()  # B1, B2 scheduled; B1 completed
    batch3 = engine.schedule_step()
    r0 = engine.scheduler.requests["0"]
    if mutant is None:
        assert batch3.num_scheduled_tokens == {"1": 4}
    else:
        entry = next(e for e in batch3.entries if e.req_id == "0")
        assert entry.num_computed_tokens == 12 == r0.num_tokens - 0   # position 12 is unknown
        assert r0.num_computed_tokens > r0.num_tokens


def _preempt_resume_before_stale_batch_returns(mutant: str | None):
    """r1's sampling batch is in flight when r1 is preempted (for r0's blocks),
    r0 is aborted, r1 is resumed, and only then does the old batch return."""
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=12,
                          block_size=4, num_blocks=3, num_pipeline_stages=3,
                          enable_prefix_caching=False)
    sched = Scheduler(cfg)
    executor = ScriptedExecutor()
    sched.add_request(Request("0", prompt(4), SamplingParams(max_tokens=5)))
    b1 = sched.schedule()
    f1 = executor.submit(b1)
    sched.add_request(Request("1", prompt(8, 50), SamplingParams(max_tokens=5)))
    b2 = sched.schedule()                        # r1's whole prompt: samples
    f2 = executor.submit(b2)
    sched.update_from_output(b1, f1.result())
    b3 = sched.schedule()                        # r0 needs a block: r1 preempted
    assert b3.preempted_req_ids == ["1"]
    executor.submit(b3)
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    b4 = sched.schedule()                        # r1 resumed while b2 is in flight
    assert [e.resumed_from_preemption for e in b4.entries] == [True]
    executor.submit(b4)
    return sched, sched.update_from_output(b2, f2.result())


@pytest.mark.parametrize("mutant", [None, M.STALE_OUTPUT_APPLIED_TO_RESUMED], indirect=True)
def test_stale_output_applied_to_resumed_appends_a_token_to_the_new_incarnation(mutant):
    sched, outputs = _preempt_resume_before_stale_batch_returns(mutant)
    r1 = sched.requests["1"]
    if mutant is None:
        assert outputs == [] and r1.output_token_ids == []
    else:
        assert r1.num_output_tokens == 1        # while its resumed prefill is in flight


@pytest.mark.parametrize("mutant", [None, M.INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION], indirect=True)
def test_inflight_set_not_cleared_on_preemption_stops_the_engine(mutant):
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=160,
                          block_size=16, num_blocks=10, num_pipeline_stages=2,
                          continue_prefill=False)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    engine.add_request(Request("0", prompt(80), SamplingParams(max_tokens=20)))
    engine.step()
    engine.add_request(Request("1", prompt(80, 1000), SamplingParams(max_tokens=5)))
    if mutant is None:
        engine.run()
        assert leak_errors(engine.scheduler) == []
    else:
        with pytest.raises(RuntimeError, match="stuck"):
            engine.run()
        sched = engine.scheduler
        assert sched.scheduled_req_ids == {"1"} and [r.request_id for r in sched.waiting] == ["1"]
        assert sched.get_num_unscheduled_requests() == 0


@pytest.mark.parametrize("mutant", [None, M.REJECTIONS_SUBTRACTED_AFTER_RESET], indirect=True)
def test_rejections_subtracted_after_reset_drive_the_counter_negative(mutant):
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=2, max_model_len=28,
                          block_size=4, num_blocks=7, num_pipeline_stages=2, num_spec_tokens=2,
                          long_prefill_token_threshold=8, enable_prefix_caching=False)
    sched = Scheduler(cfg)
    sched.add_request(Request("0", prompt(24), SamplingParams(max_tokens=4)))
    sched.add_request(Request("1", prompt(3, 100), SamplingParams(max_tokens=8)))
    b1 = sched.schedule()                                    # r0: 8, r1: 3
    sched.update_from_output(b1, ModelRunnerOutput.from_tokens({"0": [], "1": [5]},
                                                               {"1": [6, 7]}))
    b2 = sched.schedule()                                    # r0: 8, r1: 1 + 2 drafts
    assert b2.scheduled_spec_decode_tokens == {"1": (6, 7)}
    b3 = sched.schedule()                                    # r0 needs 2 blocks: r1 preempted
    assert b3.preempted_req_ids == ["1"]
    sched.update_from_output(b2, ModelRunnerOutput.from_tokens({"0": [], "1": [9]}))  # 2 rejected
    r1 = sched.requests["1"]
    assert r1.output_token_ids == [5, 9]                     # orphaned: tokens kept
    assert r1.num_computed_tokens == (0 if mutant is None else -2)
    # The damage surfaces when r1 is resumed: its allocation starts from the
    # counter, so the recomputed 5 tokens get one block instead of two.
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    (resumed,) = sched.schedule().entries
    assert (resumed.req_id, resumed.num_new_tokens) == ("1", 5)
    assert len(resumed.new_block_ids) == (2 if mutant is None else 1)


@pytest.mark.parametrize("mutant", [None, M.OUTPUT_BOUND_BY_NAME], indirect=True)
def test_output_bound_by_name_gives_a_reused_id_the_old_requests_token(mutant):
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                          block_size=4, num_blocks=16, num_pipeline_stages=2)
    sched = Scheduler(cfg)
    executor = ScriptedExecutor()
    sched.add_request(Request("x", prompt(4), SamplingParams(max_tokens=4)))
    b1 = sched.schedule()
    f1 = executor.submit(b1)
    sched.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    sched.add_request(Request("x", prompt(20, 300), SamplingParams(max_tokens=4)))
    executor.submit(sched.schedule())
    sched.update_from_output(b1, f1.result())
    new_x = sched.requests["x"]
    if mutant is None:
        assert new_x.output_token_ids == []
    else:
        assert new_x.output_token_ids == [1004]             # the old x's token

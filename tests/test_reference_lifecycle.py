"""Request lifecycle: bad input, aborts, in-flight work of changed requests,
the one-batch-per-request policy, and nothing left behind at the end."""

from __future__ import annotations

import random

import pytest

from flightcheck.reference import (Engine, Fate, Request, RequestStatus, Sample, SamplingParams,
                                   Scheduler, SchedulerConfig, ScriptedExecutor)
from flightcheck.reference.consistency import consistency_errors, leak_errors


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def small_config(**overrides) -> SchedulerConfig:
    cfg = dict(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32, block_size=4,
               num_blocks=16, num_pipeline_stages=2)
    cfg.update(overrides)
    return SchedulerConfig(**cfg)


def snapshot(sched: Scheduler):
    kv = sched.kv_cache_manager
    return (sorted(sched.requests), [r.request_id for r in sched.waiting],
            [r.request_id for r in sched.running], kv.block_pool.free_block_ids(),
            sched.num_steps)


# -- bad input -------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("max_num_batched_tokens", 0, "max_num_batched_tokens"),
    ("block_size", 0, "block_size"),
    ("num_blocks", 7, "fewer than one request"),
    ("max_num_seqs", 0, "max_num_seqs"),
    ("num_pipeline_stages", 0, "num_pipeline_stages"),
    ("long_prefill_token_threshold", -1, "long_prefill_token_threshold"),
    ("num_spec_tokens", -1, "num_spec_tokens"),
    ("max_model_len", 1, "max_model_len"),
])
def test_invalid_config_is_rejected_with_a_clear_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        small_config(**{field: value})


@pytest.mark.parametrize("make, message", [
    (lambda: Request("a", prompt(3)), "duplicate request id"),
    (lambda: Request("b", []), "empty prompt"),
    (lambda: Request("c", prompt(32)), "at most 31"),
    (lambda: Request("d", prompt(3), SamplingParams(max_tokens=0)), "max_tokens"),
])
def test_bad_request_raises_and_changes_nothing(make, message):
    sched = Scheduler(small_config())
    sched.add_request(Request("a", prompt(3)))
    before = snapshot(sched)
    with pytest.raises(ValueError, match=message):
        sched.add_request(make())
    assert snapshot(sched) == before


def test_longest_prompt_that_fits_is_accepted_and_finishes_on_length():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    engine.add_request(Request("a", prompt(31), SamplingParams(max_tokens=5)))
    (out,) = engine.run()
    assert out.finish_reason == "length" and len(out.new_token_ids) == 1


def test_re_adding_the_same_request_object_is_rejected():
    sched = Scheduler(small_config())
    r = Request("a", prompt(3))
    sched.add_request(r)
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    with pytest.raises(ValueError, match="already added"):
        sched.add_request(r)


def test_abort_of_unknown_or_finished_id_is_a_no_op():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    engine.add_request(Request("a", prompt(3), SamplingParams(max_tokens=1)))
    engine.run()
    before = snapshot(engine.scheduler)
    engine.abort_request("a")
    engine.abort_request("never-seen")
    assert snapshot(engine.scheduler) == before


def test_finish_requests_refuses_a_status_that_is_not_finished():
    sched = Scheduler(small_config())
    with pytest.raises(ValueError, match="not a finished status"):
        sched.finish_requests("a", RequestStatus.RUNNING)


# -- work in flight for requests that changed ------------------------------

def test_aborted_request_in_flight_has_its_output_dropped_and_frees_everything():
    sched = Scheduler(small_config())
    executor = ScriptedExecutor()
    sched.add_request(Request("a", prompt(6)))
    out = sched.schedule()
    future = executor.submit(out)
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.fate_of(out.entries[0]) is Fate.SUPERSEDED
    assert sched.update_from_output(out, future.result()) == []
    assert leak_errors(sched) == []


def test_fates_follow_preemption_and_rescheduling():
    cfg = small_config(max_num_batched_tokens=100, max_model_len=12, num_blocks=3,
                       num_pipeline_stages=3, enable_prefix_caching=False)
    sched = Scheduler(cfg)
    sched.add_request(Request("0", prompt(4)))
    b1 = sched.schedule()
    sched.add_request(Request("1", prompt(8, 50)))
    b2 = sched.schedule()
    from flightcheck.reference import ModelRunnerOutput
    sched.update_from_output(b1, ModelRunnerOutput.from_tokens({"0": [9]}))
    (r1_entry,) = b2.entries
    assert sched.fate_of(r1_entry) is Fate.LIVE
    sched.schedule()                                  # preempts r1
    assert sched.fate_of(r1_entry) is Fate.ORPHANED
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    sched.schedule()                                  # resumes r1
    assert sched.fate_of(r1_entry) is Fate.SUPERSEDED


def test_id_reused_after_abort_does_not_receive_the_old_output():
    sched = Scheduler(small_config())
    executor = ScriptedExecutor()
    sched.add_request(Request("x", prompt(4)))
    b1 = sched.schedule()
    f1 = executor.submit(b1)
    sched.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    sched.add_request(Request("x", prompt(12, 300)))
    b2 = sched.schedule()
    f2 = executor.submit(b2)
    assert sched.update_from_output(b1, f1.result()) == []
    (out,) = sched.update_from_output(b2, f2.result())
    assert sched.requests["x"].output_token_ids == out.new_token_ids == [1012]


def test_finished_ids_reach_the_workers_with_the_next_batch():
    engine = Engine(Scheduler(small_config()), ScriptedExecutor())
    engine.add_request(Request("a", prompt(3), SamplingParams(max_tokens=1)))
    engine.run()
    assert engine.scheduler.finished_req_ids == {"a"}
    engine.add_request(Request("b", prompt(3), SamplingParams(max_tokens=1)))
    out = engine.schedule_step()
    assert out.finished_req_ids == {"a"} and engine.scheduler.finished_req_ids == set()


# -- the one-batch-per-request policy --------------------------------------

def test_one_batch_per_request_never_puts_a_request_in_two_batches_in_flight():
    cfg = small_config(continue_prefill=False, max_num_batched_tokens=10, max_model_len=64,
                       num_blocks=32)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    engine.add_request(Request("0", prompt(12), SamplingParams(max_tokens=5)))
    engine.add_request(Request("1", prompt(12, 100), SamplingParams(max_tokens=5)))
    assert engine.step() is None
    assert engine.batch_queue[-1][0].num_scheduled_tokens == {"0": 10}
    assert engine.step() is None            # r0 is in flight: only r1
    assert engine.batch_queue[-1][0].num_scheduled_tokens == {"1": 10}
    while engine.has_unfinished_requests() or engine.batch_queue:
        engine.step()
        in_flight = [e.req_id for out, _ in engine.batch_queue for e in out.entries]
        assert len(in_flight) == len(set(in_flight))
    assert leak_errors(engine.scheduler) == []


def test_one_batch_per_request_engine_waits_when_every_request_is_in_flight():
    cfg = small_config(continue_prefill=False, num_pipeline_stages=4)
    engine = Engine(Scheduler(cfg), ScriptedExecutor())
    engine.add_request(Request("0", prompt(6)))
    engine.step()
    assert engine.scheduler.get_num_unscheduled_requests() == 0
    assert not engine.can_schedule()        # three free slots in the queue, but the gate is shut
    outputs = engine.step()                 # so the step waits for the batch instead
    assert [o.request_id for o in outputs] == ["0"] and not engine.batch_queue


# -- nothing left behind -----------------------------------------------------

def _random_workload(seed: int, cfg: SchedulerConfig, num_requests: int = 12) -> Engine:
    """Requests sharing prefixes, random drafts and EOS, random aborts."""
    rng = random.Random(seed)
    eos = 2

    def sample(req_id: str, num_tokens: int, drafts) -> Sample:
        token = eos if rng.random() < 0.08 else 100 + rng.randrange(50)
        next_drafts = tuple(100 + rng.randrange(50) for _ in range(rng.randint(0, cfg.num_spec_tokens)))
        return Sample(token, rng.randint(0, len(drafts)), next_drafts)

    engine = Engine(Scheduler(cfg), ScriptedExecutor(sample))
    prefixes = [prompt(8, 1000 * k) for k in range(3)]
    pending = []
    for i in range(num_requests):
        body = rng.choice(prefixes)[: rng.randint(0, 8)] + prompt(rng.randint(1, 12), 10_000 * (i + 1))
        pending.append(Request(f"r{i}", body[: cfg.max_model_len - 1],
                               SamplingParams(max_tokens=rng.randint(1, 10)), eos_token_id=eos))
    engine._pending = pending  # type: ignore[attr-defined]
    engine._rng = rng          # type: ignore[attr-defined]
    return engine


def _drive(engine: Engine, max_steps: int = 5000) -> None:
    rng, pending = engine._rng, engine._pending  # type: ignore[attr-defined]
    sched = engine.scheduler
    for _ in range(max_steps):
        if pending and rng.random() < 0.3:
            engine.add_request(pending.pop(0))
        if sched.requests and rng.random() < 0.03:
            engine.abort_request(rng.choice(sorted(sched.requests)))
        if rng.random() < 0.5 and engine.can_schedule():
            engine.schedule_step()
        elif engine.batch_queue:
            engine.complete_oldest_step()
        else:
            engine.step()
        errors = consistency_errors(sched)
        assert errors == [], errors
        _check_in_flight(engine)
        if not pending and not sched.has_unfinished_requests() and not engine.batch_queue:
            return
    raise AssertionError("workload did not finish")


def _check_in_flight(engine: Engine) -> None:
    """Live entries of a request are contiguous, end at its counter, and only
    the last may sample (spec/README.md §Properties: S3, S6)."""
    sched = engine.scheduler
    live: dict[str, list] = {}
    for out, _ in engine.batch_queue:
        assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
        for e in out.entries:
            if sched.fate_of(e) is Fate.LIVE:
                live.setdefault(e.req_id, []).append(e)
    for req_id, entries in live.items():
        for a, b in zip(entries, entries[1:]):
            assert a.num_computed_tokens + a.num_new_tokens == b.num_computed_tokens
            assert not a.samples
        last = entries[-1]
        assert last.num_computed_tokens + last.num_new_tokens == sched.requests[req_id].num_computed_tokens


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_stay_consistent_and_leave_nothing_behind(seed):
    variants = [
        dict(),
        dict(num_blocks=8, enable_prefix_caching=True),
        dict(num_blocks=8, num_spec_tokens=2, num_pipeline_stages=3),
        dict(continue_prefill=False, num_blocks=9),
        dict(long_prefill_token_threshold=3, num_spec_tokens=1, num_blocks=10),
        dict(enable_prefix_caching=False, num_blocks=8, num_pipeline_stages=1),
    ]
    cfg = small_config(**variants[seed % len(variants)])
    engine = _random_workload(seed, cfg)
    _drive(engine)
    assert leak_errors(engine.scheduler) == []
    assert engine.scheduler.kv_cache_manager.reset_prefix_cache()
    assert engine.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block == {}

"""Streaming sessions in the reference scheduler (reference/sessions.py):
the scenario flightcheck/vllm/session_probe.py runs on vLLM's real scheduler,
run on the reference (vllm-0.34 and 0.33, sync and async), observed with the
same keys and compared with the spec's run of it (tests/test_vllm_sessions.py
compares vLLM's with the same), then a session's end queued while it runs,
and an abort of a parked session."""

from __future__ import annotations

import pytest

from flightcheck.reference.config import SchedulerConfig
from flightcheck.reference.consistency import consistency_errors, leak_errors
from flightcheck.reference.outputs import ModelRunnerOutput, SchedulerOutput
from flightcheck.reference.request import Request, RequestStatus, SamplingParams
from flightcheck.reference.scheduler import Scheduler

from .test_vllm_sessions import _spec_run

EOS = 2


def _request(name: str, tokens: list[int], max_tokens: int, resumable: bool) -> Request:
    request = Request(name, tokens, SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
    request.resumable = resumable
    return request


def _look(s: Scheduler, req_id: str = "r0") -> dict:
    assert consistency_errors(s) == []
    r = s.requests[req_id]
    return {"status": r.status.name, "num_computed": r.num_computed_tokens, "num_tokens": r.num_tokens,
            "num_prompt": r.num_prompt_tokens, "num_output": r.num_output_tokens,
            "in_flight": r.num_in_flight_tokens, "stale": r.num_stale_output_tokens, "drop": r.drop_stale_output,
            "placeholders": r.num_output_placeholders,
            "blocks": len(s.kv_cache_manager.req_to_blocks.get(req_id, ())),
            "in_kv_holding": r in s.kv_holding_waiting, "in_waiting": r in s.waiting, "running": r in s.running,
            "waiting_for_input": s.num_waiting_for_streaming_input}


def _scheduled(output: SchedulerOutput) -> dict:
    return {e.req_id: e.num_new_tokens for e in output.entries}


def _complete(s: Scheduler, output: SchedulerOutput, tokens: dict) -> None:
    s.update_from_output(output, ModelRunnerOutput.from_tokens({e.req_id: tokens.get(e.req_id, [])
                                                                for e in output.entries}))


def _scheduler(profile: str) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=1, max_model_len=56, block_size=4,
                                     num_blocks=15, enable_prefix_caching=False, num_pipeline_stages=1,
                                     profile=profile))


def _reference_run(profile: str) -> dict:
    s, async_scheduling = _scheduler(profile), profile.endswith("async")
    s.add_request(_request("r0", list(range(10, 16)), 4, True))
    s.add_request(_request("r1", [20, 21, 22], 1, False))
    seen = {}
    first = s.schedule()
    seen["first"] = _scheduled(first)
    second = s.schedule() if async_scheduling else None
    seen["second"] = _scheduled(second) if second is not None else {}
    _complete(s, first, {"r0": [EOS]})
    seen["stopped"] = _look(s)
    parked = s.schedule()
    seen["while_parked"] = _scheduled(parked)
    s.add_request(_request("r0", [100, 101], 2, True))
    seen["input_taken"] = _look(s)
    resumed = s.schedule()
    seen["resumed"] = _scheduled(resumed)
    if second is not None:
        _complete(s, second, {"r0": [7]})
        seen["old_output_returned"] = _look(s)
    _complete(s, parked, {})
    _complete(s, resumed, {"r0": [9]})
    seen["new_output_returned"] = _look(s)
    return seen


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async"])
def test_a_session_in_the_reference_goes_as_the_spec_reads_it(profile: str):
    assert _reference_run(profile) == _spec_run(profile.endswith("async"))


def test_the_end_of_a_session_sent_while_it_runs_finishes_it_at_its_stop():
    s = _scheduler("vllm-0.34")
    s.add_request(_request("r0", [10, 11, 12], 1, True))
    out = s.schedule()
    s.add_request(_request("r0", [30], 1, True))
    s.add_request(_request("r0", [40], 1, False))          # the end of the session
    _complete(s, out, {"r0": [7]})                          # stop: the queued input starts turn 1
    assert s.requests["r0"].status is RequestStatus.WAITING and s.requests["r0"].num_prompt_tokens == 3 + 1 - 1 + 1
    out = s.schedule()
    assert _scheduled(out) == {"r0": 1}
    _complete(s, out, {"r0": [8]})                          # its stop meets the end: finished, freed
    assert "r0" not in s.requests and s.kv_cache_manager.block_pool.get_num_free_blocks() == 15
    assert not s.has_unfinished_requests() and leak_errors(s) == []


def test_a_parked_session_is_not_unfinished_work_and_its_abort_gives_its_seat_and_blocks_back():
    s = _scheduler("vllm-0.34")
    s.add_request(_request("r0", [10, 11, 12], 1, True))
    _complete(s, s.schedule(), {"r0": [7]})
    assert s.requests["r0"].status is RequestStatus.WAITING_FOR_STREAMING_REQ and consistency_errors(s) == []
    assert not s.has_unfinished_requests() and s.num_waiting_for_streaming_input == 1
    s.add_request(_request("r1", [20], 1, False))
    assert _scheduled(s.schedule()) == {}                   # the parked session holds the one seat
    s.finish_requests("r0", RequestStatus.FINISHED_ABORTED)
    assert s.num_waiting_for_streaming_input == 0 and "r0" not in s.requests
    assert _scheduled(s.schedule()) == {"r1": 1}


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async"])
@pytest.mark.parametrize("seed", range(12))
def test_random_runs_of_sessions_stay_consistent_and_leave_nothing_behind(profile: str, seed: int):
    """Sessions and plain requests under pressure (a small pool, two seats,
    two batches in flight), inputs sent at random moments, random stops: the
    reference's self-checks hold after every call, and once every session has
    ended and every batch returned, nothing is left."""
    import random
    from collections import deque as queue

    rng = random.Random(seed)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=2, max_model_len=32, block_size=4,
                                  num_blocks=10, enable_prefix_caching=False, num_pipeline_stages=2, profile=profile))
    to_send: dict[str, list] = {}
    for i in range(4):
        resumable = i % 2 == 0
        s.add_request(_request(f"r{i}", [10 + i] * rng.randint(1, 6), rng.randint(1, 3), resumable))
        if resumable:
            to_send[f"r{i}"] = [(rng.randint(1, 4), rng.randint(1, 3)) for _ in range(rng.randint(0, 2))] + [None]
    in_flight: queue = queue()
    for _ in range(400):
        live = [r for r in to_send if to_send[r] and r in s.requests]
        if live and rng.random() < 0.2:
            r = rng.choice(live)
            sent = to_send[r].pop(0)
            s.add_request(_request(r, [50] * (sent[0] if sent else 1), sent[1] if sent else 1, sent is not None))
        elif len(in_flight) < 2 + profile.endswith("async") and (s.has_unfinished_requests() or rng.random() < 0.3):
            in_flight.append(s.schedule())
        elif in_flight:
            out = in_flight.popleft()
            _complete(s, out, {e.req_id: [EOS if rng.random() < 0.3 else 7] for e in out.entries})
        assert consistency_errors(s) == []
        if not in_flight and not s.requests:
            break
    assert not s.requests and not in_flight and leak_errors(s) == []

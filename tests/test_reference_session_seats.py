"""The reference scheduler (reference/sessions.py) through the scenario of
flightcheck/vllm/session_seat_probe.py (docs/request-states.md, "Finding:
a session stopped while preempted counts a seat it gave up"), observed with
the probe's keys and compared with the spec's run of it
(tests/test_vllm_session_seats.py compares vLLM's with the same): the
reference keeps vLLM's rule, so a differential over such a workload has
nothing to explain."""

from __future__ import annotations

import pytest

from flightcheck.reference.config import SchedulerConfig
from flightcheck.reference.consistency import consistency_errors
from flightcheck.reference.outputs import ModelRunnerOutput, SchedulerOutput
from flightcheck.reference.request import Request, RequestStatus, SamplingParams
from flightcheck.reference.scheduler import Scheduler

from .test_vllm_session_seats import _spec_record

EOS = 2


def _seats(s: Scheduler) -> dict:
    assert consistency_errors(s) == []
    r1 = s.requests["r1"]
    return {"running": sorted(r.request_id for r in s.running),
            "waiting_for_input": s.num_waiting_for_streaming_input,
            "r1": {"status": r1.status.name, "num_computed": r1.num_computed_tokens, "in_flight": r1.num_in_flight_tokens,
                   "stale": r1.num_stale_output_tokens, "drop": r1.drop_stale_output,
                   "blocks": len(s.kv_cache_manager.req_to_blocks.get("r1", ())), "in_waiting": r1 in s.waiting}}


def _complete(s: Scheduler, output: SchedulerOutput, tokens: dict) -> None:
    s.update_from_output(output, ModelRunnerOutput.from_tokens({e.req_id: tokens.get(e.req_id, [])
                                                                for e in output.entries}))


def _reference_record(profile: str) -> dict:
    # max_model_len 12: the reference wants one request of max_model_len to fit the pool (the run stays below it)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=2, max_model_len=12, block_size=4,
                                  num_blocks=3, enable_prefix_caching=False, num_pipeline_stages=3, profile=profile))
    for name, tokens, max_tokens in (("r0", [10, 11, 12, 13], 2), ("r1", [20, 21, 22, 23, 24, 25], 1), ("r2", [30, 31], 1)):
        request = Request(name, tokens, SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
        request.resumable = name == "r1"
        s.add_request(request)
    seen: dict = {"max_num_seqs": 2, "scheduled": []}
    outputs: list[SchedulerOutput] = []

    def schedule() -> None:
        out = s.schedule()
        outputs.append(out)
        seen["scheduled"].append({"tokens": {e.req_id: e.num_new_tokens for e in out.entries},
                                  "preempted": sorted(out.preempted_req_ids)})
    schedule()
    schedule()
    _complete(s, outputs[0], {"r0": [7]})
    for _ in range(3):
        schedule()
        if s.requests["r1"].status is RequestStatus.PREEMPTED:
            break
    seen["preempted"] = _seats(s)
    schedule()
    seen["admitted_past"] = _seats(s)
    _complete(s, outputs[1], {"r1": [9]})
    seen["stopped_while_preempted"] = _seats(s)
    for output in outputs[2:]:
        _complete(s, output, {"r0": [8]})
        if any(e.req_id == "r0" for e in output.entries):
            break
    s.add_request(Request("r3", [30, 31], SamplingParams(max_tokens=1), eos_token_id=EOS))
    schedule()
    seen["seat_lost"] = _seats(s)
    return seen


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
def test_the_reference_parks_the_session_stopped_while_preempted_as_vllm_does(profile: str):
    seen = _reference_record(profile)
    assert seen == _spec_record(profile.endswith("async"))
    stopped = seen["stopped_while_preempted"]
    assert len(stopped["running"]) + stopped["waiting_for_input"] == 3 > seen["max_num_seqs"]

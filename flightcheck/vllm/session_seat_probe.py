"""A streaming session stopped while preempted, through vLLM's real
scheduler (docs/request-states.md, "Finding: a session stopped while
preempted counts a seat it gave up"): runs inside a vLLM venv (0.33, 0.34),
prints one JSON object.

    python -m flightcheck.vllm.session_seat_probe [--async]

The scenario is the explicit model session-seats-k3's shortest SS4
violation (verification/session_models.py) at vLLM's sizes: two seats, a
pool of 3 blocks of 4 (and vLLM's null block), a plain request r0 (a
prompt of 4, max_tokens 2), a session r1 (a prompt of 6, max_tokens 1)
and a plain request r2 (a prompt of 2, max_tokens 1), up to three batches
out. r0's prompt and r1's first chunk, then r1's last chunk, are
scheduled; r0's token returns; r0's decode needs a block and preempts r1,
whose last chunk is still in flight (its deliver-mode stale output); the
next call passes over r1's deferred resumption and admits r2; r1's last
chunk returns with its one token: the stop parks r1
(WAITING_FOR_STREAMING_REQ) beside two running requests. At each step it
records what SS4 reads (`len(running)`, `num_waiting_for_streaming_input`)
and the session's state; tests/test_vllm_session_seats.py compares it with
the spec's run. Then r0's decode returns (r0 finishes) and a fourth
request r3 arrives: the next call admits nobody, the model runner holding
r2 alone (r1's slot went with its preemption, `preempted_req_ids`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .replay_worker import (PLAIN_ASYNC_SCHEDULER, PLAIN_SCHEDULER, SchedulerFactory, make_request,  # noqa: E402
                            resolve_obj_by_qualname)
from .workload import RequestSpec, workload_from_json  # noqa: E402
from . import compat  # noqa: E402


def _workload(async_scheduling: bool) -> Any:
    return workload_from_json({
        "name": "session-seat-probe", "seed": 0,
        "config": {"num_stages": 3, "max_num_batched_tokens": 8, "max_num_seqs": 2, "block_size": 4,
                   "num_blocks": 4, "max_model_len": 32, "prefix_caching": False,
                   "async_scheduling": async_scheduling},
        "requests": [{"id": "r0", "prompt_len": 4, "max_tokens": 2},
                     {"id": "r1", "prompt_len": 6, "max_tokens": 1},
                     {"id": "r2", "prompt_len": 2, "max_tokens": 1}]})


def _seats(scheduler: Any) -> dict[str, Any]:
    """What SS4 reads, and where the session is."""
    r1 = scheduler.requests.get("r1")
    return {"running": sorted(r.request_id for r in scheduler.running),
            "waiting_for_input": scheduler.num_waiting_for_streaming_input,
            "r1": None if r1 is None else {
                "status": r1.status.name, "num_computed": r1.num_computed_tokens, "in_flight": r1.num_in_flight_tokens,
                "stale": r1.num_stale_output_tokens, "drop": r1.drop_stale_output,
                "blocks": len(scheduler.kv_cache_manager.get_block_ids("r1")[0]),
                "in_waiting": r1 in list(scheduler.waiting)}}


def _complete(scheduler: Any, output: Any, tokens: dict[str, list[int]]) -> None:
    ids = list(output.num_scheduled_tokens)
    scheduler.update_from_output(output, compat.model_runner_output(ids, [tokens.get(i, []) for i in ids]))


def probe(async_scheduling: bool) -> dict[str, Any]:
    workload = _workload(async_scheduling)
    cls = resolve_obj_by_qualname(PLAIN_ASYNC_SCHEDULER if async_scheduling else PLAIN_SCHEDULER)
    scheduler = SchedulerFactory().build(cls, workload.config)
    for spec in workload.requests:
        request = make_request(spec, workload)
        request.resumable = spec.req_id == "r1"
        scheduler.add_request(request)
    seen: dict[str, Any] = {"max_num_seqs": workload.config.max_num_seqs, "scheduled": []}
    outputs = []
    def schedule() -> None:
        out = scheduler.schedule()
        outputs.append(out)
        seen["scheduled"].append({"tokens": dict(out.num_scheduled_tokens),
                                  "preempted": sorted(getattr(out, "preempted_req_ids", None) or ())})
    schedule()                                          # r0's prompt, r1's first chunk
    schedule()                                          # r1's last chunk (async: r0's decode ahead too)
    _complete(scheduler, outputs[0], {"r0": [7]})       # r0's prompt token
    for _ in range(3):                                  # r0's decode needs a block: r1 is the victim
        schedule()                                      # (async: after an empty call, r0's decode gated)
        if scheduler.requests["r1"].status.name == "PREEMPTED":
            break
    seen["preempted"] = _seats(scheduler)
    schedule()                                          # r1's resumption deferred; r2 admitted
    seen["admitted_past"] = _seats(scheduler)
    _complete(scheduler, outputs[1], {"r1": [9]})       # r1's last chunk: one token, its max_tokens
    seen["stopped_while_preempted"] = _seats(scheduler)
    for output in outputs[2:]:                          # up to r0's decode: r0 finishes, r2 still runs
        _complete(scheduler, output, {"r0": [8]})
        if "r0" in output.num_scheduled_tokens:
            break
    late = RequestSpec(**{**workload.requests[2].__dict__, "req_id": "r3"})
    scheduler.add_request(make_request(late, workload))
    schedule()                                          # r3 waits: r2 and the parked r1 fill the count
    seen["seat_lost"] = _seats(scheduler)
    return seen


def main() -> int:
    print(json.dumps(probe("--async" in sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A streaming session through vLLM's real scheduler, step by step, with
what the spec reads at each step (docs/request-states.md, "Streaming
sessions"): runs inside a vLLM venv (0.33, 0.34), prints one JSON object.

    python -m flightcheck.vllm.session_probe [--async]

The scenario (one seat, a session r0 and a plain request r1): r0's prompt
is scheduled and, under async scheduling, its next decode ahead of the
prompt's token; the prompt's token is EOS, so r0 stops with that decode in
flight and parks (WAITING_FOR_STREAMING_REQ); a schedule admits nothing
(r0 holds the seat); r0's next input (2 tokens, max_tokens 2) arrives
under its live id; a schedule runs r0's next turn; the old decode returns
(dropped) and then the new turn's output (kept). tests/test_vllm_sessions.py
compares the observations with the spec's reading.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .replay_worker import (PLAIN_ASYNC_SCHEDULER, PLAIN_SCHEDULER, SchedulerFactory, make_request,  # noqa: E402
                            resolve_obj_by_qualname)
from .workload import RequestSpec, workload_from_json  # noqa: E402
from . import compat  # noqa: E402

EOS = 2


def _workload(async_scheduling: bool) -> Any:
    return workload_from_json({
        "name": "session-probe", "seed": 0,
        "config": {"num_stages": 1, "max_num_batched_tokens": 32, "max_num_seqs": 1, "block_size": 4,
                   "num_blocks": 16, "max_model_len": 64, "prefix_caching": False,
                   "async_scheduling": async_scheduling},
        "requests": [{"id": "r0", "prompt_len": 6, "max_tokens": 4},
                     {"id": "r1", "prompt_len": 3, "max_tokens": 1}]})


def _request(spec: RequestSpec, workload: Any, resumable: bool, prompt: list[int] | None = None,
             max_tokens: int | None = None) -> Any:
    if prompt is not None:
        spec = RequestSpec(**{**spec.__dict__, "prompt_token_ids": tuple(prompt),
                              "max_tokens": max_tokens or spec.max_tokens})
    request = make_request(spec, workload)
    request.resumable = resumable
    return request


def _look(scheduler: Any, req_id: str = "r0") -> dict[str, Any]:
    r = scheduler.requests.get(req_id)
    if r is None:
        return {"gone": True}
    blocks = scheduler.kv_cache_manager.get_block_ids(req_id)[0]
    return {"status": r.status.name, "num_computed": r.num_computed_tokens, "num_tokens": r.num_tokens,
            "num_prompt": r.num_prompt_tokens, "num_output": len(r.output_token_ids),
            "in_flight": r.num_in_flight_tokens, "stale": r.num_stale_output_tokens,
            "drop": r.drop_stale_output, "placeholders": r.num_output_placeholders, "blocks": len(blocks),
            "in_kv_holding": r in list(scheduler.kv_holding_waiting),
            "in_waiting": r in list(scheduler.waiting), "running": r in scheduler.running,
            "waiting_for_input": scheduler.num_waiting_for_streaming_input}


def _scheduled(output: Any) -> dict[str, int]:
    return dict(output.num_scheduled_tokens)


def _complete(scheduler: Any, output: Any, tokens: dict[str, list[int]]) -> None:
    ids = list(output.num_scheduled_tokens)
    scheduler.update_from_output(output, compat.model_runner_output(ids, [tokens.get(i, []) for i in ids]))


def probe(async_scheduling: bool) -> dict[str, Any]:
    workload = _workload(async_scheduling)
    cls = resolve_obj_by_qualname(PLAIN_ASYNC_SCHEDULER if async_scheduling else PLAIN_SCHEDULER)
    scheduler = SchedulerFactory().build(cls, workload.config)
    r0, r1 = workload.requests
    scheduler.add_request(_request(r0, workload, True))
    scheduler.add_request(_request(r1, workload, False))
    seen: dict[str, Any] = {}
    first = scheduler.schedule()
    seen["first"] = _scheduled(first)
    second = scheduler.schedule() if async_scheduling else None      # the decode ahead of the token
    seen["second"] = _scheduled(second) if second is not None else {}
    _complete(scheduler, first, {"r0": [EOS]})
    seen["stopped"] = _look(scheduler)
    parked = scheduler.schedule()
    seen["while_parked"] = _scheduled(parked)
    scheduler.add_request(_request(r0, workload, True, prompt=[100, 101], max_tokens=2))
    seen["input_taken"] = _look(scheduler)
    resumed = scheduler.schedule()
    seen["resumed"] = _scheduled(resumed)
    if second is not None:
        _complete(scheduler, second, {"r0": [7]})
        seen["old_output_returned"] = _look(scheduler)
    _complete(scheduler, parked, {})
    _complete(scheduler, resumed, {"r0": [9]})
    seen["new_output_returned"] = _look(scheduler)
    return seen


def main() -> int:
    print(json.dumps(probe("--async" in sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

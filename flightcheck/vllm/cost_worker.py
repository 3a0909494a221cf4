"""The vLLM side of `benchmarks/scheduler_cost.py`: runs inside a vLLM venv
and drives vLLM's own `Scheduler` through the engine loop and workloads of
`cost.py`, a few batches at a time, while the benchmark drives our reference
in its own process between those turns.

    python -m flightcheck.vllm.cost_worker      (started by the benchmark)

One command per input line, one answer per output line:
* `{"start": CASE, "seed": S}`: build the scheduler (`replay_worker`'s
  `SchedulerFactory`, the replay's builder; vLLM's plain `Scheduler`,
  resolved by its qualified name), add the case's requests, run to the steady
  state, then freeze the heap (`gc.freeze()`, as vLLM's engine core does
  after start-up). Answer: `{"running": N}`.
* `{"batches": B}`: run B more timed batches. Answer: `{"records": [...]}`,
  each `[schedule ns, update_from_output ns, entries, tokens, running]`.
* `{"stop": true}`: unfreeze and drop the case. Answer: `{}`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

from .replay_worker import PLAIN_SCHEDULER, SchedulerFactory  # noqa: E402 (imports vLLM)

import vllm  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from .compat import model_runner_output, resolve_obj_by_qualname  # noqa: E402

from .cost import EngineLoop, RequestSpec, stand_in_token, workload_of_case  # noqa: E402
from .workload import ReplayConfig  # noqa: E402


def make_request(spec: RequestSpec) -> Request:
    """A vLLM Request as `EngineCore.add_request` makes one; no EOS, no stop
    tokens (the reference side's requests have none either)."""
    return Request(request_id=spec.req_id, prompt_token_ids=spec.prompt_token_ids,
                   multi_modal_inputs=None, multi_modal_hashes=None, multi_modal_placeholders=None,
                   sampling_params=SamplingParams(max_tokens=spec.max_tokens), eos_token_id=None,
                   arrival_time=0.0, lora_request=None)


def stand_in_model(scheduler: Any, output: Any, step: int) -> tuple[Any, int]:
    """A token for every entry that reaches its request's known tokens, as
    vLLM's model runner samples; a partial prefill chunk gets none. `schedule()`
    has already advanced `num_computed_tokens` past the batch."""
    req_ids = list(output.num_scheduled_tokens)
    requests = scheduler.requests
    sampled = [[stand_in_token(step, i)] if requests[r].num_computed_tokens >= requests[r].num_tokens else []
               for i, r in enumerate(req_ids)]
    # (the fields this vLLM has: compat.py; 0.34 takes no `req_id_to_index`)
    return model_runner_output(req_ids, sampled), len(req_ids)


def build_loop(factory: SchedulerFactory, case: str, seed: int) -> EngineLoop:
    workload = workload_of_case(case, seed)
    settings = workload.settings()
    config = ReplayConfig(
        num_stages=settings["num_pipeline_stages"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_num_seqs=settings["max_num_seqs"], block_size=settings["block_size"],
        num_blocks=settings["num_blocks"] + 1,       # vLLM keeps block 0 as its null block
        max_model_len=settings["max_model_len"], long_prefill_token_threshold=0,
        prefix_caching=settings["enable_prefix_caching"])
    scheduler = factory.build(resolve_obj_by_qualname(PLAIN_SCHEDULER), config)
    return EngineLoop(workload, scheduler, make_request, stand_in_model)


def main() -> int:
    # vLLM may print to stdout; answers go to the original stdout only.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    factory = SchedulerFactory()
    answers.write(json.dumps({"ready": vllm.__version__}) + "\n")
    loop: EngineLoop | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            if "start" in command:
                loop = build_loop(factory, command["start"], command["seed"])
                loop.warm_up()
                gc.collect()
                gc.freeze()
                answer: dict[str, Any] = {"running": len(loop.sched.running)}
            elif "batches" in command:
                assert loop is not None, "no case started"
                records: list = []
                while len(records) < command["batches"]:
                    loop.next_batch(records)
                answer = {"records": records}
            else:
                loop = None
                gc.unfreeze()
                gc.collect()
                answer = {}
        except Exception as err:  # reported to the benchmark, which stops with it
            answer = {"error": f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

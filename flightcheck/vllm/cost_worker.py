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
from typing import Any, Callable

from . import compat  # noqa: E402  (standard library; imports vLLM only when called)

if __name__ == "__main__":
    compat.exit_if_incompatible()          # one line, exit 2: before vLLM is imported

from .replay_worker import PLAIN_SCHEDULER, SchedulerFactory  # noqa: E402 (imports vLLM)
from .replay_worker import make_request as replay_request  # noqa: E402

import vllm  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from .compat import model_runner_output, resolve_obj_by_qualname  # noqa: E402

from .cost import EngineLoop, RequestSpec, stand_in_token, workload_of_case  # noqa: E402
from .workload import ReplayConfig, Workload  # noqa: E402
from .workload import RequestSpec as ReplaySpec  # noqa: E402


def request_maker(config: ReplayConfig) -> Callable[[RequestSpec], Request]:
    """Builds vLLM Requests as `EngineCore.add_request` makes them, with the
    replay's own constructor (each release's arguments: replay_worker.py);
    no EOS, no stop tokens (the reference side's requests have none either)."""
    workload = Workload(name="cost", seed=0, config=config, requests=(), eos_token_id=None,  # type: ignore[arg-type]
                        max_steps=1)

    def make_request(spec: RequestSpec) -> Request:
        return replay_request(ReplaySpec(req_id=spec.req_id, prompt_token_ids=tuple(spec.prompt_token_ids),
                                         max_tokens=spec.max_tokens, arrival_step=0, abort_step=None,
                                         eos_probability=0.0, ignore_eos=False), workload)
    return make_request


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
    return EngineLoop(workload, scheduler, request_maker(config), stand_in_model)


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

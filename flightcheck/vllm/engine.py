"""The engine around vLLM's scheduler in a replay: our own copy of each
version's batch-queue step and busy loop, and a fabricated model.

vLLM's batch queue lives in the engine core, not in the scheduler
(`EngineCore.step_with_batch_queue`, `vllm/v1/engine/core.py`), so a program
that drives the real scheduler must reproduce that loop; this is our own
code, written from the behaviour of:

* 0.8.5 `step_with_batch_queue`: call `schedule()` whenever the queue has
  room; enqueue the output only if it has tokens; if nothing was enqueued and
  the queue is not empty, block on the oldest batch and hand its output to
  `update_from_output`.
* 0.8.4 `step_with_batch_queue`: the same, but `schedule()` is called only
  while `get_num_unscheduled_requests() > 0` (requests not in
  `scheduled_req_ids`).
* both `EngineCoreProc.run_busy_loop` / `_process_input_queue`: input (adds,
  aborts) is handled between steps; while `scheduler.has_requests()` is false
  the engine blocks on its input queue, whatever is still in the batch queue.

The model is fabricated, like vLLM's model runner as far as the scheduler can
tell (`GPUModelRunner._update_states` and `execute_model`, 0.8.5): it keeps
per request the number of tokens it has been told of (the prompt, then
`num_computed_tokens + len(new_token_ids)` of each cached-request entry),
drops that state for `finished_req_ids`, and samples one token for an entry
exactly when `num_computed_tokens + num_scheduled_tokens` reaches it; a
partial prefill chunk returns no token. Tokens are seeded per request and
position (workload.sampled_token). Standard library only.
"""

from __future__ import annotations

import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .workload import RequestSpec, Workload, sampled_token


class FabricatedModel:
    """Returns, per batch, what vLLM's model runner would return: the
    sampled tokens of the entries that reach their known tokens."""

    def __init__(self, workload: Workload, make_output: Callable[..., Any]) -> None:
        self._workload = workload
        self._specs = {spec.req_id: spec for spec in workload.requests}
        self._make_output = make_output
        self._known_tokens: dict[str, int] = {}

    def execute(self, scheduler_output: Any) -> Any:
        for req_id in scheduler_output.finished_req_ids:
            self._known_tokens.pop(req_id, None)
        starts: dict[str, int] = {}
        for data in scheduler_output.scheduled_new_reqs:
            self._known_tokens[data.req_id] = len(data.prompt_token_ids)
            starts[data.req_id] = data.num_computed_tokens
        for data in scheduler_output.scheduled_cached_reqs:
            told = data.num_computed_tokens + len(data.new_token_ids)
            self._known_tokens[data.req_id] = max(self._known_tokens.get(data.req_id, 0), told)
            starts[data.req_id] = data.num_computed_tokens
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            end = starts[req_id] + scheduler_output.num_scheduled_tokens[req_id]
            if end >= self._known_tokens[req_id]:
                sampled.append([sampled_token(self._workload, self._specs[req_id], end)])
            else:
                sampled.append([])              # a partial prefill: nothing sampled
        return self._make_output(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled, spec_token_ids=None, logprobs=None,
                                 prompt_logprobs_dict={})


class BatchQueueEngine:
    """One engine core with a batch queue of `depth` (= pipeline stages)."""

    def __init__(self, scheduler: Any, model: FabricatedModel, depth: int,
                 schedules_only_unscheduled: bool) -> None:
        self.scheduler = scheduler
        self.model = model
        self.depth = depth
        # 0.8.4's gate: schedule only while some request is not in flight.
        self.schedules_only_unscheduled = schedules_only_unscheduled
        self.batch_queue: deque[tuple[Any, Any]] = deque()
        self.outputs: list[tuple[str, tuple[int, ...], str | None]] = []
        self.batches: list[dict[str, int]] = []

    def step_with_batch_queue(self) -> bool:
        """One engine step; True when it scheduled or completed a batch."""
        scheduled = False
        may_schedule = len(self.batch_queue) < self.depth
        if may_schedule and self.schedules_only_unscheduled:
            may_schedule = self.scheduler.get_num_unscheduled_requests() > 0
        if may_schedule:
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.total_num_scheduled_tokens > 0:
                # The model reads the batch when it is submitted, as a real
                # executor does; it must not see later schedule() calls.
                result = self.model.execute(scheduler_output)
                self.batch_queue.append((scheduler_output, result))
                self.batches.append(dict(scheduler_output.num_scheduled_tokens))
                scheduled = True
        if scheduled or not self.batch_queue:
            return scheduled
        scheduler_output, result = self.batch_queue.popleft()
        engine_outputs = self.scheduler.update_from_output(scheduler_output, result)
        for out in engine_outputs.outputs:
            reason = out.finish_reason
            self.outputs.append((out.request_id, tuple(out.new_token_ids),
                                 None if reason is None else str(reason)))
        return True


ENGINE_GATES = {"0.8.5": False, "0.8.4": True}   # does the version gate schedule() on unscheduled requests?


@dataclass
class RunOutcome:
    """How a replay ended, read from vLLM's and the engine's state."""
    ending: str                       # done | stuck | blocked_in_flight | exception | step_limit
    steps: int
    batches_in_flight: int
    exception: str | None = None
    unfinished: list[str] = field(default_factory=list)


IDLE_STEPS_FOR_STUCK = 4              # steps that neither schedule nor complete, nothing to come


def run_busy_loop(engine: BatchQueueEngine, workload: Workload,
                  add_request: Callable[[RequestSpec], None], abort_request: Callable[[str], None]) -> RunOutcome:
    """vLLM's busy loop, with input delivered at the workload's steps."""
    inputs = sorted([(spec.arrival_step, 0, spec.req_id, spec) for spec in workload.requests]
                    + [(spec.abort_step, 1, spec.req_id, spec) for spec in workload.requests
                       if spec.abort_step is not None], key=lambda x: (x[0], x[1]))
    pending = deque(inputs)
    step, idle = 0, 0
    scheduler = engine.scheduler
    try:
        while True:
            while pending and pending[0][0] <= step:       # _process_input_queue
                _, kind, req_id, spec = pending.popleft()
                if kind == 0:
                    add_request(spec)
                else:
                    abort_request(req_id)
            if not scheduler.has_requests():               # blocks on the input queue
                if pending:
                    step = pending[0][0]
                    continue
                ending = "blocked_in_flight" if engine.batch_queue else "done"
                return RunOutcome(ending, step, len(engine.batch_queue))
            progressed = engine.step_with_batch_queue()
            step += 1
            idle = 0 if progressed else idle + 1
            if idle >= IDLE_STEPS_FOR_STUCK:
                if pending:                                # it spins until the input arrives
                    step, idle = max(step, pending[0][0]), 0
                    continue
                unfinished = _unfinished(scheduler)
                if not unfinished and not engine.batch_queue:
                    # 0.8.4 flushes finished ids only in schedule(), which its
                    # gate no longer calls: has_requests() stays true and the
                    # engine spins idle until the next input. Nothing is left.
                    return RunOutcome("done", step, 0)
                return RunOutcome("stuck", step, len(engine.batch_queue), unfinished=unfinished)
            if step >= workload.max_steps:
                return RunOutcome("step_limit", step, len(engine.batch_queue), unfinished=_unfinished(scheduler))
    except Exception as err:  # an exception inside vLLM ends the run, as it kills an engine core
        return RunOutcome("exception", step, len(engine.batch_queue), exception=_where(err),
                          unfinished=_unfinished(scheduler))


def _where(err: Exception) -> str:
    """The exception and the innermost line that raised it (an assert's
    message is often empty: the line says which one failed)."""
    frames = traceback.extract_tb(err.__traceback__)
    text = f"{type(err).__name__}: {err}".rstrip(": ")
    if not frames:
        return text
    last = frames[-1]
    path = last.filename.split("site-packages/")[-1]
    return f"{text} at {path}:{last.lineno} in {last.name}: {(last.line or '').strip()}"


def _unfinished(scheduler: Any) -> list[str]:
    return sorted(r.request_id for r in list(scheduler.waiting) + list(scheduler.running))

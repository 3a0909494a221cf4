"""The engine core's loop with a batch queue (vLLM 0.8.5
`EngineCore.step_with_batch_queue`, notes §2.6).

The queue holds up to `num_pipeline_stages` batches in flight. One `step()`:
* if the queue has room (and, one-batch-per-request, some request is not in
  flight: vLLM <= 0.8.4's `get_num_unscheduled_requests() > 0` gate), form a
  batch; if it has tokens, submit it and return None;
* otherwise, or when nothing could be scheduled, block on the OLDEST batch
  and apply its output (batches complete FIFO: every stage runs them in order).

`schedule_step()` and `complete_oldest_step()` are the two halves, for a
harness that chooses the interleaving itself.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from .outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from .request import Request, RequestStatus
from .scheduler import Scheduler


class Future(Protocol):
    """What `Executor.submit` returns; concurrent.futures.Future qualifies."""

    def result(self, timeout: float | None = None) -> ModelRunnerOutput: ...

    def done(self) -> bool: ...


class Executor(Protocol):
    """The seam between scheduler and model: in-process, pipelined, simulated."""

    def submit(self, scheduler_output: SchedulerOutput) -> Future: ...


class Engine:
    def __init__(self, scheduler: Scheduler, executor: Executor) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.max_concurrent_batches = scheduler.config.num_pipeline_stages
        self.batch_queue: deque[tuple[SchedulerOutput, Future]] = deque()

    # -- requests -----------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> None:
        """Abort, whatever the request is doing; an unknown id is a no-op."""
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_in_flight_batches(self) -> int:
        return len(self.batch_queue)

    # -- the loop -------------------------------------------------------------

    def can_schedule(self) -> bool:
        if len(self.batch_queue) >= self.max_concurrent_batches:
            return False
        if not self.scheduler.config.continue_prefill:
            return self.scheduler.get_num_unscheduled_requests() > 0
        return True

    def can_complete(self) -> bool:
        return bool(self.batch_queue)

    def step(self) -> list[EngineCoreOutput] | None:
        """None if a batch was submitted (or nothing could happen); else the
        outputs of the oldest batch, which it waited for."""
        if self.can_schedule() and self.schedule_step() is not None:
            return None
        if self.batch_queue:
            return self.complete_oldest_step()
        return None

    def schedule_step(self) -> SchedulerOutput | None:
        """Form a batch and submit it; None (and nothing submitted) if it is
        empty. The caller must check `can_schedule()` first."""
        if not self.can_schedule():
            raise RuntimeError("schedule_step() while the engine may not schedule "
                               "(batch queue full, or nothing unscheduled)")
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.total_num_scheduled_tokens == 0:
            return None
        self.batch_queue.append((scheduler_output, self.executor.submit(scheduler_output)))
        return scheduler_output

    def complete_oldest_step(self) -> list[EngineCoreOutput]:
        """Block on the oldest batch in flight and apply its output."""
        if not self.batch_queue:
            raise RuntimeError("complete_oldest_step() with no batch in flight")
        scheduler_output, future = self.batch_queue.popleft()
        model_runner_output = future.result()
        return self.scheduler.update_from_output(scheduler_output, model_runner_output)

    def run(self, max_steps: int = 1_000_000) -> list[EngineCoreOutput]:
        """Step until every request has finished and no batch is in flight.
        Raises RuntimeError when stuck (nothing to do but requests unfinished)
        or after `max_steps`."""
        outputs: list[EngineCoreOutput] = []
        idle_steps = 0
        for _ in range(max_steps):
            if not self.has_unfinished_requests() and not self.batch_queue:
                return outputs
            result = self.step()
            if result is not None:
                outputs.extend(result)
            # Idle: nothing submitted, nothing completed. One idle step can be a
            # preemption that frees room for the next; two in a row are a hang.
            idle_steps = idle_steps + 1 if result is None and not self.batch_queue else 0
            if idle_steps >= 2:
                raise RuntimeError("engine stuck: unfinished requests, nothing schedulable, "
                                   "nothing in flight")
        raise RuntimeError(f"engine did not finish within {max_steps} steps")

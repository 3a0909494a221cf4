"""The engine core's step with a batch queue (vLLM 0.8.5
`EngineCore.step_with_batch_queue`, docs/vllm-semantics.md §"The engine loop").

The queue holds up to `num_pipeline_stages` batches in flight (one more under
vLLM 0.33's async scheduling: drive.py `VLLM_0_33_ASYNC_LOOP`). One `step()`:
* if the engine loop lets it schedule (drive.py's `EngineLoop`: the queue
  has room and, in vLLM 0.8.4's loop, some request is not in flight), form a
  batch; if it has tokens, submit it and return None;
* otherwise, or when nothing could be scheduled, block on the OLDEST batch
  and apply its output (batches complete FIFO: every stage runs them in order).

`schedule_step()` (vLLM 0.33's loop: `enqueue_step()`, which queues an
empty batch too) and `complete_oldest_step()` are the two halves, for a
harness that chooses the interleaving itself; `run()` steps until nothing
can move (drive.py's `drive`, the loop the runtime and the simulator share).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from .config import SchedulerConfig
from .drive import LOOPS, EngineLoop, drive, loop_for_policy
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


def loop_for_config(config: SchedulerConfig) -> EngineLoop:
    """The engine loop of the config's vLLM version: 0.33's for the 0.33
    profile; for 0.8.x the one the scheduling policy shipped with."""
    loop = LOOPS[config.version_profile.engine_loop]
    return loop if loop.enqueues_empty_batches else loop_for_policy(config.continue_prefill)


class Engine:
    def __init__(self, scheduler: Scheduler, executor: Executor,
                 loop: EngineLoop | None = None) -> None:
        """`loop`: the vLLM version's engine loop; by default the config's
        (`loop_for_config`)."""
        self.scheduler = scheduler
        self.executor = executor
        self.loop = loop if loop is not None else loop_for_config(scheduler.config)
        self.max_concurrent_batches = self.loop.queue_depth(scheduler.config.num_pipeline_stages)
        self.batch_queue: deque[tuple[SchedulerOutput, Future]] = deque()
        self.num_submitted_batches = 0

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
        """Batches in the queue (vLLM 0.33's empty ones included)."""
        return len(self.batch_queue)

    @property
    def num_token_batches_in_flight(self) -> int:
        return sum(1 for output, _ in self.batch_queue if output.total_num_scheduled_tokens)

    # -- the loop -------------------------------------------------------------

    def can_schedule(self) -> bool:
        return self.loop.can_schedule(len(self.batch_queue), self.max_concurrent_batches,
                                      self.scheduler)

    def can_complete(self) -> bool:
        return bool(self.batch_queue)

    def step(self) -> list[EngineCoreOutput] | None:
        """None if a batch was submitted (or nothing could happen); else the
        outputs of the oldest batch, which it waited for (vLLM 0.33's loop: None
        also when that batch was empty)."""
        if self.loop.enqueues_empty_batches:
            return self._step_queueing_empty_batches()
        if self.can_schedule() and self.schedule_step() is not None:
            return None
        if self.batch_queue:
            return self.complete_oldest_step()
        return None

    def _step_queueing_empty_batches(self) -> list[EngineCoreOutput] | None:
        """vLLM 0.33 `EngineCore.step_with_batch_queue`: schedule whenever the
        scheduler `has_requests()` and queue the output even with 0 tokens;
        return without completing iff the queue still has room and the call
        ran tokens or requests are left; otherwise complete the oldest batch."""
        if self.scheduler.has_requests():
            ran = self.enqueue_step().total_num_scheduled_tokens > 0
            if len(self.batch_queue) < self.max_concurrent_batches and (
                    ran or self.scheduler.has_requests()):
                return None
        elif not self.batch_queue:
            return None
        empty = self.batch_queue[0][0].total_num_scheduled_tokens == 0
        outputs = self.complete_oldest_step()
        return None if empty else outputs

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
        self.num_submitted_batches += 1
        return scheduler_output

    def enqueue_step(self) -> SchedulerOutput:
        """vLLM 0.33's half of a step that schedules: form a batch and queue
        it, empty or not (an empty one takes a slot and carries finished and
        preempted ids). For a harness that chooses the interleaving itself."""
        if len(self.batch_queue) >= self.max_concurrent_batches:
            raise RuntimeError("vLLM 0.33's step with a full batch queue")
        scheduler_output = self.scheduler.schedule()
        self.batch_queue.append((scheduler_output, self.executor.submit(scheduler_output)))
        self.num_submitted_batches += scheduler_output.total_num_scheduled_tokens > 0
        return scheduler_output

    def complete_oldest_step(self) -> list[EngineCoreOutput]:
        """Block on the oldest batch in flight and apply its output."""
        if not self.batch_queue:
            raise RuntimeError("complete_oldest_step() with no batch in flight")
        scheduler_output, future = self.batch_queue.popleft()
        model_runner_output = future.result()
        return self.scheduler.update_from_output(scheduler_output, model_runner_output)

    def run(self, max_steps: int = 1_000_000) -> list[EngineCoreOutput]:
        """Step until every request has finished and no batch is in flight;
        return every output. Raises RuntimeError when stuck (nothing to do but
        requests unfinished) or when more than `max_steps` steps would be needed."""
        outputs: list[EngineCoreOutput] = []
        drive(self, on_outputs=outputs.extend, max_steps=max_steps)
        return outputs

"""The reference's trace writer with times: every event gets `t` (seconds on
the run's clock, virtual or wall), and `stage` events record when each stage
ran each batch (DESIGN.md's trace format: `{"ev":"stage","batch","stage",
"t0","t1"}`).

Under async scheduling (`vllm-0.33-async`) it also notes vLLM 0.33's empty
batches, which the reference's writer leaves out: every `schedule()` call
counts for the decode stagger and every empty batch takes a queue slot, and
the trace's `step` counts the scheduler's calls (schedule and update alike),
not engine steps, so a checker could not count them from step gaps. As vLLM's
recorder does (docs/trace-format.md): `notes_empty_batches: true` in the
config, `empty_batch` on a `schedule` event that only preempted, and
`empty_batches_before` on the next event for the others. `EmptyBatchNotes`,
around the scheduler, reports the calls (`empty_scheduled`,
`empty_completed`); the simulator and `flightcheck bench` both use it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from flightcheck.reference import (ModelRunnerOutput, Scheduler, SchedulerConfig, SchedulerOutput,
                                   TraceWriter)


class TimedTraceWriter(TraceWriter):
    def __init__(self, sink: TextIO, now: Callable[[], float], **kwargs: Any) -> None:
        super().__init__(sink, **kwargs)
        self._now = now
        self.notes_empty_batches = False          # set by config() under async scheduling
        self._num_empty_batches = 0
        self._empty_in_flight: deque[int] = deque()   # queued empty batches' numbers, FIFO
        self._empty_log: list[dict[str, Any]] = []    # noted since the last event written
        self._empty_batch_of_next_schedule: int | None = None

    @classmethod
    def to_path(cls, path: str, now: Callable[[], float], **kwargs: Any) -> "TimedTraceWriter":  # type: ignore[override]
        return cls(open(path, "w", buffering=1 << 16), now, **kwargs)

    def config(self, cfg: SchedulerConfig) -> None:
        self.notes_empty_batches = cfg.async_scheduling
        super().config(cfg)

    def schedule(self, output: SchedulerOutput, step: int,
                 placeholders: dict[str, int] | None = None) -> None:
        if self.notes_empty_batches and not output.entries:
            # Preempted and scheduled nothing: the empty batch it queued.
            self._empty_batch_of_next_schedule = self._queue_empty_batch()
        super().schedule(output, step, placeholders)

    def empty_scheduled(self, step: int) -> None:
        """A schedule() call that queued an empty batch and wrote no event."""
        if self.notes_empty_batches:
            self._empty_log.append({"ev": "schedule", "empty_batch": self._queue_empty_batch(),
                                    "step": step})

    def empty_completed(self, step: int) -> None:
        """update_from_output() of an empty batch (the oldest in flight)."""
        if self.notes_empty_batches and self._empty_in_flight:
            self._empty_log.append({"ev": "complete", "empty_batch": self._empty_in_flight.popleft(),
                                    "step": step})

    def _queue_empty_batch(self) -> int:
        self._num_empty_batches += 1
        self._empty_in_flight.append(self._num_empty_batches)
        return self._num_empty_batches

    def _write(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "config" and self.notes_empty_batches:
            event["notes_empty_batches"] = True
        if kind == "schedule" and self._empty_batch_of_next_schedule is not None:
            event["empty_batch"] = self._empty_batch_of_next_schedule
            self._empty_batch_of_next_schedule = None
        if self._empty_log and kind not in ("config", "end"):
            event["empty_batches_before"], self._empty_log = self._empty_log, []
        if "t" not in event and kind != "end":
            event["t"] = round(self._now(), 7)
        super()._write(event)

    def stage(self, batch_id: int | None, stage: int, t0: float, t1: float,
              recv: float | None = None) -> None:
        """`recv` (optional): when the stage posted the receive of the
        batch's activations, so t0 - recv is the wait for the transfer."""
        event = {"ev": "stage", "batch": batch_id, "stage": stage,
                 "t0": round(t0, 7), "t1": round(t1, 7)}
        if recv is not None:
            event["recv"] = round(recv, 7)
        self._write(event)


class EmptyBatchNotes:
    """The scheduler as the engine sees it, every call forwarded unchanged;
    a `schedule()` that queued an empty batch without writing an event, and
    the `update_from_output()` of an empty batch, are told to the writer."""

    def __init__(self, scheduler: Scheduler, trace: TimedTraceWriter) -> None:
        self._scheduler = scheduler
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def schedule(self) -> SchedulerOutput:
        output = self._scheduler.schedule()
        if not output.entries and not output.preempted_req_ids:
            self._trace.empty_scheduled(self._scheduler.num_steps)
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list:
        outputs = self._scheduler.update_from_output(scheduler_output, model_runner_output)
        if not scheduler_output.entries:
            self._trace.empty_completed(self._scheduler.num_steps)
        return outputs

"""The reference `Scheduler` as the simulated engine sees it: every call is
forwarded unchanged, and the engine thread's CPU time for `schedule()` and
`update_from_output()` is charged to the virtual clock (vLLM's engine core
is one thread: while it schedules, nothing is submitted).

It also measures the real wall time spent inside the reference scheduler, so
a run can show that the simulator's per-step cost is the scheduler's.
"""

from __future__ import annotations

import time
from typing import Any

from flightcheck.reference import ModelRunnerOutput, Scheduler, SchedulerOutput

from .clock import VirtualClock
from .cost_model import CostParams


class ChargedScheduler:
    def __init__(self, scheduler: Scheduler, clock: VirtualClock, params: CostParams) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._params = params
        self.wall_seconds = 0.0        # real time inside schedule() + update_from_output()
        self.num_schedule_calls = 0
        self.num_update_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    def schedule(self) -> SchedulerOutput:
        t0 = time.perf_counter()
        output = self._scheduler.schedule()
        self.wall_seconds += time.perf_counter() - t0
        self.num_schedule_calls += 1
        p = self._params
        self._clock.advance(p.sched_fixed_s + p.sched_per_running_s * len(self._scheduler.running))
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list:
        t0 = time.perf_counter()
        outputs = self._scheduler.update_from_output(scheduler_output, model_runner_output)
        self.wall_seconds += time.perf_counter() - t0
        self.num_update_calls += 1
        p = self._params
        self._clock.advance(p.update_fixed_s + p.update_per_entry_s * len(scheduler_output.entries))
        return outputs

"""A serving benchmark against a real executor in wall-clock time: the seam
`flightcheck bench` uses for the PyTorch runtime (runtime/), and any other
`Executor` (reference/engine.py) that returns real futures.

Same scheduler, engine loop, client and metrics as the simulator; only the
clock (wall, sleeping until send times) and the executor differ. An executor
that wants its stage timings in the trace calls `trace.stage(batch, stage,
t0, t1)` with times from `clock.now()`; `make_executor` receives both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flightcheck.reference import Engine, Executor, Request, SchedulerConfig, make_scheduler

from .clock import WallClock
from .metrics import DEFAULT_PERCENTILES, BenchmarkMetrics, compute_metrics
from .serving import make_request, serve
from .timed_trace import TimedTraceWriter
from .workload import RequestSpec, Workload

ExecutorFactory = Callable[[WallClock, "TimedTraceWriter | None"], Executor]


def epoch_stage_recorder(trace: TimedTraceWriter, clock: WallClock
                         ) -> Callable[[int, Sequence[Sequence[float]]], None]:
    """A callback(batch_id, [(t0, t1[, recv]) per stage]) for executors that
    time stages with `time.time()` (in any process of this machine): it
    writes them as stage events on the run's clock (`recv`, when given: when
    the stage posted the receive of the batch's activations)."""
    def record(batch_id: int, times: Sequence[Sequence[float]]) -> None:
        epoch_at_zero = time.time() - clock.now()     # read together: no drift to speak of
        for stage, t in enumerate(times):
            recv = t[2] - epoch_at_zero if len(t) > 2 and t[2] is not None and stage > 0 else None
            trace.stage(batch_id, stage, t[0] - epoch_at_zero, t[1] - epoch_at_zero, recv)

    return record


@dataclass
class LiveRun:
    metrics: BenchmarkMetrics
    num_steps: int


def run_live(workload: Workload, sched_config: SchedulerConfig, make_executor: ExecutorFactory,
             trace_path: str | None = None,
             percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
             build: Callable[[RequestSpec, int, float], Request] = make_request) -> LiveRun:
    """`make_executor(clock, trace)` may take long (stage processes start);
    the clock restarts at zero once it returns, so arrivals are not late."""
    workload.fit_model_len(sched_config.max_model_len)
    clock = WallClock()
    trace = TimedTraceWriter.to_path(trace_path, clock.now) if trace_path else None
    try:
        executor = make_executor(clock, trace)
        clock.restart()
        scheduler = make_scheduler(sched_config, trace)
        if getattr(executor, "feedback", False):
            # Sampled-token feedback (async scheduling): the executor copies a
            # resumed request's whole sequence from the scheduler, as the
            # runtime's own build_engine wires it (runtime/generate.py).
            executor.all_token_ids = (  # type: ignore[attr-defined]
                lambda req_id: scheduler.requests[req_id].all_token_ids)
        engine = Engine(scheduler, executor)
        run = serve(engine, clock, workload, build=build)
        if trace is not None:
            trace.end()
    finally:
        if trace is not None:
            trace.close()
    return LiveRun(compute_metrics(run.records, run.duration, percentiles), run.num_steps)

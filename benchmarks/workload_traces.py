"""Traces of `benchmarks/scheduler_cost.py`'s workloads, for
`check_trace_speed.py`: the reference scheduler, traced, driven through the
same engine loop and the same requests (flightcheck/vllm/cost.py) as the
vLLM side of the cost benchmark, so that the checker's time on a trace can
be set beside the time vLLM's own scheduler takes on that workload.

`write_workload_trace(case, batches, sink)` writes the trace of the case's
warm-up (every long-lived request prefilled, then 40 batches of turnover)
followed by `batches` completed batches, and says where the timed part
starts. The requests never finish (max_tokens 100,000, no stop tokens), so
the trace has no `end` event: the checker is stopped after the last batch,
as a live checker would be.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scheduler_cost  # noqa: E402  (the cost benchmark's adapters for the reference)
from long_traces import _CountingSink  # noqa: E402  (a sink that counts the lines through it)

from flightcheck.reference import SchedulerConfig, TraceWriter  # noqa: E402
from flightcheck.reference.trace import TracingScheduler  # noqa: E402

cost = scheduler_cost.cost


@dataclass(frozen=True)
class WorkloadTrace:
    case: str
    events: int            # lines written
    warm_up_events: int    # lines before the first timed batch's schedule event
    batches: int           # timed batches (each a schedule and a complete event)


def write_workload_trace(case: str, batches: int, sink: TextIO) -> WorkloadTrace:
    """The reference's trace of `case` (seed 0, as the cost benchmark's
    side-by-side runs), warm-up then `batches` completed batches."""
    counted = _CountingSink(sink)
    workload = cost.workload_of_case(case, seed=0)
    scheduler = TracingScheduler(SchedulerConfig(**workload.settings()), TraceWriter(counted))
    loop = cost.EngineLoop(workload, scheduler, scheduler_cost.make_reference_request,
                           scheduler_cost.reference_model)
    loop.warm_up()
    # the loop schedules ahead (K = 2): what is in flight now was scheduled in
    # the warm-up; the timed part starts at the next line
    counted.flush()
    warm_up = counted.lines
    records: list = []
    while len(records) < batches:
        loop.next_batch(records)
    counted.flush()
    del loop, scheduler
    gc.collect()
    return WorkloadTrace(case, counted.lines, warm_up, batches)

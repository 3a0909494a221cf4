"""`SimulatedExecutor`: the `Executor` seam of reference/engine.py on a virtual
clock, so the reference `Scheduler` and `Engine` run unchanged while a cost
model stands in for the model.

Each stage is a FIFO single server: batch k+1 starts stage s when stage s has
finished batch k *and* batch k+1's activations have arrived from stage s-1.
Since batches enter in submission order and stages serve them in order, a
batch's whole schedule is known when it is submitted:

    ready_0   = submit time + dispatch
    start_s   = max(ready_s, free_s);  end_s = start_s + t_stage(s, batch)
    ready_s+1 = end_s + t_link(batch);  free_s = end_s
    done      = end_last + return

`Future.result()` moves the clock to `done` (the engine blocks there, as
vLLM's does on the oldest batch) and writes the batch's stage events.

The simulated worker returns one token for every entry whose snapshot says it
samples (final prefill chunk or decode) and `[]` otherwise. It never samples
EOS, so requests stop at max_tokens, as benchmark runs with long outputs do
almost always. No drafts (spec decode is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from flightcheck.reference import ModelRunnerOutput, SchedulerOutput

from .clock import VirtualClock
from .cost_model import StageCostModel
from .timed_trace import TimedTraceWriter

SAMPLED_TOKEN_ID = 1000        # any id that is not EOS; the scheduler only counts tokens


@dataclass(frozen=True)
class StageSpan:
    batch_id: int
    stage: int
    t0: float
    t1: float


class SimFuture:
    __slots__ = ("_executor", "_output", "done_time", "spans", "reported")

    def __init__(self, executor: "SimulatedExecutor", output: ModelRunnerOutput,
                 done_time: float, spans: list[StageSpan]) -> None:
        self._executor = executor
        self._output = output
        self.done_time = done_time
        self.spans = spans
        self.reported = False         # stage events written (once, on the first result())

    def done(self) -> bool:
        return self._executor.clock.now() >= self.done_time

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        self._executor._complete(self)
        return self._output


class SimulatedExecutor:
    def __init__(self, cost: StageCostModel, clock: VirtualClock,
                 trace: TimedTraceWriter | None = None, record_spans: bool = False) -> None:
        self.cost = cost
        self.clock = clock
        self.trace = trace
        self.num_stages = cost.num_stages
        self._stage_free = [0.0] * cost.num_stages
        self.record_spans = record_spans
        self.spans: list[StageSpan] = []              # every stage run, if record_spans
        self.busy_time = [0.0] * cost.num_stages      # seconds each stage computed
        self.num_batches = 0

    def submit(self, scheduler_output: SchedulerOutput) -> SimFuture:
        entries = scheduler_output.entries
        terms = self.cost.batch_terms(
            [(e.num_computed_tokens, e.num_new_tokens, e.samples) for e in entries])
        params = self.cost.params
        ready = self.clock.now() + params.dispatch_s
        link = self.cost.link_time(terms[0])
        spans: list[StageSpan] = []
        batch_id = scheduler_output.batch_id or 0
        for s in range(self.num_stages):
            start = max(ready, self._stage_free[s])
            end = start + self.cost.stage_time(s, terms)
            self._stage_free[s] = end
            self.busy_time[s] += end - start
            spans.append(StageSpan(batch_id, s, start, end))
            ready = end + link
        done = spans[-1].t1 + params.return_s
        req_ids = [e.req_id for e in entries]
        sampled = [[SAMPLED_TOKEN_ID] if e.samples else [] for e in entries]
        output = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)
        self.num_batches += 1
        return SimFuture(self, output, done, spans)

    def _complete(self, future: SimFuture) -> None:
        self.clock.advance_to(future.done_time)
        if future.reported:
            return
        future.reported = True
        if self.record_spans:
            self.spans.extend(future.spans)
        if self.trace is not None:
            for span in future.spans:
                self.trace.stage(span.batch_id, span.stage, span.t0, span.t1)

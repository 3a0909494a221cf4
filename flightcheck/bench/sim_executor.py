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

Two things only vLLM 0.33's engine loop and its asynchronous scheduling bring
(docs/simulator.md#the-cost-model):

* an EMPTY batch (0.33's `EngineCore.step_with_batch_queue` queues the
  output of every `schedule()` call): the V2 runner's `execute_model`
  updates its request states and returns before any forward, so no stage
  computes; its result comes back once the last stage has finished the
  batches before it (each worker serves its calls in order) plus `return`;
* `sampled_token_lag` = K under async scheduling: the first stage of the
  n-th submitted batch waits for the tokens batch n - K sampled, broadcast
  from the last stage (`PPHandler.get_prev_sampled_outputs`, "the entry from
  pp_size steps ago", waited for in `GPUModelRunner.update_pp_decode_
  requests`): ready_0 >= end_last(n - K) + link latency. Under sync
  scheduling it is 0 (no wait): a decode is scheduled only after its
  previous token came back to the engine.

The simulated worker returns one token for every entry whose snapshot says it
samples (final prefill chunk or decode) and `[]` otherwise. It never samples
EOS, so requests stop at max_tokens, as benchmark runs with long outputs do
almost always. No drafts (spec decode is not modelled).
"""

from __future__ import annotations

from collections import deque
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
                 trace: TimedTraceWriter | None = None, record_spans: bool = False,
                 sampled_token_lag: int = 0) -> None:
        self.cost = cost
        self.clock = clock
        self.trace = trace
        self.num_stages = cost.num_stages
        self._stage_free = [0.0] * cost.num_stages
        self.record_spans = record_spans
        self.spans: list[StageSpan] = []              # every stage run, if record_spans
        self.submissions: list[int | None] = []       # batch ids, None = empty, if record_spans
        self.busy_time = [0.0] * cost.num_stages      # seconds each stage computed
        self.num_batches = 0                          # batches with tokens
        self.num_empty_batches = 0                    # vLLM 0.33's empty ones
        self.num_in_flight = 0                        # batches with tokens not yet waited for
        self.max_in_flight = 0                        # K, or K + 1 under async scheduling
        # Under async scheduling: when the tokens sampled by each of the last
        # `sampled_token_lag` submissions reach stage 0 (None: it sampled none).
        self.sampled_token_lag = sampled_token_lag
        self._token_arrivals: deque[float | None] = deque()

    def submit(self, scheduler_output: SchedulerOutput) -> SimFuture:
        entries = scheduler_output.entries
        params = self.cost.params
        batch_id = scheduler_output.batch_id or 0
        if self.record_spans:
            self.submissions.append(batch_id if entries else None)
        if not entries:
            return self._submit_empty()
        terms = self.cost.batch_terms(
            [(e.num_computed_tokens, e.num_new_tokens, e.samples) for e in entries])
        ready = self.clock.now() + params.dispatch_s
        if self.sampled_token_lag and len(self._token_arrivals) == self.sampled_token_lag:
            arrival = self._token_arrivals[0]
            if arrival is not None:
                ready = max(ready, arrival)
        link = self.cost.link_time(terms[0])
        spans: list[StageSpan] = []
        for s in range(self.num_stages):
            start = max(ready, self._stage_free[s])
            end = start + self.cost.stage_time(s, terms)
            self._stage_free[s] = end
            self.busy_time[s] += end - start
            spans.append(StageSpan(batch_id, s, start, end))
            ready = end + link
        done = spans[-1].t1 + params.return_s
        self._remember_tokens(spans[-1].t1 + params.link_latency_s
                              if any(e.samples for e in entries) else None)
        req_ids = [e.req_id for e in entries]
        sampled = [[SAMPLED_TOKEN_ID] if e.samples else [] for e in entries]
        output = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)
        self.num_batches += 1
        self.num_in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
        return SimFuture(self, output, done, spans)

    def _submit_empty(self) -> SimFuture:
        """An empty batch: no stage computes; done once the last stage is free."""
        done = max(self.clock.now() + self.cost.params.dispatch_s,
                   self._stage_free[-1]) + self.cost.params.return_s
        self._remember_tokens(None)
        self.num_empty_batches += 1
        return SimFuture(self, ModelRunnerOutput([], {}, []), done, [])

    def _remember_tokens(self, arrival: float | None) -> None:
        if self.sampled_token_lag:
            self._token_arrivals.append(arrival)
            if len(self._token_arrivals) > self.sampled_token_lag:
                self._token_arrivals.popleft()

    def _complete(self, future: SimFuture) -> None:
        self.clock.advance_to(future.done_time)
        if future.reported:
            return
        future.reported = True
        self.num_in_flight -= bool(future.spans)
        if self.record_spans:
            self.spans.extend(future.spans)
        if self.trace is not None:
            for span in future.spans:
                self.trace.stage(span.batch_id, span.stage, span.t0, span.t1)

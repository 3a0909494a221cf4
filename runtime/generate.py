"""Generation: the reference `Engine` (batch queue of depth K, or K + 1 under
the `vllm-0.33-async` profile's asynchronous scheduling) over an executor,
driven by the reference's one drive loop (reference/drive.py), with
arrivals by engine step, aborts and a trace. The profile is the config's
(`SchedulerConfig(profile="vllm-0.33-async")`); async needs an executor
with sampled-token feedback (`feedback=True`).

An abort fires once its request has `abort_after` output tokens *and* a
batch of it is in flight, so the abort lands while the pipeline holds its
work (the scheduler must then drop that batch's output). If the pipeline
fails (a stage died), every unfinished request is aborted, the trace gets
those aborts (and no `end`), and `RunFailed` carries the partial results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flightcheck.reference import (Engine, EngineCoreOutput, Executor, Request, SamplingParams,
                                   SchedulerConfig, make_scheduler)
from flightcheck.reference.drive import ArrivalsByStep, drive

from .pipeline import PipelineError
from .trace import RuntimeTraceWriter


@dataclass(frozen=True)
class GenerationRequest:
    req_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    abort_after: int | None = None      # abort (in flight) after this many output tokens
    arrival_step: int = 0               # added when the engine has made this many steps


@dataclass(frozen=True)
class RequestResult:
    req_id: str
    prompt_len: int
    output_token_ids: tuple[int, ...]
    finish_reason: str | None

    def to_json(self) -> dict:
        return {"id": self.req_id, "prompt_len": self.prompt_len,
                "output_token_ids": list(self.output_token_ids),
                "finish_reason": self.finish_reason}


@dataclass
class RunResult:
    requests: list[RequestResult]
    seconds: float
    num_batches: int
    error: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {"requests": [r.to_json() for r in self.requests], "seconds": round(self.seconds, 4)}
        if self.error is not None:
            out["error"] = self.error
        return out

    def outputs(self) -> dict[str, tuple[int, ...]]:
        return {r.req_id: r.output_token_ids for r in self.requests}


class RunFailed(RuntimeError):
    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def generate(executor: Executor, config: SchedulerConfig, requests: Sequence[GenerationRequest],
             *, eos_token_id: int | None = None, trace: RuntimeTraceWriter | None = None,
             progress: Callable[[int, int, int], None] | None = None,
             max_steps: int = 1_000_000) -> RunResult:
    """Run `requests` to completion through `executor` (its KV pool must be
    `config.num_blocks` blocks of `config.block_size`). `progress(finished,
    total, output tokens)` is called after every step that returned outputs."""
    check_async_support(executor, config)
    engine = build_engine(executor, config, trace)
    run = GenerationRun(requests, eos_token_id, progress)
    started = time.time()
    error = run_to_completion(engine, run, max_steps)
    result = run.result(time.time() - started, engine.num_submitted_batches, error)
    if error is not None:
        raise RunFailed(f"pipeline failed: {error}", result)
    if trace is not None:
        trace.end()
    return result


def check_async_support(executor: Executor, config: SchedulerConfig) -> None:
    """Asynchronous scheduling (the `vllm-0.33-async` profile) schedules a
    decode before its previous token exists, so stage 0 must get tokens from
    the last stage (`feedback=True`). Drafts are supported: the feedback also
    carries each entry's rejected-draft count and the drafts proposed after
    it, so every stage runs a decode at its true position and stage 0 fills
    its draft slots (worker.py), as vLLM's V2 runner does on the device."""
    if not config.async_scheduling:
        return
    if getattr(executor, "feedback", None) is False:        # a runtime executor without it
        raise ValueError(f"profile {config.profile} schedules decodes before their previous "
                         "token exists: the executor needs feedback=True (the sampled tokens "
                         "from the last stage)")


def build_engine(executor: Executor, config: SchedulerConfig,
                 trace: RuntimeTraceWriter | None) -> Engine:
    """The reference scheduler over `executor`; the stages' times go to the
    trace. With sampled-token feedback the executor reads a resumed
    request's whole sequence from the scheduler when it copies the snapshot
    (what vLLM's V2 runner gets as `prefill_token_ids`)."""
    if trace is not None and hasattr(executor, "on_stage_times"):
        executor.on_stage_times = trace.stages
    scheduler = make_scheduler(config, trace)
    if getattr(executor, "feedback", False):
        executor.all_token_ids = lambda req_id: scheduler.requests[req_id].all_token_ids
    return Engine(scheduler, executor)


def run_to_completion(engine: Engine, run: GenerationRun, max_steps: int) -> str | None:
    """Drive the engine until every request has finished; a pipeline failure
    aborts every unfinished request and is returned as the error."""
    try:
        drive(engine, arrivals=run.arrivals, on_outputs=run.on_outputs,
              after_step=lambda: run.fire_due_aborts(engine), max_steps=max_steps)
    except PipelineError as err:
        run.abort_unfinished(engine)
        return str(err)
    return None


class GenerationRun:
    """One `generate` call's requests: their arrivals (by engine step), the
    aborts due, and the progress report."""

    def __init__(self, requests: Sequence[GenerationRequest], eos_token_id: int | None,
                 progress: Callable[[int, int, int], None] | None) -> None:
        self.requests = requests
        self.arrivals = ArrivalsByStep((g.arrival_step, make_request(g, eos_token_id))
                                       for g in requests)
        self.progress = progress
        self.abort_after = {g.req_id: g.abort_after for g in requests
                            if g.abort_after is not None}
        self.aborts_due: set[str] = set()

    def on_outputs(self, outputs: list[EngineCoreOutput]) -> None:
        """A batch completed: note the aborts now due and report progress."""
        self.note_aborts_due(outputs)
        self.report_progress()

    def note_aborts_due(self, outputs: list[EngineCoreOutput]) -> None:
        admitted = self.arrivals.admitted
        for out in outputs:
            limit = self.abort_after.get(out.request_id)
            if (limit is not None and admitted[out.request_id].num_output_tokens >= limit
                    and not out.finished):
                self.aborts_due.add(out.request_id)

    def report_progress(self) -> None:
        if self.progress is None:
            return
        admitted = self.arrivals.admitted.values()
        self.progress(sum(r.is_finished() for r in admitted), len(self.requests),
                      sum(r.num_output_tokens for r in admitted))

    def fire_due_aborts(self, engine: Engine) -> None:
        """Abort each due request as soon as a batch of it is in flight, so the
        abort lands while the pipeline holds its work."""
        if not self.aborts_due:
            return
        in_flight = {e.req_id for out, _ in engine.batch_queue for e in out.entries}
        for req_id in sorted(self.aborts_due & in_flight):
            engine.abort_request(req_id)
            self.aborts_due.discard(req_id)
        for req_id in list(self.aborts_due):         # finished meanwhile: nothing to abort
            if req_id not in engine.scheduler.requests:
                self.aborts_due.discard(req_id)

    def abort_unfinished(self, engine: Engine) -> None:
        """The pipeline failed: abort what is left; no batch will come back."""
        for req_id, request in self.arrivals.admitted.items():
            if not request.is_finished():
                engine.abort_request(req_id)
        engine.batch_queue.clear()

    def result(self, seconds: float, num_batches: int, error: str | None) -> RunResult:
        admitted = self.arrivals.admitted
        results = [request_result(admitted[g.req_id]) if g.req_id in admitted
                   else RequestResult(g.req_id, len(g.prompt_token_ids), (), "abort")  # never arrived
                   for g in self.requests]
        return RunResult(results, seconds, num_batches, error)


def make_request(g: GenerationRequest, eos_token_id: int | None) -> Request:
    params = SamplingParams(max_tokens=g.max_tokens, ignore_eos=g.ignore_eos,
                            temperature=g.temperature, seed=g.seed)
    return Request(g.req_id, list(g.prompt_token_ids), params, eos_token_id=eos_token_id)


def request_result(request: Request) -> RequestResult:
    return RequestResult(request.request_id, request.num_prompt_tokens,
                         tuple(request.output_token_ids), request.get_finished_reason())

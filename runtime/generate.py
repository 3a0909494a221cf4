"""The driver loop: the reference `Engine` (batch queue of depth K) over an
executor, with arrivals, aborts and a trace.

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

from flightcheck.reference import (Engine, Request, SamplingParams, SchedulerConfig, make_scheduler)

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


def generate(executor, config: SchedulerConfig, requests: Sequence[GenerationRequest], *,
             eos_token_id: int | None = None, trace: RuntimeTraceWriter | None = None,
             progress: Callable[[int, int, int], None] | None = None,
             max_steps: int = 1_000_000) -> RunResult:
    """Run `requests` to completion through `executor` (its KV pool must be
    `config.num_blocks` blocks of `config.block_size`)."""
    if trace is not None and hasattr(executor, "on_stage_times"):
        executor.on_stage_times = trace.stages
    scheduler = make_scheduler(config, trace)
    engine = Engine(scheduler, executor)
    pending = sorted(requests, key=lambda r: r.arrival_step)
    by_id: dict[str, Request] = {}
    aborts_due: set[str] = set()
    abort_at = {r.req_id: r.abort_after for r in requests if r.abort_after is not None}
    num_batches = 0
    t_start = time.time()
    step = 0
    idle = 0
    error = None
    try:
        while pending or engine.has_unfinished_requests() or engine.batch_queue:
            while pending and pending[0].arrival_step <= step:
                g = pending.pop(0)
                by_id[g.req_id] = _add(engine, g, eos_token_id)
            if step >= max_steps:
                raise RuntimeError(f"run did not finish within {max_steps} engine steps")
            in_flight_before = len(engine.batch_queue)
            outputs = engine.step()
            step += 1
            submitted = len(engine.batch_queue) > in_flight_before
            num_batches += submitted
            if outputs:
                for out in outputs:
                    limit = abort_at.get(out.request_id)
                    request = by_id[out.request_id]
                    if limit is not None and request.num_output_tokens >= limit and not out.finished:
                        aborts_due.add(out.request_id)
                if progress is not None:
                    progress(sum(r.is_finished() for r in by_id.values()), len(requests),
                             sum(r.num_output_tokens for r in by_id.values()))
            _fire_aborts(engine, aborts_due)
            idle = idle + 1 if outputs is None and not submitted and not engine.batch_queue else 0
            if idle >= 2 and not pending:
                raise RuntimeError("engine stuck: unfinished requests, nothing schedulable, "
                                   "nothing in flight")
    except PipelineError as err:
        error = str(err)
        for req_id, request in by_id.items():
            if not request.is_finished():
                engine.abort_request(req_id)
        engine.batch_queue.clear()
    seconds = time.time() - t_start
    results = [_result(by_id[r.req_id]) if r.req_id in by_id      # else: never arrived
               else RequestResult(r.req_id, len(r.prompt_token_ids), (), "abort")
               for r in requests]
    run = RunResult(results, seconds, num_batches, error)
    if error is not None:
        raise RunFailed(f"pipeline failed: {error}", run)
    if trace is not None:
        trace.end()
    return run


def _add(engine: Engine, g: GenerationRequest, eos_token_id: int | None) -> Request:
    params = SamplingParams(max_tokens=g.max_tokens, ignore_eos=g.ignore_eos,
                            temperature=g.temperature, seed=g.seed)
    request = Request(g.req_id, list(g.prompt_token_ids), params, eos_token_id=eos_token_id)
    engine.add_request(request)
    return request


def _fire_aborts(engine: Engine, due: set[str]) -> None:
    """Abort each due request as soon as a batch of it is in flight."""
    if not due:
        return
    in_flight = {e.req_id for out, _ in engine.batch_queue for e in out.entries}
    for req_id in sorted(due & in_flight):
        engine.abort_request(req_id)
        due.discard(req_id)
    for req_id in list(due):                         # finished meanwhile: nothing to abort
        if req_id not in engine.scheduler.requests:
            due.discard(req_id)


def _result(request: Request) -> RequestResult:
    return RequestResult(request.request_id, request.num_prompt_tokens,
                         tuple(request.output_token_ids), request.get_finished_reason())

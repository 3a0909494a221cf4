"""The open-loop serving loop shared by the simulator and the runtime
benchmark: requests enter at their send times, the reference `Engine` steps,
and every output becomes a streamed chunk on the client's clock.

Like vLLM's engine core, new requests are taken in between steps only: a
request that arrives while the engine blocks on a batch waits for the step
to end. With nothing to do the loop idles until the next send time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from flightcheck.reference import Engine, Request, SamplingParams

from .clock import Clock
from .metrics import RequestRecord
from .workload import RequestSpec, Workload


def synthetic_prompt(index: int, length: int, vocab_size: int = 32000) -> list[int]:
    """Token ids that no two requests share a block of (vLLM's BurstGPT
    loader builds prompts the same way: consecutive ids from an offset)."""
    offset = index * 7919
    return [(offset + j) % vocab_size for j in range(length)]


def make_request(spec: RequestSpec, index: int, arrival_time: float,
                 vocab_size: int = 32000) -> Request:
    """A request that generates exactly `output_len` tokens (EOS ignored)."""
    return Request(spec.req_id, synthetic_prompt(index, spec.prompt_len, vocab_size),
                   SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
                   eos_token_id=None, arrival_time=arrival_time)


@dataclass
class ServingRun:
    records: list[RequestRecord]
    duration: float                 # first send to last chunk, seconds
    num_steps: int                  # engine.step() calls


def serve(engine: Engine, clock: Clock, workload: Workload, *, client_in_s: float = 0.0,
          client_out_s: float = 0.0,
          build: Callable[[RequestSpec, int, float], Request] = make_request,
          max_steps: int = 50_000_000) -> ServingRun:
    """Run the workload to completion. `client_in_s`: send -> the engine has
    the request; `client_out_s`: engine output -> the client has the chunk."""
    order = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].send_time)
    pending = deque(order)
    specs = workload.requests
    records = {s.req_id: RequestRecord(s.req_id, s.prompt_len, s.send_time) for s in specs}
    steps = 0
    while steps < max_steps:
        now = clock.now()
        while pending and specs[pending[0]].send_time + client_in_s <= now:
            i = pending.popleft()
            engine.add_request(build(specs[i], i, now))
        busy = engine.has_unfinished_requests() or engine.num_in_flight_batches > 0
        if not busy:
            if not pending:
                break
            clock.wait_until(specs[pending[0]].send_time + client_in_s)
            continue
        outputs = engine.step()
        steps += 1
        if outputs:
            t = clock.now() + client_out_s
            for out in outputs:
                if out.new_token_ids:
                    record = records[out.request_id]
                    record.chunk_times.append(t)
                    record.output_len += len(out.new_token_ids)
        elif outputs is None and engine.num_in_flight_batches == 0:
            # Nothing submitted, nothing in flight: only an arrival can help.
            if not pending:
                raise RuntimeError("engine stuck: unfinished requests, nothing schedulable, "
                                   "nothing in flight, no arrival left")
            clock.wait_until(specs[pending[0]].send_time + client_in_s)
    else:
        raise RuntimeError(f"serving loop did not finish within {max_steps} steps")
    ends = [r.chunk_times[-1] for r in records.values() if r.chunk_times]
    start = min((s.send_time for s in specs), default=0.0)
    return ServingRun(list(records.values()), (max(ends) - start) if ends else 0.0, steps)

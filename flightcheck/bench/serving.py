"""Open-loop serving, shared by the simulator and the live benchmark:
requests enter at their send times, the reference `Engine` steps (the
reference's one drive loop, reference/drive.py), and every output becomes a
streamed chunk on the client's clock.

Like vLLM's engine core, new requests are taken in between steps only: a
request that arrives while the engine blocks on a batch waits for the step
to end. With nothing to do the loop idles until the next send time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from flightcheck.reference import Engine, EngineCoreOutput, Request, SamplingParams
from flightcheck.reference.drive import DrivenEngine, drive

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
    arrivals = ClientArrivals(workload, clock, client_in_s, build)
    client = StreamingClient(workload, clock, client_out_s)
    run = drive(engine, arrivals=arrivals, on_outputs=client.receive, max_steps=max_steps)
    return ServingRun(client.records(), client.duration(), run.num_steps)


class ClientArrivals:
    """Requests in send-time order; each reaches the engine `client_in_s`
    after it is sent, on `clock` (which idles until the next one when the
    engine has nothing to do)."""

    def __init__(self, workload: Workload, clock: Clock, client_in_s: float,
                 build: Callable[[RequestSpec, int, float], Request]) -> None:
        self.specs = workload.requests
        self.pending = deque(sorted(range(len(self.specs)), key=lambda i: self.specs[i].send_time))
        self.clock = clock
        self.client_in_s = client_in_s
        self.build = build

    def admit_due(self, engine: DrivenEngine, num_steps: int) -> None:
        now = self.clock.now()
        while self.pending and self._next_due() <= now:
            index = self.pending.popleft()
            engine.add_request(self.build(self.specs[index], index, now))

    def has_pending(self) -> bool:
        return bool(self.pending)

    def wait_for_next(self) -> bool:
        self.clock.wait_until(self._next_due())
        return True

    def _next_due(self) -> float:
        return self.specs[self.pending[0]].send_time + self.client_in_s


class StreamingClient:
    """The client's side: every output with new tokens is a chunk, received
    `client_out_s` after the engine produced it."""

    def __init__(self, workload: Workload, clock: Clock, client_out_s: float) -> None:
        self.specs = workload.requests
        self.clock = clock
        self.client_out_s = client_out_s
        self._records = {s.req_id: RequestRecord(s.req_id, s.prompt_len, s.send_time)
                         for s in self.specs}

    def receive(self, outputs: list[EngineCoreOutput]) -> None:
        t = self.clock.now() + self.client_out_s
        for out in outputs:
            if out.new_token_ids:
                record = self._records[out.request_id]
                record.chunk_times.append(t)
                record.output_len += len(out.new_token_ids)

    def records(self) -> list[RequestRecord]:
        return list(self._records.values())

    def duration(self) -> float:
        """First send to the last chunk, seconds."""
        ends = [r.chunk_times[-1] for r in self._records.values() if r.chunk_times]
        start = min((s.send_time for s in self.specs), default=0.0)
        return (max(ends) - start) if ends else 0.0

"""What a scheduler costs per batch: the workloads and the engine loop that
`benchmarks/scheduler_cost.py` drives our reference scheduler with, and
`cost_worker.py` drives vLLM's own `Scheduler` with, in one run, taking turns.

Both sides run this same code: the same requests (same seeds, token ids and
`max_tokens`), the same batch queue of depth K = 2, the same stand-in model
(a token for exactly the entries that sample; not timed). Only the scheduler
and two small adapters differ: how a request is made and how the model's
output is shaped. Each batch is timed as the `schedule()` that built it plus
the `update_from_output()` that consumed it. Standard library only (the vLLM
side imports it inside the vLLM venv, the reference side in the main one).

Workloads (anchor: docs/scheduler-cost.md §"The first anchor: vLLM 0.8.5 alone"):
* decode-N: N running requests, all decoding; with K = 2 half of them have
  their token in flight, so each batch holds N/2 decodes while schedule()
  walks all N.
* prefill-N: N running requests with 1-3k-token contexts, decoding, plus a
  stream of arrivals with 1-3k-token prompts (1-8 output tokens; 8 always
  waiting) that fills every batch to the 8192-token budget with prefill
  chunks; half of all prompts start with one of 8 shared 1k-token prefixes.
  Each batch: N/2 decodes plus the prefill chunks. prefill-mix is prefill-50:
  about 100 running requests, as in the anchor.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Any, Callable, NamedTuple

K = 2
BUDGET = 8192
BLOCK_SIZE = 16

# The side-by-side cases: name -> (kind, long-lived requests).
CASES: dict[str, tuple[str, int]] = {
    "decode-256": ("decode", 256),
    "decode-1024": ("decode", 1024),
    "decode-4096": ("decode", 4096),
    "prefill-mix": ("prefill", 50),
}


class RequestSpec(NamedTuple):
    """A request as both sides make it."""
    req_id: str
    prompt_token_ids: list[int]
    max_tokens: int


class Workload:
    """Builds the requests of one case.

    decode: N short-prompt requests that decode for the whole run.
    prefill: N long-context requests (1-3k-token prompts) that decode for the
    whole run, plus a stream of short-lived arrivals with 1-3k-token prompts
    (1-8 output tokens, 8 of them always waiting) that keeps every
    batch filled to the token budget with prefill chunks. Half of all
    prompts start with one of 8 shared 1k-token prefixes.
    """

    STREAM_WAITING = 8          # prefill arrivals kept queued at all times
    STREAM_RUNNING = 128        # room for the stream's requests while they decode

    def __init__(self, name: str, num_requests: int, seed: int) -> None:
        self.name, self.num_requests = name, num_requests
        self.rng = random.Random(seed)
        self.vocab = [self.rng.randrange(1, 32_000) for _ in range(4096)]  # shared int objects
        self.prefixes = [[self.rng.choice(self.vocab) for _ in range(1024)] for _ in range(8)]
        self.counter = 0
        self.is_decode = name == "decode"

    def _long_prompt(self) -> list[int]:
        rng = self.rng
        n = rng.randint(1024, 3072)
        prompt = self.prefixes[rng.randrange(8)][:] if rng.random() < 0.5 else []
        return prompt + rng.choices(self.vocab, k=n - len(prompt))

    def long_lived_request(self) -> RequestSpec:
        self.counter += 1
        if self.is_decode:
            prompt = self.rng.choices(self.vocab, k=self.rng.randint(64, 128))
        else:
            prompt = self._long_prompt()
        return RequestSpec(f"r{self.counter}", prompt, 100_000)

    def stream_request(self) -> RequestSpec:
        self.counter += 1
        return RequestSpec(f"s{self.counter}", self._long_prompt(), self.rng.randint(1, 8))

    def settings(self) -> dict[str, Any]:
        """The scheduler's configuration, in the reference's terms (vLLM's
        pool gets one block more: it keeps block 0 as its null block)."""
        max_len = 4096 if self.is_decode else 6144
        stream = 0 if self.is_decode else self.STREAM_RUNNING + self.STREAM_WAITING
        # Room for every request at its longest: no preemption in the steady state.
        per_request = -(-max_len // BLOCK_SIZE)
        return {"max_num_batched_tokens": BUDGET, "max_num_seqs": self.num_requests + stream,
                "max_model_len": max_len, "block_size": BLOCK_SIZE,
                "num_blocks": per_request * (self.num_requests + stream),
                "num_pipeline_stages": K, "enable_prefix_caching": True}


def workload_of_case(case: str, seed: int) -> Workload:
    kind, num_requests = CASES[case] if case in CASES else parse_case(case)
    return Workload(kind, num_requests, seed)


def parse_case(case: str) -> tuple[str, int]:
    """`decode-N` or `prefill-N` for any N (the fixed cases are in CASES)."""
    kind, _, size = case.partition("-")
    if kind not in ("decode", "prefill") or not size.isdigit():
        raise ValueError(f"unknown case {case!r}: one of {', '.join(CASES)}, or decode-N / prefill-N")
    return kind, int(size)


# One timed batch: (schedule() ns, update_from_output() ns, entries,
# scheduled tokens, running requests when scheduled).
Record = tuple[int, int, int, int, int]


class EngineLoop:
    """One scheduler, driven as the engine's batch queue drives it: schedule
    while fewer than K batches are in flight, else complete the oldest.

    `make_request(spec)` builds the scheduler's own request object;
    `model(scheduler, output, step)` returns the model's output for a batch
    (a token for exactly the entries that sample) and how many entries the
    batch has."""

    def __init__(self, workload: Workload, scheduler: Any,
                 make_request: Callable[[RequestSpec], Any],
                 model: Callable[[Any, Any, int], tuple[Any, int]]) -> None:
        self.workload = workload
        self.sched = scheduler
        self.make_request = make_request
        self.model = model
        for _ in range(workload.num_requests):
            scheduler.add_request(make_request(workload.long_lived_request()))
        if not workload.is_decode:
            for _ in range(workload.STREAM_WAITING):
                scheduler.add_request(make_request(workload.stream_request()))
        self.queue: deque = deque()
        self.step = 0

    def warm_up(self) -> None:
        """To the steady state: every long-lived request prefilled and
        decoding, then some batches of turnover."""
        long_lived = [f"r{i + 1}" for i in range(self.workload.num_requests)]
        while any(self.sched.requests[r].num_output_tokens == 0 for r in long_lived):
            self.one_step(None)
        for _ in range(40):
            self.one_step(None)

    def next_batch(self, record: list[Record], before_timed: Callable[[], None] | None = None) -> None:
        """Run until one more batch has been scheduled and completed (timed)."""
        num_records = len(record)
        while len(record) == num_records:
            self.one_step(record, before_timed)

    def one_step(self, record: list[Record] | None,
                 before_timed: Callable[[], None] | None = None) -> None:
        sched, workload, queue = self.sched, self.workload, self.queue
        self.step += 1
        if len(queue) < K:
            if before_timed is not None:
                before_timed()
            t0 = time.perf_counter_ns()
            out = sched.schedule()
            t1 = time.perf_counter_ns()
            if not workload.is_decode:           # keep the stream's queue topped up
                for _ in range(workload.STREAM_WAITING - len(sched.waiting)):
                    sched.add_request(self.make_request(workload.stream_request()))
            if out.total_num_scheduled_tokens:
                result, num_entries = self.model(sched, out, self.step)
                queue.append((out, result, num_entries, t1 - t0, len(sched.running)))
                return
        out, result, num_entries, schedule_ns, num_running = queue.popleft()
        if before_timed is not None:
            before_timed()
        t0 = time.perf_counter_ns()
        sched.update_from_output(out, result)
        t1 = time.perf_counter_ns()
        if record is not None:
            record.append((schedule_ns, t1 - t0, num_entries, out.total_num_scheduled_tokens,
                           num_running))


def stand_in_token(step: int, index: int) -> int:
    """The token the stand-in model returns (never a stop token: the
    requests have none, and no EOS)."""
    return 1 + (step + index) % 30_000

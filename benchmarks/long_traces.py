"""Long traces of the reference scheduler, for check-trace benchmarks and the
incremental checker's differential test.

`write_long_trace` keeps `concurrency` requests alive: a request that finishes
is replaced by a new arrival, so the running set stays about `concurrency`
large while the history (finished requests, events) grows without bound.
Prompts share a few prefixes (prefix-cache hits), the pool is sized so that
some preemption happens, and the scripted executor samples deterministic
tokens (stop tokens now and then). The reference's own scheduling time
(`schedule()` plus `update_from_output()`) is measured on the way, so a
benchmark can compare the checker's time with the scheduler's.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass
from typing import TextIO

from flightcheck.reference import (
    Engine,
    Request,
    Sample,
    SamplingParams,
    SchedulerConfig,
    ScriptedExecutor,
    TraceWriter,
    make_scheduler,
)
from flightcheck.reference.profiles import DEFAULT_PROFILE

EOS = 2


@dataclass(frozen=True)
class LongTrace:
    events: int                 # events written, config and end included
    arrivals: int
    scheduler_seconds: float    # time in the reference's schedule() and update_from_output()


class _CountingSink:
    """A text sink that counts the lines (events) written through it."""

    def __init__(self, sink: TextIO) -> None:
        self.sink, self.lines = sink, 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return self.sink.write(text)

    def flush(self) -> None:
        self.sink.flush()


def long_trace_config(concurrency: int, continue_prefill: bool | None = True, profile: str = DEFAULT_PROFILE,
                      prefix_caching: bool = True, block_size: int = 16,
                      pool_share: float = 0.75) -> SchedulerConfig:
    """A pool about `pool_share` of what `concurrency` requests of mean length would take, so some preempt.
    `profile` is the reference's version profile (reference/profiles.py);
    `continue_prefill` None takes the profile's policy."""
    mean_blocks = 6 * 16 // block_size
    return SchedulerConfig(
        max_num_batched_tokens=max(256, 4 * concurrency), max_num_seqs=concurrency,
        max_model_len=512, block_size=block_size,
        num_blocks=max(64, int(concurrency * mean_blocks * pool_share)), num_pipeline_stages=2,
        long_prefill_token_threshold=0, num_spec_tokens=0, enable_prefix_caching=prefix_caching,
        continue_prefill=continue_prefill, profile=profile)


def write_long_trace(sink: TextIO, concurrency: int, num_events: int, seed: int = 0,
                     continue_prefill: bool | None = True, profile: str = DEFAULT_PROFILE,
                     prefix_caching: bool = True, block_size: int = 16,
                     repeated_prompts: float = 0.0, pool_share: float = 0.75) -> LongTrace:
    """Write a reference trace of at least `num_events` events to `sink`.
    `repeated_prompts`: the share of arrivals that repeat an earlier prompt
    whole (with small blocks, the prompt's last full block is recomputed and
    cached again while the first copy is cached: duplicate cached blocks)."""
    rng = random.Random(seed)
    counted = _CountingSink(sink)
    writer = TraceWriter(counted, eos_token_id=EOS)
    scheduler = make_scheduler(long_trace_config(concurrency, continue_prefill, profile, prefix_caching,
                                                 block_size, pool_share), writer)

    def sample(req_id: str, num_tokens: int, drafts) -> Sample:
        # tokens differ between requests: two requests of the same prompt then
        # differ in their outputs, as the spec's content labels assume (an
        # output block's label is its request's own)
        h = zlib.crc32(f"{req_id}/{num_tokens}".encode())
        return Sample(EOS if h % 61 == 0 else 1000 + (h >> 8) % 500)

    engine = Engine(scheduler, ScriptedExecutor(sample))
    prefixes = [[7000 + 100 * p + i for i in range(32)] for p in range(4)]
    arrivals = 0
    prompts: list[list[int]] = []

    def arrive() -> None:
        nonlocal arrivals
        if prompts and rng.random() < repeated_prompts:
            tokens = list(rng.choice(prompts))
        else:
            length = rng.randint(8, 96)
            shared = prefixes[rng.randrange(len(prefixes))][: min(32, length)] if rng.random() < 0.5 else []
            tokens = shared + [10_000 + rng.randrange(50_000) for _ in range(length - len(shared))]
            prompts.append(tokens)
        engine.add_request(Request(f"r{arrivals}", tokens,
                                   SamplingParams(max_tokens=rng.randint(4, 64)), eos_token_id=EOS))
        arrivals += 1

    seconds = 0.0
    while counted.lines < num_events:
        while len(scheduler.waiting) + len(scheduler.running) < concurrency:
            arrive()
        started = time.perf_counter()
        engine.step()
        seconds += time.perf_counter() - started
    started = time.perf_counter()
    engine.run()
    seconds += time.perf_counter() - started
    writer.end()
    return LongTrace(counted.lines, arrivals, seconds)

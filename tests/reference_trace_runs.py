"""Deterministic traced runs of the reference scheduler, for the golden test
that pins the trace bytes (tests/test_reference_trace_golden.py).

Each run drives an `Engine` with a seeded `random.Random`: arrivals that
share prompt prefixes (prefix-cache hits), a small KV pool (preemption),
aborts and outside finishes (some of unknown or repeated ids, some names
reused after an abort), draft tokens with partial acceptance, EOS and stop
tokens, and a random interleaving of scheduling and completion. The traces
cover the correct scheduler and every mutant under both policies; a mutant
that raises or hangs ends its run early, and the golden records why.
"""

from __future__ import annotations

import hashlib
import io
import random
import zlib
from collections.abc import Sequence

from flightcheck.reference import (Engine, EngineCoreOutput, Request, RequestStatus, Sample, SamplingParams,
                                   SchedulerConfig, ScriptedExecutor, TraceWriter, make_scheduler)
from flightcheck.reference.profiles import DEFAULT_PROFILE
from flightcheck.verification.mutants.patching import reference_applied
from flightcheck.verification.mutants.reference import MUTANTS

EOS = 2
STOP = 3
PREFIXES = ([10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24, 25, 26, 27])
SEEDS = tuple(range(6))
NUM_ACTIONS = 160


def run_cases() -> list[tuple[str, str | None, bool, int]]:
    """(case name, mutant, continue_prefill, seed) of every golden run."""
    cases = []
    for mutant in (None, *MUTANTS):
        for continue_prefill in (True, False):
            for seed in SEEDS:
                policy = "cp" if continue_prefill else "obpr"
                cases.append((f"{mutant or 'correct'}-{policy}-{seed}", mutant, continue_prefill, seed))
    return cases


def config_for(continue_prefill: bool, seed: int, profile: str = DEFAULT_PROFILE,
               prefix_caching: bool = True) -> SchedulerConfig:
    """The golden runs' configuration; `profile` and `prefix_caching` vary it
    for other tests (the golden itself uses the defaults)."""
    return SchedulerConfig(
        max_num_batched_tokens=12, max_num_seqs=4, max_model_len=40, block_size=4,
        num_blocks=10 + seed % 3, num_pipeline_stages=2 + seed % 3, long_prefill_token_threshold=seed * 5,
        num_spec_tokens=2, enable_prefix_caching=prefix_caching, continue_prefill=continue_prefill,
        profile=profile)


def _mix(*parts: object) -> int:
    """A hash that does not depend on PYTHONHASHSEED."""
    return zlib.crc32(repr(parts).encode())


def _sample(req_id: str, position: int, drafts: Sequence[int]) -> Sample:
    h = _mix(req_id, position, tuple(drafts))
    token = (EOS, STOP)[h % 2] if h % 23 == 0 else 100 + h % 50
    return Sample(token, num_accepted=(h >> 5) % 3, next_draft_token_ids=(200 + h % 7, 201)[: (h >> 8) % 3])


def traced_run(mutant: str | None, continue_prefill: bool, seed: int, profile: str = DEFAULT_PROFILE,
               prefix_caching: bool = True) -> str:
    """The trace text of one run, then `# raised ...` or `# stuck` if it ended early."""
    sink = io.StringIO()
    trace = TraceWriter(sink, eos_token_id=EOS, extra={"mutant": mutant} if mutant is not None else None)
    _, ending = drive(mutant, continue_prefill, seed, trace, profile, prefix_caching)
    return sink.getvalue() + ending


def drive(mutant: str | None, continue_prefill: bool, seed: int, trace: TraceWriter | None,
          profile: str = DEFAULT_PROFILE, prefix_caching: bool = True) -> tuple[list[EngineCoreOutput], str]:
    """One run (with the reference mutant `mutant` in force, if one is
    named): every output the engine returned, and how it ended ("" when
    every request finished; the trace, if any, then has its `end`)."""
    with reference_applied(mutant):
        return _drive(seed, trace, config_for(continue_prefill, seed, profile, prefix_caching))


def _drive(seed: int, trace: TraceWriter | None,
           config: SchedulerConfig) -> tuple[list[EngineCoreOutput], str]:
    rng = random.Random(seed)
    scheduler = make_scheduler(config, trace)
    engine = Engine(scheduler, ScriptedExecutor(_sample, sample_every_chunk=seed % 2 == 1))
    names: list[str] = []
    outputs: list[EngineCoreOutput] = []
    ending = ""
    try:
        for action in range(NUM_ACTIONS):
            roll = rng.random()
            if roll < 0.3 and len(names) < 30:
                _arrive(engine, rng, names)
            elif roll < 0.36 and names:
                engine.abort_request(rng.choice(names + ["nobody"]))
            elif roll < 0.38 and names:
                name = rng.choice(names)
                scheduler.finish_requests([name, name, "nobody"], RequestStatus.FINISHED_STOPPED)
            elif roll < 0.45 and names:
                name = rng.choice(names)        # a name reused once its request is gone
                if name not in scheduler.requests:
                    engine.add_request(Request(name, [*PREFIXES[0][:4], action],
                                               SamplingParams(max_tokens=3), eos_token_id=EOS))
            elif engine.can_schedule() and (rng.random() < 0.7 or not engine.batch_queue):
                engine.schedule_step()
            elif engine.batch_queue:
                outputs.extend(engine.complete_oldest_step())
        outputs.extend(engine.run(max_steps=400))
        if trace is not None:
            trace.end()
    except RuntimeError as error:
        ending = f"# stuck: {error}\n" if "stuck" in str(error) or "within" in str(error) \
            else f"# raised RuntimeError: {error}\n"
    except Exception as error:  # noqa: BLE001 -- a mutant's crash is part of its behaviour
        ending = f"# raised {type(error).__name__}: {error}\n"
    return outputs, ending


def _arrive(engine: Engine, rng: random.Random, names: list[str]) -> None:
    name = f"r{len(names)}"
    names.append(name)
    prefix = PREFIXES[rng.randrange(2)][: rng.choice((0, 4, 8))]
    prompt = prefix + [30 + rng.randrange(60) for _ in range(rng.randrange(1, 9))]
    stops = (STOP,) if rng.random() < 0.5 else ()
    params = SamplingParams(max_tokens=rng.randrange(1, 20), ignore_eos=rng.random() < 0.2,
                            stop_token_ids=stops)
    engine.add_request(Request(name, prompt, params, eos_token_id=EOS))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

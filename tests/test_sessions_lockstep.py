"""The spec and the reference run the same random streaming sessions in
lockstep (spec/sessions.py, reference/sessions.py): the same arrivals, the
same schedule() calls (where the spec's engine may call it), the same
outputs (EOS or not, per request per batch) and the same inputs at the same
moments; after every step each request's status, counters, outputs and
table length, and each batch's entries, agree. A randomized check of the
reference against the spec for sessions, the one such run that has sessions so far."""

from __future__ import annotations

import random

import pytest

from flightcheck.reference.config import SchedulerConfig
from flightcheck.reference.consistency import consistency_errors
from flightcheck.reference.outputs import ModelRunnerOutput
from flightcheck.reference.request import Request, SamplingParams
from flightcheck.reference.scheduler import Scheduler
from flightcheck.spec import (Arrive, CompleteOldest, Config, Prompt, Sample, Schedule, SendInput, State, Status,
                              initial_state, invariants_for, sampling_entries, step)

pytestmark = pytest.mark.usefixtures("both_checkers")   # runs fuzz/campaign checks: both checkers compared

EOS = 2


def _spec_view(s: State, names: list[str]) -> dict:
    view = {}
    for r, name in enumerate(names):
        q = s.requests[r]
        if q.status.is_active:
            view[name] = (q.status.value, q.num_computed, q.num_tokens, q.num_output, q.num_in_flight, q.num_stale,
                          q.placeholders, len(q.block_table))
    return view


def _reference_view(ref: Scheduler) -> dict:
    return {name: (r.status.name.replace("FINISHED_LENGTH_CAPPED", "FINISHED_LENGTH"), r.num_computed_tokens,
                   r.num_tokens, r.num_output_tokens, r.num_in_flight_tokens, r.num_stale_output_tokens,
                   r.num_output_placeholders, len(ref.kv_cache_manager.req_to_blocks.get(name, ())))
            for name, r in ref.requests.items()}


def _request(name: str, n: int, max_tokens: int, resumable: bool, first: int) -> Request:
    request = Request(name, [first + i for i in range(n)], SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
    request.resumable = resumable
    return request


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.34-async", "vllm-0.33", "vllm-0.33-async"])
@pytest.mark.parametrize("seed", range(12))
def test_spec_and_reference_agree_on_random_sessions(profile: str, seed: int):
    rng = random.Random(seed)
    cfg = Config(num_stages=2, max_num_batched_tokens=6, max_num_seqs=2, block_size=2, num_blocks=12,
                 max_model_len=24, prefix_caching=False, profile=profile, streaming_sessions=True)
    ref = Scheduler(SchedulerConfig(max_num_batched_tokens=6, max_num_seqs=2, max_model_len=24, block_size=2,
                                    num_blocks=12, enable_prefix_caching=False, num_pipeline_stages=2,
                                    profile=profile))
    names = [f"r{i}" for i in range(3)]
    prompts = []
    for i in range(3):
        inputs = tuple((rng.randint(1, 3), rng.randint(1, 2)) for _ in range(rng.randint(0, 2))) if i != 1 else ()
        prompts.append(Prompt(rng.randint(1, 4), rng.randint(1, 2), session=inputs + ((0, 0),) if i != 1 else ()))
    s = initial_state(3, cfg.num_blocks)
    outputs = []                                   # the reference's batches in flight, FIFO
    for r, p in enumerate(prompts):
        s = step(s, cfg, Arrive(r, p))
        ref.add_request(_request(names[r], p.prompt_len, p.max_tokens, bool(p.session), 10 * r + 10))
    for _ in range(300):
        senders = [r for r, q in enumerate(s.requests) if q.inputs_to_send and q.status.is_active]
        choice = rng.random()
        if senders and choice < 0.2:
            r = rng.choice(senders)
            tokens, max_tokens = s.requests[r].inputs_to_send[0]
            s = step(s, cfg, SendInput(r))
            ref.add_request(_request(names[r], max(tokens, 1), max(max_tokens, 1), tokens > 0, 50))
        elif choice < 0.6 and (nxt := step(s, cfg, Schedule())) is not None:
            s, out = nxt, ref.schedule()
            spec_batch = {names[e.req]: e.n for e in s.in_flight[-1]}
            assert {e.req_id: e.num_new_tokens for e in out.entries} == spec_batch
            outputs.append(out)
        elif s.in_flight:
            eos = {name: rng.random() < 0.35 for name in names}
            samples = tuple(Sample(stop_at=0 if eos[names[e.req]] else None) for e in sampling_entries(s, cfg))
            s = step(s, cfg, CompleteOldest(samples))
            out = outputs.pop(0)
            ref.update_from_output(out, ModelRunnerOutput.from_tokens(
                {e.req_id: [EOS if eos[e.req_id] else 7] for e in out.entries}))
        else:
            continue
        assert s is not None
        assert [i.name for i in invariants_for(cfg) if not i.holds(s, cfg)] == []
        assert consistency_errors(ref) == []
        assert _reference_view(ref) == _spec_view(s, names)
        if not s.in_flight and not any(q.status.is_active for q in s.requests):
            break
    assert not any(q.status.is_active for q in s.requests)


@pytest.mark.parametrize("name", ["continuation_applied_while_running_pr52693", "turn_output_not_dropped_pr52765",
                                  "stop_keeps_optimistic_tokens_omni5183", "waiting_session_seat_freed"])
def test_each_reference_session_mutant_is_caught_in_lockstep(name: str):
    """Each of the reference's session mutants (verification/mutants/reference.py
    `SESSIONS`) makes the lockstep run fail (the views differ, or the
    reference's own checks or assertions break) on one of the first seeds."""
    from flightcheck.verification.mutants import reference_applied
    from flightcheck.verification.mutants.reference import REFERENCE_MUTANTS

    caught = []
    with reference_applied(name):
        for seed in range(25):
            try:
                test_spec_and_reference_agree_on_random_sessions(REFERENCE_MUTANTS[name].profile, seed)
            except (AssertionError, ValueError):
                caught.append(seed)
                break
    assert caught, f"{name} survived 25 lockstep runs"

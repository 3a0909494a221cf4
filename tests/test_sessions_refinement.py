"""The refinement fuzzer with streaming sessions
(verification/refinement/sessions_machine.py): the reference refines the
spec step by step with sessions whose inputs come at any moment (queued while
the session runs, taken at once while it is parked); each reference mutant
of sessions is caught from a pinned seed. And the two refinement mismatches
the fuzzer found, each fixed in the reference as vLLM 0.34 reads, and the
two liveness holes it found in the spec and the reference alike (vLLM's
own, tests/test_vllm_sessions.py)."""

from __future__ import annotations

import pytest

from flightcheck.reference.config import SchedulerConfig
from flightcheck.reference.outputs import ModelRunnerOutput
from flightcheck.reference.request import Request, SamplingParams
from flightcheck.reference.scheduler import Scheduler
from flightcheck.spec import (Arrive, CompleteOldest, Config, Prompt, Sample, Schedule, SendInput, initial_state,
                              invariants_for, step)
from flightcheck.verification.mutants.reference import ALL_MUTANTS, SESSION_MUTANTS, profile_of_mutant
from flightcheck.verification.refinement.sessions_machine import SESSIONS_FUZZED_PROFILES, sessions_fuzz

pytestmark = pytest.mark.usefixtures("both_checkers")   # a refinement fuzzer: both checkers compared

EOS = 1

# mutant -> (seed, steps) of a run that catches it (measured 2026-12-06: 0.2 to 3 s each)
# (#52693 by the reference's own assertion, vLLM's in `_update_request_as_session`)
CAUGHT_FROM = {
    "continuation_applied_while_running_pr52693": (2, 3000),
    "turn_output_not_dropped_pr52765": (1, 3000),
    "stop_keeps_optimistic_tokens_omni5183": (2, 3000),
    "waiting_session_seat_freed": (3, 3000),
}


def test_the_session_mutants_are_kept_out_of_the_default_fuzzed_set():
    assert set(SESSION_MUTANTS) == set(CAUGHT_FROM)
    assert not set(SESSION_MUTANTS) & set(ALL_MUTANTS)


@pytest.mark.parametrize("name", list(CAUGHT_FROM))
def test_the_sessions_fuzzer_catches_each_session_bug_of_the_reference(name):
    seed, steps = CAUGHT_FROM[name]
    failure = sessions_fuzz(steps, seed, profile_of_mutant(name), mutant=name, shrink=False)
    assert failure is not None, f"{name} survived {steps} steps from seed {seed}"


@pytest.mark.parametrize("profile", SESSIONS_FUZZED_PROFILES)
def test_the_reference_refines_the_spec_with_streaming_sessions(profile):
    assert sessions_fuzz(300, 1, profile) is None


# -- the fuzzer's findings --------------------------------------------------------

def _scheduler(profile: str, num_spec_tokens: int = 0, budget: int = 8) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=2, max_model_len=16, block_size=2,
                                     num_blocks=8, enable_prefix_caching=False, num_spec_tokens=num_spec_tokens,
                                     profile=profile))


def _session(tokens: list[int], max_tokens: int, resumable: bool = True) -> Request:
    request = Request("s", tokens, SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
    request.resumable = resumable
    return request


def _park(ref: Scheduler) -> None:
    """The session's first turn: scheduled, its one token returned, parked."""
    ref.add_request(_session([10], max_tokens=1))
    out = ref.schedule()
    ref.update_from_output(out, ModelRunnerOutput.from_tokens({"s": [7]}))
    assert ref.requests["s"].status.name == "WAITING_FOR_STREAMING_REQ"


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_an_engine_with_only_parked_sessions_has_no_request(profile):
    """vLLM 0.33's and 0.34's `Scheduler.get_num_unfinished_requests` takes
    `num_waiting_for_streaming_input` off the waiting count, so with only a
    parked session `has_requests()` is false and the engine queues no empty
    batch for it; the reference counted the parked session (found by the
    sessions fuzzer: an empty batch queued where the spec's `has_requests`
    queues none)."""
    ref = _scheduler(profile)
    _park(ref)
    assert ref.get_num_unfinished_requests() == 0
    assert not ref.has_unfinished_requests() and not ref.has_requests()


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_a_sessions_next_turn_of_one_token_is_padded_with_drafts(profile):
    """vLLM 0.34's `Scheduler.schedule` admits a session's next turn through
    the waiting loop's branch for requests with computed tokens, where a
    decode (one token left) is padded with k drafts ("Pad new decode
    requests to uniform spec decoding size"); the reference's held-session
    loop admitted it unpadded (found by the sessions fuzzer under
    vllm-0.34, as the spec's `padded_admission` pads it)."""
    ref = _scheduler(profile, num_spec_tokens=2)
    _park(ref)
    ref.add_request(_session([20], max_tokens=1))        # the next input: one token
    out = ref.schedule()
    assert out.num_scheduled_tokens == {"s": 3}
    assert [tuple(e.spec_token_ids) for e in out.entries] == [(-1, -1)]
    cfg = Config(num_stages=1, max_num_batched_tokens=8, max_num_seqs=2, block_size=2, num_blocks=8,
                 max_model_len=16, num_spec_tokens=2, prefix_caching=False, profile=profile, streaming_sessions=True)
    s = step(initial_state(1, 8), cfg, Arrive(0, Prompt(1, 1, session=((1, 1), (0, 0)))))
    s = step(step(s, cfg, Schedule()), cfg, CompleteOldest((Sample(),)))
    s = step(step(s, cfg, SendInput(0)), cfg, Schedule())
    assert [(e.req, e.n, e.drafts) for e in s.in_flight[-1]] == [(0, 3, 2)]


def test_finding_a_one_token_turn_is_never_admitted_below_the_padding_budget():
    """The liveness hole the sessions fuzzer met (spec and reference alike,
    so no refinement failure; L2 breaks): a session's next turn always has
    computed tokens, so a turn of one token is a padded decode, admitted only
    when 1 + k fits the budget ("Prefer to not schedule than schedule
    un-padded"). With a budget below 1 + k it never is: nothing runs and
    nothing ever will. vLLM 0.33 and 0.34 stall the same way on their real
    scheduler (tests/test_vllm_sessions.py,
    `test_finding_vllm_stalls_a_sessions_next_turn_as_the_spec_does`). The
    fuzzer draws budgets of at least 1 + k."""
    cfg = Config(num_stages=1, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=8,
                 max_model_len=16, num_spec_tokens=3, prefix_caching=False, profile="vllm-0.34",
                 streaming_sessions=True)
    s = step(initial_state(1, 8), cfg, Arrive(0, Prompt(1, 1, session=((1, 1), (0, 0)))))
    s = step(step(s, cfg, Schedule()), cfg, CompleteOldest((Sample(),)))
    s = step(s, cfg, SendInput(0))
    assert [i.name for i in invariants_for(cfg) if not i.holds(s, cfg)] == ["L2_no_deadlock"]
    spun = step(s, cfg, Schedule())                    # an empty batch (vLLM 0.34's loop queues it)
    assert spun.in_flight == ((),) and step(spun, cfg, CompleteOldest(())) == s
    ref = _scheduler("vllm-0.34", num_spec_tokens=3, budget=3)
    _park(ref)
    ref.add_request(_session([20], max_tokens=1))
    assert ref.schedule().num_scheduled_tokens == {}


def test_finding_two_sessions_that_fill_the_pool_between_turns_wait_for_each_other():
    """The second liveness hole the sessions fuzzer met (spec and reference
    alike; L2 breaks): a session keeps its blocks between turns and the
    waiting loop never preempts, so two sessions that fill the pool and are
    each sent a next input that needs one more block are never admitted
    again. vLLM 0.33 and 0.34 stall the same way on their real scheduler
    (tests/test_vllm_sessions.py; vLLM's open PR #49439 describes it). The
    fuzzer keeps at most two sessions unfinished, with a pool for three."""
    cfg = Config(num_stages=1, max_num_batched_tokens=8, max_num_seqs=2, block_size=1, num_blocks=4,
                 max_model_len=4, prefix_caching=False, profile="vllm-0.34", streaming_sessions=True)
    s = initial_state(2, 4)
    for r in (0, 1):
        s = step(s, cfg, Arrive(r, Prompt(2, 1, session=((1, 1), (0, 0)))))
    s = step(step(s, cfg, Schedule()), cfg, CompleteOldest((Sample(), Sample())))
    s = step(step(s, cfg, SendInput(0)), cfg, SendInput(1))
    assert s.kv_holding == (0, 1) and not s.pool.free_queue
    assert [i.name for i in invariants_for(cfg) if not i.holds(s, cfg)] == ["L2_no_deadlock"]
    ref = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=2, max_model_len=4, block_size=1,
                                    num_blocks=4, enable_prefix_caching=False, profile="vllm-0.34"))
    for name in ("a", "b"):
        request = Request(name, [10, 11], SamplingParams(max_tokens=1), eos_token_id=EOS)
        request.resumable = True
        ref.add_request(request)
    ref.update_from_output(ref.schedule(), ModelRunnerOutput.from_tokens({"a": [7], "b": [7]}))
    for name in ("a", "b"):
        update = Request(name, [20], SamplingParams(max_tokens=1), eos_token_id=EOS)
        update.resumable = True
        ref.add_request(update)
    assert ref.schedule().num_scheduled_tokens == {} and ref.schedule().num_scheduled_tokens == {}

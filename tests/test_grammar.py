"""Structured output in the spec (spec/grammar.py; docs/request-states.md,
"Structured output"): a request waits while its grammar compiles, a failed
grammar finishes it with FINISHED_ERROR, the FSM advances by exactly the
accepted output tokens with batches in flight, a deferred bitmask is built
after the oldest output; G1-G3 hold on every grammar model under vLLM 0.33
and 0.34, sync and async; each grammar mutant is killed on its model by the
property and at the length the registry records; a configuration without
structured output is as before."""

from __future__ import annotations

import pytest

from flightcheck.spec import Config, Prompt, Sample, Status, invariants_for, step
from flightcheck.spec.grammar import DEFERRED
from flightcheck.spec.state import Grammar, initial_state
from flightcheck.spec.transitions import Arrive, CompileGrammar, CompleteOldest, FailGrammar, Schedule
from flightcheck.verification.explicit.search import search
from flightcheck.verification.grammar_models import GRAMMAR_MODELS, grammar_mutant_model
from flightcheck.verification.mutants import ALL_MUTANTS, GRAMMAR_MUTANTS
from flightcheck.verification.mutants.grammar import GRAMMAR_PROFILE

ASYNC_K1 = Config(num_stages=1, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
                  max_model_len=7, num_spec_tokens=1, prefix_caching=False, profile="vllm-0.34-async",
                  structured_output=True)


def run(cfg: Config, *actions):
    s = initial_state(1, cfg.num_blocks)
    for a in actions:
        nxt = step(s, cfg, a)
        assert nxt is not None, f"{a} is disabled"
        s = nxt
    return s


@pytest.mark.parametrize("model", GRAMMAR_MODELS, ids=lambda m: m.name)
def test_the_grammar_invariants_hold_on_every_grammar_model(model) -> None:
    result = search(model)
    assert result.ok, [(v.property, [str(a) for a, _ in v.path]) for v in result.violations]
    assert {"G1_no_run_while_compiling", "G2_fsm_tracks_output", "G3_fsm_never_refuses"} <= \
        {i.name for i in invariants_for(model.cfg)}


@pytest.mark.parametrize("name", sorted(GRAMMAR_MUTANTS))
def test_each_grammar_mutant_is_killed_as_recorded(name: str) -> None:
    m = GRAMMAR_MUTANTS[name]
    assert m.profile == GRAMMAR_PROFILE and ALL_MUTANTS[name] is m
    result = search(grammar_mutant_model(name), stop_at_first=True)
    assert result.violations, f"{name} survives"
    v = result.violations[0]
    assert (v.property, len(v.path)) == (m.killed_by, m.shortest)


def test_the_issue_bugs_are_named_mutants() -> None:
    assert {n.rsplit("_", 1)[1] for n in GRAMMAR_MUTANTS if GRAMMAR_MUTANTS[n].kind == "historical"} == \
        {"29379", "49694", "pr45012"}


def test_a_request_waits_for_its_grammar_and_a_failed_one_finishes_with_an_error() -> None:
    cfg = ASYNC_K1
    s = run(cfg, Arrive(0, Prompt(2, 3, structured=True)))
    assert s.requests[0].status is Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    waiting = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), Schedule())
    assert waiting.requests[0].num_computed == 0 and waiting.in_flight == ((),)   # skipped: an empty batch
    failed = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), FailGrammar(0), Schedule(), CompleteOldest())
    assert failed.requests[0].status is Status.FINISHED_ERROR and failed.grammar_errors == frozenset()
    ready = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), CompileGrammar(0), Schedule())
    assert ready.requests[0].status is Status.RUNNING and ready.in_flight[0][0].mask == 0


def test_a_second_decode_in_flight_defers_its_bitmask_until_the_oldest_output() -> None:
    cfg = ASYNC_K1
    s = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), CompileGrammar(0), Schedule(), Schedule())
    assert [e.mask for b in s.in_flight for e in b] == [0, DEFERRED]
    assert step(s, cfg, Schedule()) is None                         # the engine waits for the oldest output
    s = step(s, cfg, CompleteOldest((Sample(),)))
    assert s.requests[0].fsm == 1 and s.in_flight[0][0].mask == 1   # built from the advanced FSM
    s = step(s, cfg, CompleteOldest((Sample(num_accepted=1),)))
    assert s.requests[0].status is Status.FINISHED_LENGTH and s.requests[0].fsm == 3 == s.requests[0].num_output


def test_the_verifier_accepts_no_draft_from_the_first_illegal_one_on() -> None:
    cfg = ASYNC_K1
    s = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), CompileGrammar(0), Schedule(), Schedule(),
            CompleteOldest((Sample(),)))
    assert step(s, cfg, CompleteOldest((Sample(num_accepted=1, illegal_from=0),))) is None
    s = step(s, cfg, CompleteOldest((Sample(num_accepted=0, illegal_from=0),)))
    assert s.requests[0].grammar is Grammar.READY and s.requests[0].fsm == 2 == s.requests[0].num_output


def test_vllm_033_sync_schedules_no_illegal_draft() -> None:
    from dataclasses import replace
    from flightcheck.spec.grammar import illegal_drafts_scheduled
    assert not illegal_drafts_scheduled(replace(ASYNC_K1, profile="vllm-0.33"))
    assert illegal_drafts_scheduled(replace(ASYNC_K1, profile="vllm-0.33-async"))
    assert illegal_drafts_scheduled(replace(ASYNC_K1, profile="vllm-0.34"))


def test_without_structured_output_a_structured_prompt_is_a_plain_one() -> None:
    from dataclasses import replace
    cfg = replace(ASYNC_K1, structured_output=False)
    s = run(cfg, Arrive(0, Prompt(2, 3, structured=True)), Schedule())
    assert s.requests[0].grammar is Grammar.NONE and s.requests[0].status is Status.RUNNING
    assert s.in_flight[0][0].mask is None
    assert not any(i.name.startswith("G") for i in invariants_for(cfg))


def test_structured_output_needs_a_profile_that_models_it() -> None:
    with pytest.raises(ValueError):
        Config(profile="vllm-0.8.5", structured_output=True)

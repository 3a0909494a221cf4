"""The Z3 encoding of vllm-0.33-async (issue 22): output placeholders, the
decode countdown, the queue of K + 1 batches, the max_tokens guard,
num_new_tokens with placeholders, their reset on preemption and settlement at
completion, and block hashing on output. The cross-check compares the
encoding's transition relation with the spec's, both ways, on states of the
profile's own models met by seeded random walks, chosen so that each async
rule is in play (the controls below)."""

from __future__ import annotations

import pytest

from flightcheck.spec import State
from flightcheck.verification.models import PROFILE_MODELS
from flightcheck.verification.z3.encoding.crosscheck import (CrossChecker, CrossReport, random_walk_states,
                                                             reachable)
from flightcheck.verification.z3.encoding.state import Layout
from flightcheck.verification.z3.profiles import ENCODED_PROFILES, profile_model

ASYNC = "vllm-0.33-async"
ASYNC_MODELS = PROFILE_MODELS[ASYNC]


def _held_by_max_tokens_guard(s: State, r: int) -> bool:
    """spec.schedule._placeholders_reach_max_tokens on a RUNNING request."""
    q = s.requests[r]
    return q.placeholders > 0 and q.num_computed + 2 - q.placeholders >= q.prompt_len + q.max_tokens


def _async_states(model, count: int = 30) -> list[State]:
    """`count` random-walk states of `model` where the async rules bite (a
    request with placeholders, or counting down), and 10 others."""
    walk = random_walk_states(model, 400, seed=11)
    busy = [s for s in walk if any(q.placeholders or q.decode_countdown for q in s.requests)]
    calm = [s for s in walk if s not in set(busy)]
    return busy[:count] + calm[:10]


def test_the_async_profile_is_encoded():
    assert ASYNC in ENCODED_PROFILES
    layout = Layout.of(ASYNC_MODELS[0])
    assert layout.K == ASYNC_MODELS[0].cfg.num_stages + 1      # the queue holds K + 1 batches


@pytest.mark.parametrize("model", ASYNC_MODELS, ids=lambda m: m.name)
def test_relation_equals_spec_on_random_states_of_the_async_models(model):
    checker, report = CrossChecker(model), CrossReport()
    for s in _async_states(model):
        checker.check(s, report)
    assert report.problems == []
    assert report.states == 40 and report.edges > report.states


def test_the_cross_checked_states_exercise_every_async_rule():
    """Control for the cross-check: among its states, a request with two
    placeholder groups in flight, one counting down, one the max_tokens guard
    holds back, one with drafts among its placeholders (spec decode), and a
    full queue of K + 1 batches."""
    states = [(m, s) for m in ASYNC_MODELS for s in _async_states(m)]
    assert any(q.placeholders >= 2 and q.num_drafts == 0 for _, s in states for q in s.requests)
    assert any(q.decode_countdown > 0 for _, s in states for q in s.requests)
    assert any(_held_by_max_tokens_guard(s, r) for _, s in states for r in s.running)
    assert any(any(e.drafts for b in s.in_flight for e in b if e.samples) for m, s in states
               if m.cfg.num_spec_tokens)
    assert any(len(s.in_flight) == m.cfg.num_stages + 1 for m, s in states)


@pytest.mark.slow
def test_relation_equals_spec_on_every_reachable_state_of_async_drafts_k2():
    """Every reachable state of the async model with spec decode and prefix
    caching (2,465 states; minutes)."""
    model = next(m for m in ASYNC_MODELS if m.name == "async-drafts-k2")
    states = list(reachable(model))
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    assert report.problems == [] and report.states == len(states)


def test_a_sync_model_under_the_async_profile_is_cross_checked_too():
    """profile_model carries a sync model into the async profile (the verify
    model's route): its relation is the spec's as well."""
    from flightcheck.verification import models
    model = profile_model(models.SHARED_K3, ASYNC)
    checker, report = CrossChecker(model), CrossReport()
    for s in random_walk_states(model, 25, seed=5):
        checker.check(s, report)
    assert report.problems == []

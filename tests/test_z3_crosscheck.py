"""The Z3 transition relation is the concrete spec's: on small models
exhaustively, on the default model on states met by seeded random walks, and
for mutants; every Z3 successor decodes to a concrete successor through a spec
action that replays, and every concrete successor is a Z3 successor."""

from __future__ import annotations

import dataclasses

import pytest
import z3

from flightcheck.spec import Config, Fate, Prompt, Schedule, State, step
from flightcheck.verification import models
from flightcheck.verification.mutants import MUTANTS
from flightcheck.verification.z3.encoding.crosscheck import (CrossChecker, CrossReport, random_walk_states,
                                                   reachable)
from flightcheck.verification.z3.encoding.state import Layout, NotRepresentable, constant_state, decode, initial
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import arithmetic
from flightcheck.spec import profiles as spec_profiles
from flightcheck.verification.z3.profiles import DEFERRAL_MODEL, ENCODED_PROFILES, profile_model


# K = 3, spec decode and a shared prefix label, small enough to enumerate in seconds.
TINY_K3 = models.Model(
    "tiny-k3", Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
                      max_model_len=6, prefix_caching=True, num_spec_tokens=1),
    (Prompt(2, 1, (7,)), Prompt(3, 1, (7,))))

# Preemption with spec decode and the long-prefill threshold.
TINY_PREEMPT = models.Model(
    "tiny-preempt", Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=2,
                           max_model_len=6, prefix_caching=True, num_spec_tokens=1,
                           long_prefill_token_threshold=1),
    (Prompt(1, 2), Prompt(3, 1, (7,))))


# No prefix caching: blocks are released first block first (KVCacheManager.free),
# and one-token blocks give tables of several blocks to release in either order.
TINY_NO_CACHE = models.Model(
    "tiny-no-cache", Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=1, num_blocks=4,
                            max_model_len=5, prefix_caching=False),
    (Prompt(2, 2), Prompt(2, 1)))

# Every profile the encoding models on a model with prefix caching (0.8.4: preallocation and one
# batch per request) and on one without (forward release order).
# (vllm-0.33-async's cross-check is tests/test_z3_async.py: its models' state
# spaces are larger, so it compares random-walk states there, every one slow.
# vllm-0.34-invalid-kv-fixed is 0.34 with one rule changed that acts only on
# a failed sync load beside prefix caching: without a connector its relation
# is 0.34's, compared here under 0.34.)
PROFILE_MODELS = [profile_model(model, profile) for profile in ENCODED_PROFILES
                  if profile not in ("vllm-0.33-async", "vllm-0.34-invalid-kv-fixed")
                  for model in (TINY_K3, TINY_NO_CACHE)]


def _check_all(model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


@pytest.mark.parametrize("model", [models.SINGLE_SEQ, TINY_K3], ids=lambda m: m.name)
def test_relation_equals_spec_on_every_reachable_state(model):
    states = list(reachable(model))
    report = _check_all(model, states)
    assert report.problems == []
    assert report.states == len(states) and report.edges > report.states


@pytest.mark.parametrize("model", PROFILE_MODELS, ids=lambda m: m.name)
def test_relation_equals_spec_on_every_reachable_state_under_each_profile(model):
    states = list(reachable(model))
    report = _check_all(model, states)
    assert report.problems == []
    assert report.states == len(states) and report.edges > report.states


def _reachable_pools(model) -> set:
    return {s.pool for s in reachable(model)}


def test_the_profile_models_exercise_what_the_profiles_change():
    """Control for the test above: each profile constant changes the reachable
    states of its model, so the cross-check compared the new behaviour."""
    forward = profile_model(TINY_NO_CACHE, "vllm-0.8.5")
    assert forward.cfg.release_order == "forward"
    reverse = dataclasses.replace(forward, cfg=dataclasses.replace(forward.cfg, release_order="reverse"))
    assert _reachable_pools(forward) != _reachable_pools(reverse)
    preallocating = profile_model(TINY_K3, "vllm-0.8.4")
    assert preallocating.cfg.num_preallocate_tokens > 0
    bs = preallocating.cfg.block_size
    assert any(len(q.block_table) > -(-(q.num_computed + 1) // bs)
               for s in reachable(preallocating) for q in s.requests)
    duplicating = profile_model(TINY_K3, "vllm-0.8.5")
    assert duplicating.cfg.cache_duplicate_blocks
    assert any(s.pool.duplicates for s in reachable(duplicating))


def _holding_drafts(model) -> list[State]:
    return [s for s in reachable(model) if any(q.num_drafts for q in s.requests)]


@pytest.mark.parametrize("profile", ["vllm-0.8.5", "vllm-0.8.4"])
def test_relation_equals_spec_where_a_request_holds_drafts_under_0_8(profile):
    """vLLM 0.8.x's held drafts (`Profile.held_drafts_left_uncached`): every
    reachable state of tiny-preempt in which a request holds drafts, where
    the preemptions that keep them and the allocations that leave them
    uncached start (its exhaustive cross-check is slow, below)."""
    model = profile_model(TINY_PREEMPT, profile)
    states = _holding_drafts(model)
    report = _check_all(model, states)
    assert report.problems == []
    assert report.states == len(states) > 0


def _preempted_drafts_cleared(states) -> set[State]:
    return {dataclasses.replace(s, requests=tuple(dataclasses.replace(q, num_drafts=0)
                                                  if q.status.name == "PREEMPTED" else q for q in s.requests))
            for s in states}


def test_tiny_preempt_exercises_the_held_drafts_rule(monkeypatch):
    """Control for the test above: under vLLM 0.8.5 a preempted request of
    tiny-preempt holds drafts, and without the rule (0.33's: drafts cleared
    at a preemption, only the scheduled ones uncached) other states are
    reached even with the preempted requests' drafts set aside: the blocks
    an allocation caches differ."""
    model = profile_model(TINY_PREEMPT, "vllm-0.8.5")
    held = set(reachable(model))
    assert any(q.status.name == "PREEMPTED" and q.num_drafts for s in held for q in s.requests)
    off = dataclasses.replace(spec_profiles.VLLM_0_8_5, name="vllm-0.8.5-without-held-drafts",
                              held_drafts_left_uncached=False)
    monkeypatch.setitem(spec_profiles.PROFILES, off.name, off)
    cleared = dataclasses.replace(model, cfg=dataclasses.replace(model.cfg, profile=off.name))
    assert _preempted_drafts_cleared(reachable(cleared)) != _preempted_drafts_cleared(held)


# vLLM 0.33's rules (Config.rules), each of which changes the reachable states
# of at least one of these models (the control below): the deferral model
# (every rule), tiny-preempt (full-sequence admission with prefix caching),
# tiny-k3 (the free-queue head with labelled blocks).
RULES_0_33 = ("unhashed_blocks_to_head", "threshold_needs_company", "sampled_token_slot",
              "full_sequence_admission", "defer_resume_while_stale", "stop_tokens_before_length")
MODELS_0_33 = [DEFERRAL_MODEL, profile_model(TINY_PREEMPT, "vllm-0.33"), profile_model(TINY_K3, "vllm-0.33")]


@pytest.mark.parametrize("model", MODELS_0_33[:2], ids=lambda m: m.name)
def test_relation_equals_spec_on_every_reachable_state_under_0_33(model):
    states = list(reachable(model))
    report = _check_all(model, states)
    assert report.problems == []
    assert report.states == len(states) and report.edges > report.states


@pytest.mark.parametrize("model", [models.DEFERRED_K3, profile_model(models.SHARED_K3, "vllm-0.33")],
                         ids=lambda m: m.name)
def test_relation_equals_spec_on_random_states_of_the_0_33_models(model):
    """The profile's own model and the verify model under 0.33 (prefix
    caching, three requests, deferrals): states met on seeded random walks."""
    report = _check_all(model, random_walk_states(model, 40, seed=11))
    assert report.problems == []


def _without_rule(model, rule: str, monkeypatch):
    """`model` under a copy of vllm-0.33 with one rule off (0.8.x's behaviour)."""
    off = dataclasses.replace(spec_profiles.VLLM_0_33, name="vllm-0.33-without-rule",
                              **{rule: 0 if rule == "sampled_token_slot" else False})
    monkeypatch.setitem(spec_profiles.PROFILES, off.name, off)
    return dataclasses.replace(model, cfg=dataclasses.replace(model.cfg, profile=off.name))


@pytest.mark.parametrize("rule", RULES_0_33)
def test_the_0_33_models_exercise_every_rule(rule, monkeypatch):
    """Control for the cross-checks under 0.33: each rule changes the reachable
    states of a cross-checked model, so the rule's encoding was compared."""
    assert any(set(reachable(model)) != set(reachable(_without_rule(model, rule, monkeypatch)))
               for model in MODELS_0_33)


def test_the_deferral_model_exercises_every_rule(monkeypatch):
    """The deferral model alone changes under each of the six rules."""
    base = set(reachable(DEFERRAL_MODEL))
    assert all(base != set(reachable(_without_rule(DEFERRAL_MODEL, rule, monkeypatch))) for rule in RULES_0_33)


def test_relation_equals_spec_on_random_states_of_the_default_model():
    states = random_walk_states(models.DEFAULT, 25, seed=1)
    report = _check_all(models.DEFAULT, states)
    assert report.problems == []


@pytest.mark.parametrize("mutant", ["stale_output_applied_to_resumed", "shared_snapshot"])
def test_relation_equals_mutant_spec(mutant):
    model = models.PRESSURE_K2.with_mutant(mutant)
    report = _check_all(model, list(reachable(model, limit=30)))
    assert report.problems == []


def test_relation_rejects_a_perturbed_successor():
    """Negative control: a successor with one counter off by one is not in T."""
    model = models.PRESSURE_K2
    checker = CrossChecker(model)
    s = next(x for x in reachable(model) if x.in_flight and step(x, model.cfg, Schedule()))
    nxt = step(s, model.cfg, Schedule())
    assert checker.satisfies(s, nxt)
    reqs = list(nxt.requests)
    r = nxt.in_flight[-1][0].req
    reqs[r] = dataclasses.replace(reqs[r], num_computed=reqs[r].num_computed + 1)
    assert not checker.satisfies(s, dataclasses.replace(nxt, requests=tuple(reqs)))
    batch = nxt.in_flight[-1]
    moved = (dataclasses.replace(batch[0], fate=Fate.ORPHANED),) + batch[1:]
    assert not checker.satisfies(s, dataclasses.replace(nxt, in_flight=nxt.in_flight[:-1] + (moved,)))


def test_encode_then_decode_is_the_identity():
    model = models.DEFAULT
    layout = Layout.of(model)
    for s in random_walk_states(model, 20, seed=3):
        solver = z3.Solver()
        system = System(model)
        solver.add(system.encode(s, "x"))
        assert solver.check() == z3.sat
        assert decode(layout, solver.model(), system.frame("x")) == s


def test_a_state_of_another_model_is_not_representable():
    layout = Layout.of(models.DEFAULT)
    other = random_walk_states(models.SHARED_K3, 1, seed=0)[0]
    with arithmetic(layout.width), pytest.raises(NotRepresentable):
        constant_state(layout, State(requests=other.requests, pool=other.pool))
    with arithmetic(layout.width):
        initial(layout)


@pytest.mark.slow
@pytest.mark.parametrize("model", [models.ONE_BATCH, TINY_PREEMPT, models.PRESSURE_K2, models.SHARED_K3,
                                   models.CROWDED], ids=lambda m: m.name)
def test_relation_equals_spec_on_every_reachable_state_of_the_larger_small_models(model):
    report = _check_all(model, reachable(model))
    assert report.problems == []


@pytest.mark.slow
def test_relation_equals_spec_on_hundreds_of_random_default_states():
    report = _check_all(models.DEFAULT, random_walk_states(models.DEFAULT, 300, seed=7))
    assert report.problems == []


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_relation_equals_every_mutant_spec(mutant):
    model = models.mutant_model(mutant)
    report = _check_all(model, list(reachable(model, limit=150)))
    assert report.problems == []

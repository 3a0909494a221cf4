"""The parameterised proof (verification/z3/param/model.py): the accounting
invariants hold for any number of requests, by 1-induction over one-request
micro-steps, and the parameterised model is linked to the concrete spec (every
reachable state satisfies Inv, every concrete edge is a sequence of
micro-steps), so the proof is about the spec and not about some other system.
Negative controls: mutants encoded as switches lose the induction with a
counterexample-to-induction, and mutants of the spec take concrete steps the
parameterised relation rejects."""

from __future__ import annotations

import random

import pytest

from flightcheck.verification.mutants import MUTANTS, applied
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification import models
from flightcheck.verification.z3.encoding.crosscheck import reachable
from flightcheck.verification.z3.param.model import PARAM_MUTANTS
from flightcheck.verification.z3.param.link import (RESTATED, check_link, edge_exists_in_z3,
                                                    invariant_in_z3, rejected_edges,
                                                    restatement_report)
from flightcheck.verification.z3.param.proof import hypothesis_has_a_finite_model, prove
from flightcheck.verification.z3.param.steps import MICRO_STEPS

# The spec property each switch-encoded mutant is there to break.
MUTANT_BREAKS = {
    "advance_at_completion": "S3",
    "decode_while_token_in_flight": "S5",
    "rejections_not_subtracted": "S8",
    "preempt_keeps_counter": "S1",
    "orphan_kept_after_reschedule": "S7",
}

# Mutants whose damage lies in what the parameterised model abstracts (the
# pool, the policy's order, scheduled_ids) or that only remove behaviours:
# their steps stay inside the over-approximation.
INSIDE_THE_ABSTRACTION = {"inflight_set_not_cleared_on_preemption", "blocks_not_freed_on_abort",
                          "admit_after_preemption", "complete_refuses_orphans",
                          "schedule_blocked_when_idle", "no_block_for_last_token"}

FAST_LINK_MODELS = [models.PRESSURE_K2, models.ONE_BATCH, models.SINGLE_SEQ, models.CROWDED]


@pytest.mark.parametrize("K", [2, 3])
def test_accounting_invariants_are_inductive_for_any_number_of_requests(K):
    proof = prove(K)
    assert proof.ok, [(q.name, q.status, q.broken) for q in proof.failures]
    assert len(proof.queries) == 1 + sum(len(k.depths(K)) for k in MICRO_STEPS)


@pytest.fixture(scope="module")
def links():
    return {m.name: check_link(m) for m in FAST_LINK_MODELS}


@pytest.mark.parametrize("model", FAST_LINK_MODELS, ids=lambda m: m.name)
def test_every_reachable_edge_of_the_spec_is_a_sequence_of_micro_steps(links, model):
    report = links[model.name]
    assert report.ok, report.problems[:5]
    assert report.states == sum(1 for _ in reachable(model))
    assert report.edges > report.states


def test_every_consecution_hypothesis_is_met_on_the_spec(links):
    """Every query's hypothesis Inv(x) ∧ depth = d ∧ guard has a model that is a spec state."""
    witnessed = links[models.PRESSURE_K2.name].witnessed()
    queries = {(k.name, d) for k in MICRO_STEPS for d in k.depths(models.PRESSURE_K2.cfg.num_stages)}
    assert queries <= witnessed, sorted(queries - witnessed)


@pytest.mark.parametrize("K", [2, 3])
def test_every_consecution_hypothesis_has_a_two_request_model(K):
    vacuous = [(k.name, d) for k in MICRO_STEPS for d in k.depths(K) if not hypothesis_has_a_finite_model(K, k, d)]
    assert not vacuous


@pytest.mark.parametrize("mutant", PARAM_MUTANTS)
def test_mutant_switch_loses_the_induction_with_a_counterexample(mutant):
    proof = prove(2, mutant, stop_at_first=True)
    assert not proof.ok
    cti = proof.failures[0]
    assert cti.status == "cti" and cti.cti
    assert any(b.startswith(MUTANT_BREAKS[mutant] + ".") for b in cti.broken), (cti.name, cti.broken)


@pytest.mark.parametrize("mutant", ["advance_at_completion", "decode_while_token_in_flight",
                                    "rejections_not_subtracted"])
def test_mutant_spec_takes_a_step_the_parameterised_relation_rejects(mutant):
    model = models.mutant_model(mutant)
    s, action, after, why = next(rejected_edges(model))
    assert why
    with applied(model.mutant):     # the edge's micro-steps re-run the (mutant) spec's schedule
        assert str(edge_exists_in_z3(s, model.cfg, action, after)) == "unsat"


def test_z3_interpretation_agrees_with_the_concrete_one_on_sampled_edges():
    model, rng = models.PRESSURE_K2, random.Random(7)
    states = rng.sample(list(reachable(model)), 25)
    for s in states:
        assert invariant_in_z3(s, model.cfg)
        for action, after in list(explicit.successors(model, s))[:2]:
            assert str(edge_exists_in_z3(s, model.cfg, action, after)) == "sat", (action, s)


def test_a_state_breaking_the_spec_breaks_inv_in_z3_too():
    model = models.mutant_model("rejections_not_subtracted")
    _, _, bad, _ = next(rejected_edges(model))
    assert not invariant_in_z3(bad, model.cfg)


def test_restated_properties_are_at_least_as_strong_as_the_spec():
    seen = {}
    for mutant in ("advance_at_completion", "no_length_cap", "orphan_kept_after_reschedule"):
        violations, weaker = restatement_report(models.mutant_model(mutant), max_states=2000)
        assert not weaker, weaker[:2]
        seen.update(violations)
    assert set(seen) == set(RESTATED)


@pytest.mark.slow
@pytest.mark.parametrize("K", [4, 8])
def test_accounting_invariants_are_inductive_for_deeper_pipelines(K):
    proof = prove(K)
    assert proof.ok, [(q.name, q.status, q.broken) for q in proof.failures]


@pytest.mark.slow
def test_no_consecution_query_is_vacuous_at_depth_8():
    assert all(hypothesis_has_a_finite_model(8, k, d) for k in MICRO_STEPS for d in k.depths(8))


@pytest.mark.slow
def test_every_reachable_edge_of_shared_k3_is_a_sequence_of_micro_steps():
    report = check_link(models.SHARED_K3)
    assert report.ok, report.problems[:5]
    queries = {(k.name, d) for k in MICRO_STEPS for d in k.depths(3)}
    assert queries - report.witnessed() <= {("preempt", 0)}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(set(MUTANTS) - INSIDE_THE_ABSTRACTION))
def test_every_mutant_outside_the_abstraction_is_rejected(mutant):
    model = models.mutant_model(mutant)
    s, action, after, _ = next(rejected_edges(model))
    with applied(model.mutant):     # the edge's micro-steps re-run the (mutant) spec's schedule
        assert str(edge_exists_in_z3(s, model.cfg, action, after)) == "unsat"


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(INSIDE_THE_ABSTRACTION))
def test_pool_and_policy_mutants_stay_inside_the_over_approximation(mutant):
    assert next(rejected_edges(models.mutant_model(mutant)), None) is None


@pytest.mark.slow
def test_restated_properties_are_at_least_as_strong_on_every_mutant():
    for mutant in MUTANTS:
        model = models.mutant_model(mutant)
        if model.cfg.continue_prefill:
            assert not restatement_report(model, max_states=20_000)[1]

"""Proofs with an inferred invariant (verification/z3/induction/inferred.py): the grammar's
candidates are well formed, the random-walk filter drops only candidates
that are false on a reachable state, Houdini keeps an inductive set that
proves every spec property of a small model, holds on every state the
concrete spec reaches and implies each hand-written strengthening
invariant, and a mutant's broken invariant is not proved."""

from __future__ import annotations

import pytest
import z3

from flightcheck.spec import INVARIANTS, TRANSITION_PROPERTIES, describe
from flightcheck.verification import models
from flightcheck.verification.z3.induction.inferred import (candidates, is_candidate, predicate, prove_inferred, refuted,
                                               sample_states)
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.induction.strengthening import AUXILIARY, auxiliary_for
from flightcheck.verification.z3.encoding.system import System

SPEC = {p.name for p in INVARIANTS} | {p.name for p in TRANSITION_PROPERTIES}


def test_the_grammar_names_each_candidate_once_and_each_is_a_predicate_over_a_frame():
    names = candidates()
    assert len(names) == len(set(names)) == 208       # pinned: a change of grammar shows here
    system = System(models.SHARED_K3)
    for n in names:
        assert is_candidate(n)
        assert z3.is_bool(system.build(predicate(n), system.frame(0))), n
    assert not any(is_candidate(n) for n in SPEC)
    with pytest.raises(ValueError, match="not a candidate of the grammar"):
        predicate("inferred req[any]: num_output=7")
    with pytest.raises(ValueError, match="not an invariant of the spec: S99"):
        prove_inferred(models.SINGLE_SEQ, invariants=["S99"])


def test_the_walk_filter_drops_only_candidates_false_on_a_state_it_reached():
    model = models.SHARED_K3
    system = System(model)
    states = sample_states(model, walks=20, length=30)
    false_on = refuted(system, candidates(), states)
    # true in every reachable state, so never dropped: a request that has not arrived is pristine
    assert "inferred req[status=NEW]: num_output=0" not in false_on
    # false once a schedule gives a request its first block
    assert "inferred req[any]: table_len=0" in false_on
    for n, state in false_on.items():
        assert state in states
        constant = system.constant(state)
        assert z3.is_false(z3.simplify(system.build(predicate(n), constant))), (n, describe(state))


def test_an_inferred_invariant_proves_every_spec_property_of_a_small_model():
    model = models.SINGLE_SEQ
    res = prove_inferred(model, jobs=2)       # the Houdini rounds shared between two processes
    rows = res.by_name()
    assert SPEC <= set(rows)
    assert [n for n in SPEC if rows[n].status != "proved"] == []
    kept = [p.name for p in res.properties if is_candidate(p.name) and p.status == "proved"]
    assert 50 < len(kept) < len(candidates())
    # what Houdini kept is true of the concrete spec: no state of other, longer walks refutes it
    assert refuted(System(model), kept, sample_states(model, walks=400, length=80, seed=1)) == {}
    assert res.notes and "kept" in res.notes[0]
    # and it rediscovers the hand-written strengthening: each of A1-A9 follows from it
    system = System(model)
    frame = system.frame(0)
    solver = z3.Solver()
    solver.add(system.build(well_formed, frame), *[system.build(predicate(n), frame) for n in kept])
    for name in auxiliary_for(model.cfg):      # A1-A11: the sync profiles' set
        aux = AUXILIARY[name]
        assert solver.check(z3.Not(system.build(aux, frame))) == z3.unsat, name


def test_a_mutants_broken_invariant_is_not_proved():
    # arrival_counter_stale leaves num_computed behind at arrival: S1 fails two steps in
    res = prove_inferred(models.SINGLE_SEQ.with_mutant("arrival_counter_stale"), invariants=["S1_counter_bounds"])
    assert res.by_name()["S1_counter_bounds"].status != "proved"


@pytest.mark.slow
def test_one_process_and_two_keep_the_same_candidates():
    # Houdini's result is the greatest inductive subset, whoever drops what first
    def kept(jobs: int) -> list[str]:
        res = prove_inferred(models.SINGLE_SEQ, jobs=jobs)
        return [p.name for p in res.properties if is_candidate(p.name) and p.status == "proved"]
    assert kept(1) == kept(2)


@pytest.mark.slow
@pytest.mark.parametrize("model", [models.SHARED_K3, models.ONE_BATCH], ids=lambda m: m.name)
def test_an_inferred_invariant_proves_every_spec_property(model):
    # shared-k3: 3 requests, K = 3, every feature on; a few minutes on two cores (README)
    res = prove_inferred(model, jobs=2)
    rows = res.by_name()
    assert [n for n in SPEC if rows[n].status != "proved"] == []

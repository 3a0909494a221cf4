"""The Z3 engines: BMC finds shortest counterexamples that replay on the
concrete spec and reaches the "sometimes" targets; k-induction with the
strengthening invariants proves every invariant (and reports a CTI without
them); Spacer proves invariants with no invariant given, finds a mutant's
violation and keeps to its budget."""

from __future__ import annotations

import time

import pytest
import z3

from flightcheck.spec import INVARIANTS
from flightcheck.verification import models
from flightcheck.verification.mutants import MUTANTS
from flightcheck.verification.traces.counterexample import broken_at, replay
from flightcheck.verification.z3.bmc.engine import BmcOptions, bmc, first_counterexample
from flightcheck.verification.z3.induction.kinduction import prove_by_induction
from flightcheck.verification.z3.results import replay as replay_checked
from flightcheck.verification.z3.induction.spacer import _with_definitions, spacer
from flightcheck.verification.z3.profiles import profile_model


def test_bmc_kills_a_mutant_with_a_shortest_replayable_trace():
    model = models.mutant_model("advance_at_completion")
    p = first_counterexample(model, max_depth=4)
    assert p is not None and p.status == "violated" and p.depth == 2
    states = replay(model, p.trace)
    assert states == p.states
    assert p.name in broken_at(model, states, p.trace, len(p.trace))


def test_bmc_bounds_the_correct_spec_and_reaches_sometimes_targets():
    res = bmc(models.SINGLE_SEQ, 3, BmcOptions(sometimes=["request_can_finish"]))
    rows = res.by_name()
    assert res.depth == 3
    assert all(rows[inv.name].status == "bounded" for inv in INVARIANTS)
    assert rows["request_can_finish"].status == "reached" and rows["request_can_finish"].depth == 3
    replay_checked(models.SINGLE_SEQ, rows["request_can_finish"].trace, rows["request_can_finish"].states)


@pytest.mark.parametrize("profile, target, depth", [("vllm-0.8.4", "preallocated_block", 2),
                                                    ("vllm-0.8.5", "duplicate_cached_block", 4)])
def test_bmc_reaches_the_new_sometimes_target_of_a_profile(profile, target, depth):
    """The verify model under each profile reaches the profile's new target
    (a preallocated block; a label cached twice) at its shortest depth (the
    explicit search's), on a trace that replays on the concrete spec."""
    model = profile_model(models.SHARED_K3, profile)
    res = bmc(model, depth, BmcOptions(properties=(), sometimes=(target,)))
    row = res.by_name()[target]
    assert row.status == "reached" and row.depth == depth
    replay_checked(model, row.trace, row.states)


def test_bmc_reaches_the_deferred_resumption_of_0_33():
    """vLLM 0.33's verification-only target: a schedule passes over a
    preempted request whose orphans are in flight, at depth 6 on the deferral
    model (the explicit search's shortest), on a trace that replays; and the
    verify model under 0.33 offers it, under 0.8.5 not."""
    from flightcheck.verification.z3.bmc.engine import applicable_sometimes
    from flightcheck.verification.z3.profiles import DEFERRAL_MODEL
    res = bmc(DEFERRAL_MODEL, 6, BmcOptions(properties=(), sometimes=("deferred_resumption",), reduce=True))
    row = res.by_name()["deferred_resumption"]
    assert row.status == "reached" and row.depth == 6
    replay_checked(DEFERRAL_MODEL, row.trace, row.states)
    assert "deferred_resumption" in applicable_sometimes(profile_model(models.SHARED_K3, "vllm-0.33"))
    assert "deferred_resumption" not in applicable_sometimes(models.SHARED_K3)


def test_k_induction_proves_every_invariant_of_the_deferral_model_under_0_33():
    """The quick 0.33 proof: every rule of the profile on 2 requests, K = 3
    (the verify model's proof is the slow test below)."""
    from flightcheck.verification.z3.encoding.invariants import COUNTER_FORMULAS
    from flightcheck.verification.z3.profiles import DEFERRAL_MODEL
    res = prove_by_induction(DEFERRAL_MODEL, jobs=2)
    assert [p.name for p in res.properties if p.status != "proved"] == []
    assert set(COUNTER_FORMULAS) <= {p.name for p in res.properties}    # IF1-IF3 among them


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.8.5", "vllm-0.8.4", "vllm-0.33", "vllm-0.33-async"])
def test_k_induction_proves_every_invariant_of_the_verify_model_under_each_profile(profile):
    """3 requests, K = 3, prefix caching: duplicate cached blocks under every
    profile, preallocation and one batch per request under 0.8.4, every rule
    of 0.33 (free-queue head, threshold with company, sampled-token slot,
    full-sequence admission, deferred resumption, stop order) under 0.33."""
    res = prove_by_induction(profile_model(models.SHARED_K3, profile), jobs=2)
    assert [p.name for p in res.properties if p.status != "proved"] == []


@pytest.mark.slow
def test_k_induction_proves_every_invariant_of_the_default_model():
    res = prove_by_induction(models.DEFAULT)
    assert [p.name for p in res.properties if p.status != "proved"] == []


@pytest.mark.slow
@pytest.mark.parametrize("model", [models.SINGLE_SEQ, models.ONE_BATCH, models.PRESSURE_K2],
                         ids=lambda m: m.name)
def test_k_induction_proves_every_invariant(model):
    res = prove_by_induction(model)
    assert [p.name for p in res.properties if p.status != "proved"] == []


@pytest.mark.slow
def test_k_induction_proves_every_invariant_for_eight_requests_and_eight_stages():
    # about 15 minutes on two cores (README); benchmarks/z3_proofs.py prints the same rows
    res = prove_by_induction(models.NARROW_8X8, jobs=2)
    assert [p.name for p in res.properties if p.status != "proved"] == []


@pytest.mark.slow
def test_without_strengthening_the_spec_invariants_are_not_inductive():
    res = prove_by_induction(models.SINGLE_SEQ, auxiliary=[])
    unknown = [p for p in res.properties if p.status == "unknown"]
    assert unknown and all(p.cti is not None for p in unknown)


# What Spacer proves on the full encoding with no invariant given (sliced
# rules, one per action). On single-seq under the default profile (duplicate
# cached blocks, reachable with one request: a resumed request recomputes
# and recaches its last full block) 45-76 s each on the 2-core machine under
# a load of 3 (2026-12-04; 4-7 s each before duplicate caching was encoded),
# a process start included. The default suite proves two of them; the slow
# test all four.
SPACER_PROVES = ["S11_pipeline_depth", "L3_drain", "S4_snapshot_immutability", "S13_fates_only_age"]


def test_spacer_proves_properties_with_no_invariant_given():
    proves = SPACER_PROVES[:2]
    res = spacer(models.SINGLE_SEQ, proves, time_budget=400)
    assert [(p.name, p.status) for p in res.properties] == [(n, "proved") for n in proves]


@pytest.mark.slow
def test_spacer_proves_all_four_properties_with_no_invariant_given():
    res = spacer(models.SINGLE_SEQ, SPACER_PROVES, time_budget=1200)
    assert [(p.name, p.status) for p in res.properties] == [(n, "proved") for n in SPACER_PROVES]


def test_spacer_finds_a_mutants_violation():
    # an arriving request keeps a stale counter: S1 breaks in one step
    res = spacer(models.SINGLE_SEQ.with_mutant("arrival_counter_stale"), ["S1_counter_bounds"], time_budget=120)
    assert res.properties[0].status == "violated"


def test_spacer_stops_at_its_budget():
    # S2 does not come within minutes on the full encoding: the query is stopped at its budget
    t0 = time.perf_counter()
    res = spacer(models.SINGLE_SEQ, ["S2_length_cap"], time_budget=5)
    assert res.properties[0].status == "unknown" and "budget" in res.properties[0].message
    assert time.perf_counter() - t0 < 30


def test_spacer_refuses_an_unknown_property():
    with pytest.raises(ValueError, match="S99"):
        spacer(models.SINGLE_SEQ, ["S99"])


def test_spacer_rules_keep_exactly_the_definitions_they_reach():
    a, b, c, d, x = z3.Ints("a b c d x")
    definitions = {v.get_id(): (v, t) for v, t in ((a, b + 1), (b, 2 * c), (d, x + 5))}
    kept = _with_definitions([a > x], definitions, lambda t: t)
    assert {str(k) for k in kept} == {"a > x", "a == b + 1", "b == 2*c"}


@pytest.mark.slow
def test_spacer_proves_properties_at_three_requests_and_three_stages():
    res = spacer(models.SHARED_K3, SPACER_PROVES, time_budget=600)
    assert [(p.name, p.status) for p in res.properties] == [(n, "proved") for n in SPACER_PROVES]


# Mutants whose shortest counterexample is at most 3 steps: BMC finds each in
# about a second (benchmarks/bmc_mutants.py), so the default suite checks that
# the Z3 encoding has every one of them, and at the breadth-first depth.
SHALLOW = {"advance_at_completion": 2, "arrival_counter_stale": 1, "overlapping_chunks": 3,
           "stale_drafts_on_prefill_chunk": 2, "schedule_blocked_when_idle": 1,
           "draft_cap_ignored": 3, "decode_while_token_in_flight": 3, "blocks_not_freed_on_abort": 3}


def test_shallow_depths_are_the_registrys_shortest_counterexamples():
    assert all(SHALLOW[name] == MUTANTS[name].shortest for name in SHALLOW)


@pytest.mark.parametrize("name", sorted(SHALLOW))
def test_bmc_kills_shallow_mutant_at_its_shortest_depth(name):
    model = models.mutant_model(name)
    p = first_counterexample(model, max_depth=SHALLOW[name], time_budget=120)
    assert p is not None and p.depth == SHALLOW[name]
    replay_checked(model, p.trace, p.states)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTANTS))
def test_bmc_kills_mutant(name):
    # every mutant within 60 s here (benchmarks/bmc_mutants.py); 300 s leaves room for a slower box
    model = models.mutant_model(name)
    p = first_counterexample(model, max_depth=12, time_budget=300)
    assert p is not None
    assert p.depth == MUTANTS[name].shortest        # shortest-first, like the breadth-first hunt
    replay_checked(model, p.trace, p.states)


@pytest.mark.parametrize("auxiliary", [None, ()], ids=["strengthened", "no-strengthening"])
def test_k_induction_in_two_processes_gives_the_rows_of_one(auxiliary):
    """The parallel Houdini rounds (tasks to whichever process is free, the
    transition properties among them) prove and drop exactly what the serial
    loop does, rows in the same order: with the strengthening invariants (one
    round) and without them (conjuncts dropped, several rounds)."""
    serial = prove_by_induction(models.SINGLE_SEQ, auxiliary=auxiliary, jobs=1)
    parallel = prove_by_induction(models.SINGLE_SEQ, auxiliary=auxiliary, jobs=2)
    assert [(p.name, p.status) for p in parallel.properties] == [(p.name, p.status) for p in serial.properties]
    assert {"S4_snapshot_immutability", "S12_status_monotonicity"} <= {p.name for p in parallel.properties}
    if auxiliary == ():
        assert any(p.status != "proved" for p in serial.properties)     # several rounds were needed

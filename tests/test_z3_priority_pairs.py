"""The Z3 encoding of the priority policy beside the KV connector
(verification/z3/encoding/priority.py `join_kv_holding`, priority_invariants.py
PR4) against the spec, and PR4's proof on `prio-kv-z3`
(verification/z3/priority_models.py PRIORITY_KV_Z3_MODEL):

* the transition relation is spec.step's on the model's states (every
  successor both ways, the Z3 action replaying on the spec): on the states
  with two parked loads and a sample here, on every reachable state in the
  slow test;
* PR4's formula agrees with the spec's predicate on reachable states and on
  perturbed ones (`kv_holding` reversed, the arrival order turned);
* k-induction proves PR1 and PR4 (on few candidates); BMC bounds them; BMC
  finds the synthetic tail-join mutant at the explicit search's depth, its
  trace replayed on the spec;
* with two batches in flight (`prio-kv-z3-k2`): every reachable state
  cross-checked, PR4 proved on the queues' conjuncts alone (each of them
  needed, and PR4 not kept under the tail-join mutant), BMC finding that
  mutant at the explicit search's depth;
* #57841's mutant (`prio-kv-hold-k2`): L2 with the connector's waits
  (`kv_l2_no_deadlock`) agrees with the spec's L2 on every reachable state
  with and without the mutant, the mutant's relation is its spec's, and BMC
  finds it at the explicit search's depth, its trace replayed on the spec;
* what the encoding leaves out beside the policy is refused (0.34's load
  limit; streaming sessions sharing a priority with another request, where SS5
  stays with the explicit search: test_z3_priority_sessions.py proves it where
  each session's priority is its own)."""

from __future__ import annotations

import functools
import importlib
import random
from dataclasses import replace

import pytest
import z3

from flightcheck.spec.priority_invariants import kv_holding_in_priority_order
from flightcheck.verification.priority_kv_models import PRIO_KV_K2
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.priority_invariants import (
    pa1_arrived_iff_placed,
    pa4_well_formed_but_every_block,
    pr4_kv_holding_in_priority_order,
)
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import kv_properties
from flightcheck.verification.z3.kv_engines import kv_induction
from flightcheck.verification.z3.priority_engines import (
    KV_STATE_PROPERTIES,
    PRIORITY_KV_BMC_DEPTH,
    PRIORITY_KV_QUEUE_AUXILIARY,
    priority_kv_auxiliary,
    priority_kv_bmc,
    priority_kv_induction,
    priority_kv_k2_rows,
    priority_kv_l2_bmc,
    priority_kv_queue_induction,
    priority_kv_rows,
)
from flightcheck.verification.z3.priority_models import PRIORITY_KV_Z3_K2_MODEL, PRIORITY_KV_Z3_MODEL

MODEL = PRIORITY_KV_Z3_MODEL
STATES = 117


@functools.lru_cache(maxsize=None)
def _states() -> tuple:
    return tuple(reachable(MODEL))


def _two_holders() -> list:
    return [s for s in _states() if len(s.kv_holding) > 1]


def test_the_model_is_small_and_parks_both_loads_in_rank_order():
    states = _states()
    assert len(states) == STATES
    both = _two_holders()
    assert both and all(s.kv_holding == (1, 0) for s in both)     # request 1 ranks first (priority 0)
    assert any(s.arrivals.index(0) < s.arrivals.index(1) for s in both)   # ... though it arrived second
    assert kv_properties(MODEL) == ["KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled", "KV4_no_leak",
                                    "PR1_waiting_in_priority_order", "PR4_kv_holding_in_priority_order"]


def _cross_check(states) -> CrossReport:
    checker, report = CrossChecker(MODEL), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


def test_the_relation_is_spec_step_on_states_with_two_parked_loads_and_a_sample():
    rng = random.Random(0)
    report = _cross_check(rng.sample(_two_holders(), 2) + rng.sample(_states(), 2))
    assert report.problems == []
    assert report.edges > report.states == 4


@pytest.mark.slow
def test_the_relation_is_spec_step_on_every_reachable_state():
    report = _cross_check(_states())
    assert report.problems == []
    assert report.states == STATES


def _holds(system: System, state, formula=pr4_kv_holding_in_priority_order) -> bool:
    return z3.is_true(z3.simplify(system.build(formula, system.constant(state))))


def test_pr4_agrees_with_the_spec_on_reachable_and_perturbed_states():
    system = System(MODEL)
    both = _two_holders()
    states = random.Random(2).sample(_states(), 30) + both[:4]
    perturbed = [replace(s, kv_holding=tuple(reversed(s.kv_holding))) for s in both[:6]]
    perturbed += [replace(s, arrivals=tuple(reversed(s.arrivals))) for s in both[:6]]
    assert any(not kv_holding_in_priority_order(s, MODEL.cfg) for s in perturbed)
    for s in states + perturbed:
        assert _holds(system, s) == kv_holding_in_priority_order(s, MODEL.cfg), s
    for s in states:            # the auxiliary invariants PR4's proof offers hold where PR4 does
        assert _holds(system, s, pa1_arrived_iff_placed) and _holds(system, s, pa4_well_formed_but_every_block)


def test_models_the_encoding_leaves_out_beside_the_policy_are_refused():
    with pytest.raises(ValueError, match="load limit"):          # prio-kv-k2: 0.34's async_kv_waiting
        System(PRIO_KV_K2)
    with pytest.raises(ValueError, match="asynchronous scheduling"):
        System(MODEL.under_profile("vllm-0.34-async"))
    from flightcheck.verification.session_models import SESSION_PROFILE_MODELS
    sessions = SESSION_PROFILE_MODELS["vllm-0.34"][0]
    prio_sessions = replace(sessions, cfg=replace(sessions.cfg, scheduling_policy="priority"))
    with pytest.raises(ValueError, match="priority policy"):   # shared priorities: SS5 is explicit-only
        System(prio_sessions)


@pytest.mark.slow
def test_k_induction_proves_pr1_and_pr4_with_every_conjunct_kept():
    res = priority_kv_induction(MODEL)
    assert {p.name: p.status for p in res.properties} == {
        name: "proved" for name in ("WF_encoding", "PR1_waiting_in_priority_order", "PR4_kv_holding_in_priority_order",
                                    *priority_kv_auxiliary())}
    assert res.depth == 1        # k


@pytest.mark.slow
def test_the_verify_rows_prove_and_bound_pr4_on_the_model():
    where = f" [prio-kv-z3@{MODEL.cfg.profile}]"
    assert {(r.name, r.status, r.method, r.depth) for r in priority_kv_rows()} == {
        ("PR4_kv_holding_in_priority_order", "proved", "k-induction (k=1)" + where, 1),
        ("PR4_kv_holding_in_priority_order", "bounded", "bmc" + where, PRIORITY_KV_BMC_DEPTH)}


@pytest.mark.slow
def test_bmc_bounds_pr1_and_pr4():
    res = priority_kv_bmc(MODEL, PRIORITY_KV_BMC_DEPTH)
    assert {p.name: (p.status, p.depth) for p in res.properties} == {
        name: ("bounded", PRIORITY_KV_BMC_DEPTH) for name in ("WF_encoding", "PR1_waiting_in_priority_order",
                                                            "PR4_kv_holding_in_priority_order")}


@pytest.mark.slow
def test_bmc_finds_the_parked_load_at_the_tail_and_the_spec_agrees():
    model = MODEL.with_mutant("parked_load_joins_tail_under_priority")
    res = priority_kv_bmc(model, 5)
    row = {p.name: p for p in res.properties}["PR4_kv_holding_in_priority_order"]
    # arrive, park, the empty batch completes (K = 1), arrive, park: the shortest on this model (a breadth-first
    # search's too; the explicit search's 4 is on prio-kv-k2, where K = 2 spares the completion)
    assert (row.status, row.depth) == ("violated", 5)
    assert len(row.trace) == 5 and len(row.states) == 6      # replayed on the spec by the engine
    assert not kv_holding_in_priority_order(row.states[-1], model.cfg)


@pytest.mark.slow
def test_the_relation_is_spec_step_where_the_step_fence_keeps_the_priority_victim(monkeypatch):
    # prio-kv-z3 never preempts (its pool suffices) and has no fence (K = 1); with K = 2, 2 blocks and shorter
    # prompts the policy preempts, and in 2 of 315 states the fence keeps its victim
    # (spec.schedule._victim_frees_at_once: the running loop stops)
    from flightcheck.spec import Prompt
    spec_schedule = importlib.import_module("flightcheck.spec.schedule")     # the package exports the function
    model = replace(MODEL, name="prio-kv-fence", cfg=replace(MODEL.cfg, num_stages=2, num_blocks=2),
                    prompts=(Prompt(1, 3, priority=1), Prompt(1, 3, external_hit=1, load_async=True, priority=0)))
    states = list(reachable(model))
    kept = []
    frees_at_once = spec_schedule._victim_frees_at_once
    monkeypatch.setattr(spec_schedule, "_victim_frees_at_once",
                        lambda step, victim: frees_at_once(step, victim) or kept.append(victim) or False)
    fenced, preempting = [], []
    for s in states:
        before, sch = len(kept), spec_schedule.schedule(s, model.cfg)
        (fenced if len(kept) > before else preempting if sch is not None and sch.preempted else []).append(s)
    monkeypatch.undo()
    assert (len(states), len(fenced)) == (315, 2) and preempting
    checker, report = CrossChecker(model), CrossReport()
    for s in fenced + preempting[:4]:
        checker.check(s, report)
    assert report.problems == [] and report.states == 6


# --- two batches in flight: prio-kv-z3-k2 (K = 2, the step fence in force) ------------

K2 = PRIORITY_KV_Z3_K2_MODEL
K2_STATES = 241
QUEUE_PROOF = ("PR1_waiting_in_priority_order", "PR4_kv_holding_in_priority_order", *PRIORITY_KV_QUEUE_AUXILIARY)


@functools.lru_cache(maxsize=None)
def _k2_states() -> tuple:
    return tuple(reachable(K2))


def test_the_k2_model_parks_both_loads_and_every_queue_conjunct_holds_on_its_states():
    from flightcheck.verification.z3.encoding.feature_formulas import AUXILIARY, FORMULAS
    states = _k2_states()
    assert (K2.cfg.num_stages, K2.cfg.fences_freed_blocks, len(states)) == (2, True, K2_STATES)
    both = [s for s in states if len(s.kv_holding) > 1]
    assert both and all(s.kv_holding == (1, 0) for s in both)
    assert any(len(s.in_flight) == 2 for s in both)               # two batches in flight while both are parked
    system = System(K2)
    for s in random.Random(3).sample(states, 24) + both[:4]:
        for name in QUEUE_PROOF:
            assert _holds(system, s, {**FORMULAS, **AUXILIARY}[name]), (name, s)


@pytest.mark.slow
def test_the_relation_is_spec_step_on_every_reachable_state_at_k2():
    checker, report = CrossChecker(K2), CrossReport()
    for s in _k2_states():
        checker.check(s, report)
    assert report.problems == []
    assert report.states == K2_STATES


@pytest.mark.slow
def test_k_induction_proves_pr4_at_k2_on_the_queues_conjuncts_alone():
    res = priority_kv_queue_induction(K2)
    assert {p.name: p.status for p in res.properties} == {name: "proved" for name in QUEUE_PROOF}
    assert res.depth == 1        # k; WF_encoding is not offered (it reads the pool)


@pytest.mark.slow
@pytest.mark.parametrize("left_out", PRIORITY_KV_QUEUE_AUXILIARY)
def test_each_queue_conjunct_is_needed_for_pr4_at_k2(left_out):
    offered = [n for n in PRIORITY_KV_QUEUE_AUXILIARY if n != left_out]
    res = kv_induction(K2, 1, KV_STATE_PROPERTIES, offered, with_wf=False)
    assert {p.name: p.status for p in res.properties}["PR4_kv_holding_in_priority_order"] == "unknown"


@pytest.mark.slow
def test_the_queue_proof_does_not_keep_pr4_under_the_tail_join_mutant():
    res = priority_kv_queue_induction(K2.with_mutant("parked_load_joins_tail_under_priority"))
    rows = {p.name: p for p in res.properties}
    assert rows["PR4_kv_holding_in_priority_order"].status == "unknown"
    assert "not inductive under action 1" in rows["PR4_kv_holding_in_priority_order"].message     # schedule
    assert all(rows[n].status == "proved" for n in QUEUE_PROOF if n != "PR4_kv_holding_in_priority_order")


@pytest.mark.slow
def test_the_k2_verify_row_proves_pr4():
    assert {(r.name, r.status, r.method, r.depth) for r in priority_kv_k2_rows()} == {
        ("PR4_kv_holding_in_priority_order", "proved", f"k-induction (k=1) [prio-kv-z3-k2@{K2.cfg.profile}]", 1)}


@pytest.mark.slow
def test_bmc_at_k2_finds_the_parked_load_at_the_tail_at_the_explicit_searchs_depth():
    model = K2.with_mutant("parked_load_joins_tail_under_priority")
    res = priority_kv_bmc(model, 4)
    row = {p.name: p for p in res.properties}["PR4_kv_holding_in_priority_order"]
    assert (row.status, row.depth) == ("violated", 4)      # arrive, park, arrive, park: K = 2 spares the completion
    assert not kv_holding_in_priority_order(row.states[-1], model.cfg)


# --- #57841's mutant: L2 with the connector's waits, on prio-kv-hold-k2 ---------------

PR57841 = "load_ranked_behind_new_request_pr57841"


def _hold_model(mutant: bool):
    from flightcheck.verification.priority_kv_models import PRIO_KV_HOLD_K2, priority_kv_mutant_model
    return priority_kv_mutant_model(PR57841) if mutant else PRIO_KV_HOLD_K2


@functools.lru_cache(maxsize=None)
def _hold_states(mutant: bool) -> tuple:
    from flightcheck.verification.mutants import applied
    model = _hold_model(mutant)
    with applied(model.mutant):
        return tuple(reachable(model))


def _l2_agrees(model, states) -> list:
    """The states where kv_l2_no_deadlock (on the state's own schedule) and the spec's L2 differ."""
    from flightcheck.spec.deadlock import l2_no_deadlock
    from flightcheck.verification.mutants import applied
    from flightcheck.verification.z3.encoding.kv_invariants import kv_l2_no_deadlock
    system, out = System(model), []
    for i, s in enumerate(states):
        with applied(model.mutant):
            spec = l2_no_deadlock(s, model.cfg)
        frame = system.constant(s)
        sch, definitions = system.schedule_of(frame, f"l2@{i}")
        solver = z3.Solver()
        solver.add(definitions)
        ours = solver.check(z3.Not(system.build(kv_l2_no_deadlock, frame, sch))) == z3.unsat
        if ours != spec:
            out.append((s, spec, ours))
    return out


def _l2_broken(mutant: bool) -> list:
    from flightcheck.spec.deadlock import l2_no_deadlock
    from flightcheck.verification.mutants import applied
    model = _hold_model(mutant)
    with applied(model.mutant):
        return [s for s in _hold_states(mutant) if not l2_no_deadlock(s, model.cfg)]


def test_l2_with_the_connectors_waits_breaks_where_57841s_mutant_deadlocks():
    broken = _l2_broken(True)
    assert len(broken) == 3 and not _l2_broken(False)
    model = _hold_model(True)
    assert _l2_agrees(model, broken[:2] + [_hold_states(True)[0]]) == []      # false on two, true on the first


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [False, True])
def test_l2_with_the_connectors_waits_is_the_specs_on_every_state_of_the_hold_model(mutant):
    states = _hold_states(mutant)
    assert len(states) == 64
    assert _l2_agrees(_hold_model(mutant), states) == []


@pytest.mark.slow
def test_the_relation_is_57841s_mutant_spec_step_on_every_state_of_the_hold_model():
    model = _hold_model(True)
    checker, report = CrossChecker(model), CrossReport()
    for s in _hold_states(True):
        checker.check(s, report)
    assert report.problems == [] and report.states == 64


@pytest.mark.slow
def test_bmc_finds_57841s_deadlock_at_the_explicit_searchs_depth_and_bounds_the_correct_spec():
    row = {p.name: p for p in priority_kv_l2_bmc(_hold_model(True), 4).properties}["L2_no_deadlock"]
    assert (row.status, row.depth) == ("violated", 4)      # arrive, park; the other arrives, the load lands (either order)
    assert sorted(type(a).__name__ for a in row.trace) == ["Arrive", "Arrive", "ReceiveKv", "Schedule"]
    assert len(row.states) == 5 and row.states[-1] in _l2_broken(True)       # replayed on the spec: its L2 breaks
    res = priority_kv_l2_bmc(_hold_model(False), 4)
    assert {p.name: (p.status, p.depth) for p in res.properties} == {
        "WF_encoding": ("bounded", 4), "L2_no_deadlock": ("bounded", 4)}

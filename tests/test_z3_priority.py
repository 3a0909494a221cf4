"""The Z3 encoding of the priority policy (verification/z3/encoding/priority.py,
priority_state.py, priority_invariants.py) against the spec, and the proofs
of PR1-PR3 on the priority model (verification/z3/priority_models.py):

* the transition relation is spec.step's on the model's states (every
  successor both ways, the Z3 action replaying on the spec): on the states
  whose schedule preempts and a sample of the rest here, on every
  reachable state in the slow test;
* PR1 and PA1 agree with the spec's predicate and hold on reachable
  states; PR1 fails where the spec's does (perturbed states);
* PR2 and PR3 agree with the spec on schedule steps, under the spec and
  under the mutants that break them;
* k-induction proves PR1 (with PA1 and the candidates it keeps), and PR2
  and PR3 follow in one step; BMC bounds all three; BMC finds #23347's
  mutant at the explicit search's depth, its trace replayed on the spec;
* a model the encoding of the policy leaves out is refused, and an FCFS
  frame has no priority part."""

from __future__ import annotations

import functools
import json
import random
from dataclasses import replace

import pytest
import z3

from flightcheck.spec import Config, Prompt, schedule, transition_properties_for
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.priority_models import priority_mutant_model
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.priority_invariants import (
    PRIORITY_AUXILIARY,
    PRIORITY_STEP_FORMULAS,
    pa1_arrived_iff_placed,
    pr1_waiting_in_priority_order,
)
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.priority_engines import priority_bmc, priority_induction, step_consequences
from flightcheck.verification.z3.priority_models import PRIORITY_Z3_MODEL
from flightcheck.spec.priority_invariants import waiting_in_priority_order

MODEL = PRIORITY_Z3_MODEL


@functools.lru_cache(maxsize=None)
def _states(model: Model = MODEL) -> tuple:
    return tuple(reachable(model))


def _preempting(model: Model = MODEL) -> list:
    """The reachable states whose schedule preempts (and may hand a victim back)."""
    with applied(model.mutant):
        return [s for s in _states(model) if (sch := schedule(s, model.cfg)) is not None and sch.preempted]


def test_the_model_is_small_and_its_schedule_hands_victims_back():
    states = _states()
    assert len(states) == 3183         # 3162 until the spec kept is_prefill_chunk (spec/drafts.py)
    handed_back = 0
    with applied("victim_kept_in_batch_pr23347"):       # the victim's entry stays: it had been scheduled
        for s in _preempting():
            sch = schedule(s, MODEL.cfg)
            handed_back += any(e.req in sch.preempted for e in sch.entries)
    assert handed_back > 0


def test_the_relation_is_spec_step_on_preempting_and_sampled_states():
    preempting = _preempting()
    sample = random.Random(0).sample(_states(), 4)
    checker, report = CrossChecker(MODEL), CrossReport()
    for s in random.Random(1).sample(preempting, min(6, len(preempting))) + sample:
        checker.check(s, report)
    assert report.problems == []
    assert report.edges > report.states


@pytest.mark.slow
def test_the_relation_is_spec_step_on_every_reachable_priority_state():
    checker, report = CrossChecker(MODEL), CrossReport()
    for s in _states():
        checker.check(s, report)
    assert report.problems == []
    assert report.states == 3183


def _holds(system: System, fn, state) -> bool:
    return z3.is_true(z3.simplify(system.build(fn, system.constant(state))))


def test_pr1_and_pa1_agree_with_the_spec_on_reachable_and_perturbed_states():
    system = System(MODEL)
    states = random.Random(2).sample(_states(), 60)
    perturbed = [replace(s, waiting=tuple(reversed(s.waiting))) for s in _states() if len(s.waiting) > 1]
    perturbed += [replace(s, arrivals=s.arrivals[1:] + s.arrivals[:1]) for s in states if len(s.waiting) > 1]
    assert perturbed and any(not waiting_in_priority_order(s, MODEL.cfg) for s in perturbed)
    for s in states + perturbed:
        assert _holds(system, pr1_waiting_in_priority_order, s) == waiting_in_priority_order(s, MODEL.cfg)
    for s in states:
        assert _holds(system, well_formed, s) and _holds(system, pa1_arrived_iff_placed, s)


@functools.lru_cache(maxsize=None)
def _scheduling(model: Model) -> tuple:
    """(system, its step 0 -> 1, a solver holding the step as a schedule, the step formulas)."""
    system = System(model)
    step = system.step(0, 1)
    solver = z3.Solver()
    solver.add(*step.constraints, step.choices.act == SCHEDULE)
    return system, step, solver, {n: system.build(f, step) for n, f in PRIORITY_STEP_FORMULAS.items()}


def _step_formulas_on(model: Model, s) -> dict[str, bool]:
    """PR2 and PR3's formulas on the Z3 schedule step from s."""
    system, step, solver, formulas = _scheduling(model)
    solver.push()
    solver.add(*system.encode(s, 0))
    assert solver.check() == z3.sat
    m = solver.model()
    solver.pop()
    return {n: z3.is_true(m.eval(f, model_completion=True)) for n, f in formulas.items()}


def _spec_step_properties(model: Model, s) -> dict[str, bool]:
    from flightcheck.spec import Schedule, step
    with applied(model.mutant):
        after = step(s, model.cfg, Schedule())
        return {p.name: p.holds(s, after, Schedule(), model.cfg) for p in transition_properties_for(model.cfg)
                if p.name in PRIORITY_STEP_FORMULAS}


@pytest.mark.parametrize("mutant", [None, "victim_kept_in_batch_pr23347"])
def test_pr2_and_pr3_agree_with_the_spec_on_preempting_steps(mutant):
    model = MODEL if mutant is None else priority_mutant_model(mutant)
    broken = 0
    for s in random.Random(3).sample(_preempting(), 4):      # the mutant changes what a preemption leaves only
        want = _spec_step_properties(model, s)
        assert _step_formulas_on(model, s) == want
        broken += not all(want.values())
    assert (broken > 0) == (mutant is not None)


@pytest.mark.slow
def test_k_induction_proves_pr1_and_pr2_pr3_follow_in_one_step():
    res = priority_induction(MODEL)
    assert {p.name: p.status for p in res.properties} == {
        # WF_encoding's pool clauses need the pool's invariants (S9, A9), which this proof does not carry;
        # PA2 keeps every other clause of it
        "WF_encoding": "unknown",
        "PR1_waiting_in_priority_order": "proved", "PA1_arrived_iff_placed": "proved",
        "PA2_well_formed_but_the_blocks": "proved", "PA3_queues_match_statuses": "proved",
        "PR2_victim_leaves_no_trace": "proved", "PR3_running_loop_skips_nothing": "proved"}


KEPT = ["PR1_waiting_in_priority_order", *PRIORITY_AUXILIARY]


@pytest.mark.slow
def test_the_one_step_check_is_not_vacuous_pr2_fails_under_23347s_edit():
    # the invariant admits a schedule step of the mutant's that keeps the victim's entry (a reachable one:
    # BMC finds it at depth 7)
    model = MODEL.with_mutant("victim_kept_in_batch_pr23347")
    rows = {v.name: v.status for v in step_consequences(model, KEPT, ["PR2_victim_leaves_no_trace"])}
    assert rows == {"PR2_victim_leaves_no_trace": "unknown"}


def test_bmc_bounds_pr1_pr2_pr3():
    res = priority_bmc(MODEL, 2)
    assert {p.name: (p.status, p.depth) for p in res.properties} == {
        name: ("bounded", 2) for name in ("WF_encoding", "PR1_waiting_in_priority_order",
                                          "PR2_victim_leaves_no_trace", "PR3_running_loop_skips_nothing")}


@pytest.mark.slow
def test_bmc_finds_the_victim_kept_in_the_batch_and_the_spec_agrees():
    model = priority_mutant_model("victim_kept_in_batch_pr23347")
    res = priority_bmc(model, 7)
    row = {p.name: p for p in res.properties}["PR2_victim_leaves_no_trace"]
    assert (row.status, row.depth) == ("violated", 7)       # the explicit search's shortest
    assert len(row.trace) == 7 and len(row.states) == 8      # replayed on the spec by the engine


def test_models_the_encoding_leaves_out_are_refused_and_fcfs_frames_have_no_priority_part():
    async_model = MODEL.under_profile("vllm-0.34-async")
    with pytest.raises(ValueError, match="asynchronous scheduling"):
        System(async_model)
    fcfs = Model("fcfs", Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
                                max_model_len=6, prefix_caching=False, profile="vllm-0.34"),
                 (Prompt(2, 3, priority=1), Prompt(1, 3)))
    assert System(fcfs).frame(0).prio == [] and System(MODEL).frame(0).prio != []
    arrived = _states()[1]
    with pytest.raises(NotRepresentable):
        System(MODEL).constant(replace(arrived, requests=tuple(replace(q, priority=7) for q in arrived.requests)))


@pytest.mark.parametrize("args, fragment", [
    (["--profile", "vllm-0.8.5"], "--priority needs a profile with the priority policy"),
    (["--profile", "vllm-0.34", "--reset-pause"], "cannot go with"),
    (["--profile", "vllm-0.34", "--kv-connector"], "cannot go with"),
])
def test_verify_priority_refuses_other_profiles_and_other_features(args, fragment, capsys):
    from flightcheck.cli import main
    assert main(["verify", "--priority", *args]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.slow
def test_verify_priority_under_0_34_gives_the_z3_rows_and_kills_the_mutants(capsys):
    from flightcheck.cli import main
    # exit 1: KV8's model (prio-unwritten-k3) is violated under 0.34's rules, vLLM's bug
    # (tests/test_kv_unwritten_search.py); every other row holds
    assert main(["verify", "--profile", "vllm-0.34", "--priority", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["priority"] and "explicit_only" not in report
    assert {(p["name"], p["method"].split(" (")[0]) for p in report["properties"] if p["status"] == "violated"} == {
        ("KV8_no_hit_on_unwritten_kv", "exhaustive prio-unwritten-k3")}
    z3_rows = {(p["name"], p["status"], p["method"], p["depth"]) for p in report["properties"]
               if "prio-victim-k2@vllm-0.34" in p["method"]}
    where = " [prio-victim-k2@vllm-0.34]"
    assert z3_rows == {
        ("PR1_waiting_in_priority_order", "proved", "k-induction (k=1)" + where, 1),
        ("PR2_victim_leaves_no_trace", "proved", "one step from the k-induction invariant" + where, 1),
        ("PR3_running_loop_skips_nothing", "proved", "one step from the k-induction invariant" + where, 1),
        *((name, "bounded", "bmc" + where, 4) for name in ("PR1_waiting_in_priority_order",
                                                          "PR2_victim_leaves_no_trace",
                                                          "PR3_running_loop_skips_nothing"))}
    assert {m["name"]: m["killed"] for m in report["mutants"]} == {
        "victim_kept_in_batch_pr23347": True, "preempted_drafts_kept_pr28558": True,
        "victim_index_not_adjusted_pr49097": True}


@pytest.mark.slow
def test_pr3s_formula_breaks_where_49097s_mutant_breaks_it_on_the_three_request_model():
    # prio-skip-k2: a victim visited and skipped before the loop's index (the explicit search's #49097 model)
    from flightcheck.spec import Schedule, step
    model = priority_mutant_model("victim_index_not_adjusted_pr49097")
    with applied(model.mutant):
        broken = [s for s in reachable(model) if (after := step(s, model.cfg, Schedule())) is not None
                  and not _spec_step_properties(model, s)["PR3_running_loop_skips_nothing"]]
        assert after is not None or broken
    assert len(broken) == 4
    assert _step_formulas_on(model, broken[0]) == {"PR2_victim_leaves_no_trace": True,
                                                   "PR3_running_loop_skips_nothing": False}
    checker, report = CrossChecker(model), CrossReport()
    checker.check(broken[0], report)                 # the mutant's relation is its spec's there too
    assert report.problems == [] and report.edges > 1

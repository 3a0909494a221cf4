"""Reset and pause in the Z3 encoding (verification/z3/encoding/reset_pause.py,
reset_pause_state.py, reset_pause_invariants.py) against the spec, and the
proofs of RP1-RP4 on reset-pause-z3-k2 (verification/z3/reset_pause_models.py):

* the transition relation is spec.step's on the model's states (every
  successor both ways, the Z3 action replaying on the spec): on a sample
  here, on every reachable state in the slow test;
* the auxiliary invariants' formulas agree with their concrete predicates,
  and RP1-RP4's formulas with the spec's transition properties, on the
  model's states and steps and on perturbed ones where they break;
* k-induction keeps every conjunct offered and RP1-RP4 follow in one step
  (slow), BMC bounds RP1-RP4, and reset and pause's mutants are found by
  BMC with their traces replayed on the spec."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import z3

from flightcheck.spec import CompleteOldest, Config, Pause, Prompt, Reset, Schedule, SetPause, State
from flightcheck.spec import transition_properties_for
from flightcheck.spec.state import Fate, Status
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding import reset_pause as encoded_reset
from flightcheck.verification.z3.encoding.actions import COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.reset_pause import rp_code
from flightcheck.verification.z3.encoding.reset_pause_invariants import (
    RP_AUXILIARY,
    RP_AUXILIARY_PREDICATES,
    RP_TRANSITION_FORMULAS,
)
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import leaves
from flightcheck.verification.z3.reset_pause_engines import (
    RP_ENCODED_PROFILE,
    RP_PROPERTIES,
    rp_bmc,
    rp_induction,
    rp_model,
)
from flightcheck.verification.z3.reset_pause_models import RP_Z3, RP_Z3_ASYNC
from flightcheck.verification.z3.results import ReplayMismatch

from .z3_formula_evaluator import FormulaEvaluator

MODEL = RP_Z3


@functools.lru_cache(maxsize=None)
def _reachable() -> tuple[State, ...]:
    return tuple(reachable(MODEL))


def _interesting(s: State) -> bool:
    """A state where reset and pause's part of the encoding matters."""
    return s.pause is not Pause.UNPAUSED or any(e.reset for b in s.in_flight for e in b)


def _sample(count: int, seed: int = 0) -> list[State]:
    """`count` reachable states, half of them paused or with a reset entry in flight."""
    states, rng = _reachable(), random.Random(seed)
    marked = [s for s in states if _interesting(s)]
    return rng.sample(marked, count // 2) + rng.sample(states, count - count // 2)


def test_the_model_is_small_and_exercises_every_part_of_the_feature():
    states = _reachable()
    seen = {
        "paused new": any(s.pause is Pause.PAUSED_NEW and s.running for s in states),
        "paused all with a batch in flight": any(s.pause is Pause.PAUSED_ALL and s.in_flight for s in states),
        "a reset entry in flight": any(e.reset for s in states for b in s.in_flight for e in b),
        "a reset request running again beside its old output": any(
            s.requests[e.req].status is Status.RUNNING for s in states for b in s.in_flight for e in b if e.reset),
        "a deliver-mode preemption": any(q.num_stale and not q.drop_stale for s in states for q in s.requests),
        "a reset beside a deliver-mode share": any(
            q.num_stale and any(e.reset for b in s.in_flight for e in b if e.req == r)
            for s in states for r, q in enumerate(s.requests)),
        "a label cached": any(lab is not None for s in states for lab in s.pool.labels),
        "an empty batch": any(() in s.in_flight for s in states),
    }
    assert all(seen.values()), [name for name, hit in seen.items() if not hit]
    assert len(states) == 2124


def test_a_model_without_reset_and_pause_has_no_such_frame_and_a_combination_left_out_is_refused():
    plain = dataclasses.replace(MODEL, name="plain", cfg=dataclasses.replace(MODEL.cfg, reset_and_pause=False))
    assert System(plain).frame(0).rp == []
    assert not any(name.startswith("rp") for name, _ in leaves(System(plain).frame(0)))
    prio = Model("prio", dataclasses.replace(MODEL.cfg, scheduling_policy="priority"), MODEL.prompts)
    with pytest.raises(ValueError, match="reset and pause leaves out the priority policy"):
        System(prio)


def _cross_check(states) -> CrossReport:
    checker, report = CrossChecker(MODEL), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


def test_the_relation_is_spec_step_on_sampled_reset_pause_states():
    report = _cross_check(_sample(12))
    assert report.problems == []
    assert report.edges > report.states


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_the_relation_is_spec_step_on_every_reachable_reset_pause_state(profile):
    model = rp_model(profile)
    checker, report = CrossChecker(model), CrossReport()
    for s in reachable(model):
        checker.check(s, report)
    assert report.problems == []
    assert (report.states, report.edges) == (2124, 10149)


# --- the formulas against the concrete predicates


@functools.lru_cache(maxsize=None)
def _evaluator() -> FormulaEvaluator:
    return FormulaEvaluator(MODEL, RP_AUXILIARY, RP_TRANSITION_FORMULAS)


def _perturbed_state(s: State, rng: random.Random) -> State:
    """A change RPA1 or RPA2 may reject: an entry's reset mark, fate or size, or a request's drop mode."""
    entries = [(k, j) for k, b in enumerate(s.in_flight) for j in range(len(b))]
    if entries and rng.random() < 0.7:
        k, j = rng.choice(entries)
        e = s.in_flight[k][j]
        e = rng.choice([dataclasses.replace(e, reset=not e.reset), dataclasses.replace(e, fate=Fate.LIVE),
                        dataclasses.replace(e, n=e.n + MODEL.cfg.max_model_len)])
        batch = s.in_flight[k][:j] + (e,) + s.in_flight[k][j + 1:]
        return dataclasses.replace(s, in_flight=s.in_flight[:k] + (batch,) + s.in_flight[k + 1:])
    r = rng.randrange(len(s.requests))
    return s.with_request(r, drop_stale=not s.requests[r].drop_stale)


def test_each_auxiliary_formula_agrees_with_its_predicate():
    ev, rng = _evaluator(), random.Random(1)
    states = _sample(24)
    broken = {name: 0 for name in RP_AUXILIARY}
    for s in states + [_perturbed_state(s, rng) for s in states for _ in range(2)]:
        for name, holds in RP_AUXILIARY_PREDICATES.items():
            expected = holds(s, MODEL.cfg)
            assert ev.state(s, name) == expected, (name, s)
            broken[name] += not expected
    assert all(broken.values()), broken         # the perturbations break each one somewhere


def _code(action) -> int:
    if isinstance(action, (Reset, SetPause)):
        return rp_code(action)
    return {Schedule: SCHEDULE, CompleteOldest: COMPLETE}.get(type(action), 0)


def _perturbed_successor(s: State, t: State, action, rng: random.Random) -> State:
    """A successor RP1-RP4 may reject: a reset request's output changed, a
    request left running, a drop mode off, a label kept, an entry admitted."""
    reqs = [r for r, q in enumerate(t.requests) if q.status is not Status.NEW]
    choice = rng.randrange(4)
    if choice == 0 and reqs:
        r = rng.choice(reqs)
        return t.with_request(r, num_output=t.requests[r].num_output + 1, drop_stale=False)
    if choice == 1 and t.waiting and not t.running:
        r = t.waiting[0]
        return dataclasses.replace(t.with_request(r, status=Status.RUNNING), running=(r,), waiting=t.waiting[1:])
    if choice == 2:
        labels = tuple(7 if b == 0 else lab for b, lab in enumerate(t.pool.labels))
        return dataclasses.replace(t, pool=dataclasses.replace(t.pool, labels=labels))
    return t.with_request(rng.randrange(len(t.requests)), num_stale=1)


def test_each_rp_formula_agrees_with_the_spec_on_steps_and_perturbed_steps():
    ev, rng = _evaluator(), random.Random(2)
    spec = {p.name: p for p in transition_properties_for(MODEL.cfg) if p.name in RP_PROPERTIES}
    broken = {name: 0 for name in RP_PROPERTIES}
    checked = 0
    for s in _sample(12, seed=3):
        for action, t in explicit.successors(MODEL, s):
            for nxt in (t, _perturbed_successor(s, t, action, rng)):
                try:
                    ev.system.constant(nxt)
                except NotRepresentable:
                    continue
                for name in RP_PROPERTIES:
                    expected = spec[name].holds(s, nxt, action, MODEL.cfg)
                    assert ev.edge(s, _code(action), nxt, name) == expected, (name, s, action, nxt)
                    broken[name] += not expected
                    checked += 1
    assert checked > 100
    # RP1's schedule entries come from the frame: a perturbed successor cannot break it
    assert all(broken[name] for name in RP_PROPERTIES if name != "RP1_paused_schedules_nothing"), broken


# --- the engines


@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_k_induction_keeps_every_conjunct_and_rp1_to_rp4_follow_in_one_step(profile):
    result = rp_induction(rp_model(profile))
    rows = result.by_name()
    assert {name: rows[name].status for name in RP_PROPERTIES} == {name: "proved" for name in RP_PROPERTIES}
    assert rows["WF_encoding"].status == "proved"
    assert all(rows[name].status == "proved" for name in RP_AUXILIARY)
    assert [p.name for p in result.properties if p.status != "proved"] == []


@pytest.mark.slow               # 9 s at load 12 (under slow_tests.txt's 10 s line, over the default's share)
def test_bmc_bounds_rp1_to_rp4():
    result = rp_bmc(MODEL, 4)
    assert [(p.name, p.status, p.depth) for p in result.properties] == \
        [(name, "bounded", 4) for name in RP_PROPERTIES]


def test_a_paused_engine_admitting_a_request_is_found_by_bmc_and_replayed_on_the_spec():
    """paused_new_admits_waiting (verification/mutants/reset_pause.py) in the
    encoding too: BMC breaks RP1 at the explicit search's length, 3 (an
    arrival and PAUSED_NEW in either order, then a schedule that admits),
    and the trace replays on the mutated spec state for state."""
    result = rp_bmc(MODEL.with_mutant("paused_new_admits_waiting"), 3, ["RP1_paused_schedules_nothing"])
    (row,) = result.properties
    assert (row.status, row.depth) == ("violated", 3)
    assert SetPause(Pause.PAUSED_NEW) in row.trace and row.trace[-1] == Schedule()
    assert len(row.states[-1].running) == 1 and row.states[-1].pause is Pause.PAUSED_NEW


# Each reset-and-pause mutant the encoding has, with the property BMC breaks
# first and its depth (the explicit search's kill length on reset-pause-k2-async
# where it is the same property: verification/mutants/reset_pause.py).
BMC_KILLS = {
    "paused_new_admits_waiting": ("RP1_paused_schedules_nothing", 3),
    "paused_all_runs_running_loop": ("RP1_paused_schedules_nothing", 5),
    "reset_delivers_stale_output": ("RP2_reset_drops_in_flight", 3),
    "pause_clear_cache_keeps_running_pr34382": ("RP2_reset_drops_in_flight", 3),
    "reset_discards_drained_output_pr42117": ("RP2_reset_drops_in_flight", 4),
}


@pytest.mark.slow               # 7-36 s each at load 12
@pytest.mark.parametrize("name", BMC_KILLS)
def test_each_encoded_mutant_is_found_by_bmc_at_its_depth(name):
    prop, depth = BMC_KILLS[name]
    result = rp_bmc(MODEL.with_mutant(name), depth)
    rows = result.by_name()
    assert (rows[prop].status, rows[prop].depth) == ("violated", depth)
    assert rp_bmc(MODEL.with_mutant(name), depth - 1, [prop]).by_name()[prop].status == "bounded"


def test_the_encoding_is_spec_step_under_async_scheduling_on_sampled_states():
    """The model under vllm-0.34-async (placeholders, the decode stagger, a
    queue of K + 1) with reset and pause: the relation is spec.step's on 16
    sampled states, half of them with placeholders beside a pause or a reset mark."""
    states, rng = list(reachable(RP_Z3_ASYNC)), random.Random(0)
    marked = [s for s in states if any(q.placeholders for q in s.requests) and _interesting(s)]
    checker, report = CrossChecker(RP_Z3_ASYNC), CrossReport()
    for s in rng.sample(marked, 8) + rng.sample(states, 8):
        checker.check(s, report)
    assert report.problems == [] and len(states) == 5799


def test_k_induction_proves_rp1_to_rp4_under_async_scheduling_too():
    """On reset-pause-z3-k2-async (vllm-0.34-async) the same conjuncts, with
    the async formulas in place of S3, S5, S6 and IA1, IA2 beside them, are
    all kept, and RP1-RP4 follow in one step."""
    result = rp_induction(RP_Z3_ASYNC)
    assert [(p.name, p.status) for p in result.properties if p.status != "proved"] == []
    assert {"RPA1_reset_entries_dropped", "candidate:IA1_placeholders"} <= set(result.by_name())


def test_vllm_38624_is_found_by_bmc_at_its_explicit_length():
    """placeholders_kept_on_preemption_pr38624 (vLLM #38624: the running
    loop's preemption keeps the victim's placeholders) on the async model:
    BMC breaks IA1 in 8 steps, the explicit search's kill length, and the
    trace replays on the mutated spec, whose IA1 fails at its end."""
    result = rp_bmc(RP_Z3_ASYNC.with_mutant("placeholders_kept_on_preemption_pr38624"), 8, ["IA1_placeholders"])
    (row,) = result.properties
    assert (row.status, row.depth, len(row.trace)) == ("violated", 8, 8)


def test_an_encoding_that_keeps_deliver_mode_at_a_reset_is_refused_by_the_replay(monkeypatch):
    """The encoding alone mutated (the spec left as it is) to reset in deliver
    mode: BMC finds RP2 broken three steps in, and the replay on the spec
    refuses its trace, whose last state the spec does not reach."""
    real = encoded_reset._preempt_dropping_output

    def delivers(layout, st):
        out = real(layout, st)
        out.counters = [dataclasses.replace(c, drop=z3.BoolVal(False)) for c in out.counters]
        return out

    monkeypatch.setattr(encoded_reset, "_preempt_dropping_output", delivers)
    with pytest.raises(ReplayMismatch, match="step 3 \\(reset prefix cache and running requests\\)"):
        rp_bmc(MODEL, 3, ["RP2_reset_drops_in_flight"])


def test_an_unrepresentable_pause_is_refused_in_a_model_without_the_feature():
    cfg = Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=2,
                 max_model_len=4, profile="vllm-0.34")
    plain = Model("plain", cfg, (Prompt(1, 2),))
    paused = dataclasses.replace(explicit.initial(plain), pause=Pause.PAUSED_ALL)
    with pytest.raises(NotRepresentable):
        System(plain).constant(paused)


def test_verify_rows_come_from_the_model_under_each_profiles_sync_rules_as_invariants():
    from flightcheck.verification.reset_pause_models import RESET_PAUSE_MODELS
    from flightcheck.verification.results import kind_of
    assert set(RP_ENCODED_PROFILE) == set(RESET_PAUSE_MODELS)
    assert {p: rp_model(p).cfg.profile for p in RP_ENCODED_PROFILE} == \
        {"vllm-0.33": "vllm-0.33", "vllm-0.33-async": "vllm-0.33", "vllm-0.34": "vllm-0.34",
         "vllm-0.34-async": "vllm-0.34"}
    assert {kind_of(name) for name in RP_PROPERTIES} == {"invariant"}
    assert {kind_of(name) for name in RP_AUXILIARY} == {"auxiliary"}

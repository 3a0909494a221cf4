"""The prefill cadence in the Z3 encoding (verification/z3/encoding/cadence.py,
cadence_state.py, cadence_invariants.py) against the spec, and the proofs of
CAD1-CAD3: BMC on cadence-k2 (verification/cadence_models.py, 1,334
states), k-induction on cadence-z3-k2 (z3/cadence_models.py, 87 states):

* the transition relation is spec.step's on the model's states (every
  successor both ways, the Z3 action replaying on the spec): on a sample
  here, on every reachable state, sync and async, in the slow tests;
* the auxiliary invariants' formulas agree with their concrete predicates,
  and CAD1-CAD3's formulas with the spec's transition properties, on the
  model's states, on perturbed ones and under both cadence mutants (where
  they break);
* k-induction keeps WF and CADA1-CADA3 and CAD1-CAD3 follow in one step,
  BMC bounds CAD1-CAD3, and both cadence mutants are found by BMC at their
  explicit kill lengths with their traces replayed on the spec (slow)."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import subprocess
import sys

import pytest
import z3

from flightcheck.spec import Schedule, State, schedule, transition_properties_for
from flightcheck.verification.cadence_models import CADENCE_K2, CADENCE_K2_ASYNC, CADENCE_PRIO_K2, cadence_mutant_model
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.mutants.cadence import CADENCE
from flightcheck.verification.z3.cadence_models import CADENCE_K3_TIGHT, CADENCE_Z3, CADENCE_Z3_ASYNC
from flightcheck.verification.z3.cadence_engines import CAD_BMC_DEPTH, CAD_PROPERTIES, cad_bmc, cad_induction, cad_model
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.cadence_invariants import (
    CAD_AUXILIARY,
    CAD_AUXILIARY_PREDICATES,
    CAD_TRANSITION_FORMULAS,
    plain_schedule,
)
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import leaves

MODEL = CADENCE_K2


@functools.lru_cache(maxsize=None)
def _reachable(model: Model = MODEL) -> tuple[State, ...]:
    return tuple(reachable(model))


def _interesting(s: State) -> bool:
    """A state where the cadence's part of the encoding matters: a hold, a backed-up queue or a marked request."""
    return s.prefill_hold > 0 or s.prefill_capacity_bound or any(
        q.is_prefill_chunk or q.deferred_waiting for q in s.requests)


def _sample(count: int, seed: int = 0, model: Model = MODEL) -> list[State]:
    """`count` reachable states, half of them with a hold, a backed-up queue or a mark."""
    states, rng = _reachable(model), random.Random(seed)
    marked = [s for s in states if _interesting(s) and s.prefill_hold > 0]
    return rng.sample(marked, count // 2) + rng.sample(states, count - count // 2)


def test_the_model_exercises_every_part_of_the_cadence():
    states = _reachable()
    held = [s for s in states if s.prefill_hold > 0 and not s.prefill_capacity_bound
            and any(not s.requests[r].is_prefill_chunk for r in s.running)]
    seen = {
        "a held call with a request waiting": any(s.waiting for s in held),
        "a backed-up queue while the hold lasts": any(s.prefill_capacity_bound and s.prefill_hold for s in states),
        "a running prefill chunk": any(s.requests[r].is_prefill_chunk for s in states for r in s.running),
    }
    assert all(seen.values()), [name for name, hit in seen.items() if not hit]
    assert len(states) == 1334
    # what cadence-k2 never reaches, the second model does (z3/cadence_models.py; slow test below)
    assert not any(q.deferred_waiting for s in states for q in s.requests)


@pytest.mark.slow
def test_the_tight_model_passes_requests_over():
    tight = _reachable(CADENCE_K3_TIGHT)
    assert len(tight) == 2109 and sum(any(q.deferred_waiting for q in s.requests) for s in tight) == 173


def test_a_model_without_the_cadence_has_no_such_frame_and_priority_beside_it_is_refused():
    plain = dataclasses.replace(MODEL, name="plain", cfg=dataclasses.replace(MODEL.cfg, prefill_schedule_interval=1))
    assert System(plain).frame(0).cad == []
    assert not any(name.startswith("cad") for name, _ in leaves(System(plain).frame(0)))
    assert any(name.startswith("cad") for name, _ in leaves(System(MODEL).frame(0)))
    prio = Model("prio", dataclasses.replace(MODEL.cfg, scheduling_policy="priority"), MODEL.prompts)
    with pytest.raises(ValueError, match="prefill cadence leaves out the priority policy"):
        System(prio)


def _cross_check(model: Model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


@pytest.mark.slow
def test_the_relation_is_spec_step_on_sampled_cadence_states():
    report = _cross_check(MODEL, _sample(10))
    assert report.problems == []
    assert report.edges > report.states
    passed_over = [s for s in _reachable(CADENCE_K3_TIGHT) if any(q.deferred_waiting for q in s.requests)]
    report = _cross_check(CADENCE_K3_TIGHT, random.Random(4).sample(passed_over, 4))
    assert report.problems == []


@pytest.mark.slow               # 558 s, 1,319 s, 12 s and 23-50 s at load 9-20
@pytest.mark.parametrize("model", [CADENCE_K2, CADENCE_K3_TIGHT, CADENCE_Z3, CADENCE_Z3_ASYNC], ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_every_reachable_cadence_state(model):
    report = _cross_check(model, reachable(model))
    assert report.problems == []
    assert (report.states, report.edges) == CROSS_CHECKED[model.name]


# Every reachable state and its spec successors (edges), cross-checked both ways; the last under
# vLLM 0.34's async scheduling (placeholders beside the hold in 63 of its states).
CROSS_CHECKED = {"cadence-k2": (1334, 2179), "cadence-k3-tight": (2109, 3859), "cadence-z3-k2": (87, 130),
                 "cadence-z3-k2-async": (177, 289)}


@pytest.mark.slow
def test_the_relation_is_spec_step_under_async_scheduling_on_sampled_states():
    """cadence-k2-async (vllm-0.34-async, 2,556 states: placeholders, the
    decode stagger, a queue of K + 1): 40 sampled states, half of them with
    a hold beside placeholders (`is_prefill_chunk` counts them)."""
    states, rng = _reachable(CADENCE_K2_ASYNC), random.Random(0)
    marked = [s for s in states if s.prefill_hold > 0 and any(q.placeholders for q in s.requests)]
    report = _cross_check(CADENCE_K2_ASYNC, rng.sample(marked, 20) + rng.sample(states, 20))
    assert report.problems == [] and report.states == 40


# --- the formulas against the concrete predicates


def _auxiliary_truth(s: State) -> dict[str, bool]:
    """CADA1 and CADA2 on a concrete state: each formula of the state's literals, simplified."""
    system = System(MODEL)
    constant = system.constant(s)
    return {n: z3.is_true(z3.simplify(system.build(f, constant))) for n, f in CAD_AUXILIARY.items()}


class _Evaluator:
    """Truth values of CAD1-CAD3 on concrete schedule steps: a solve with
    the frame's schedule, and CAD2's second schedule, defined."""

    def __init__(self, model: Model) -> None:
        self.system = System(model)
        self.step = self.system.step(0, 1)
        frame = self.system.frame(0)
        self.transition = {n: self.system.build(f, self.step) for n, f in CAD_TRANSITION_FORMULAS.items()}
        self.solver = z3.Solver()
        self.solver.add(*self.system.sched(0)[1], *self.system.build(lambda layout, s: plain_schedule(layout, s)[1],
                                                                      frame))
        self.solver.add(self.step.choices.act == SCHEDULE)

    def schedule_step(self, s: State) -> dict[str, bool]:
        self.solver.push()
        self.solver.add(self.system.encode(s, 0))
        assert self.solver.check() == z3.sat
        m = self.solver.model()
        truth = {n: z3.is_true(m.eval(f, model_completion=True)) for n, f in self.transition.items()}
        self.solver.pop()
        return truth


@functools.lru_cache(maxsize=None)
def _evaluator(model: Model = MODEL) -> _Evaluator:
    return _Evaluator(model)


def _perturbed(s: State, rng: random.Random) -> State:
    """A change of the cadence's part: the hold, the bound, or a request's marks."""
    r = rng.randrange(len(s.requests))
    q = s.requests[r]
    return rng.choice([dataclasses.replace(s, prefill_hold=1 - s.prefill_hold),
                       dataclasses.replace(s, prefill_capacity_bound=not s.prefill_capacity_bound),
                       s.with_request(r, is_prefill_chunk=not q.is_prefill_chunk),
                       s.with_request(r, deferred_waiting=not q.deferred_waiting)])


def _stretched(s: State, rng: random.Random) -> list[State]:
    """s with one entry in flight starting, or holding, one past max_model_len ([] with none in flight)."""
    slots = [(k, j) for k, batch in enumerate(s.in_flight) for j in range(len(batch))]
    if not slots:
        return []
    k, j = rng.choice(slots)
    e = s.in_flight[k][j]
    e = rng.choice([dataclasses.replace(e, start=MODEL.cfg.max_model_len + 1),
                    dataclasses.replace(e, n=MODEL.cfg.max_model_len + 1)])
    batch = s.in_flight[k][:j] + (e,) + s.in_flight[k][j + 1:]
    return [dataclasses.replace(s, in_flight=s.in_flight[:k] + (batch,) + s.in_flight[k + 1:])]


def test_each_auxiliary_formula_agrees_with_its_predicate():
    rng = random.Random(1)
    states = _sample(30)
    broken = {name: 0 for name in CAD_AUXILIARY}
    perturbed = [_perturbed(s, rng) for s in states for _ in range(3)]
    for s in states + perturbed + [t for s in states for t in _stretched(s, rng)]:
        truth = _auxiliary_truth(s)
        for name, holds in CAD_AUXILIARY_PREDICATES.items():
            expected = holds(s, MODEL.cfg)
            assert truth[name] == expected, (name, s)
            broken[name] += not expected
    assert all(broken.values()), broken         # the perturbations break each one somewhere


def _spec_truth(model: Model, s: State) -> dict[str, bool] | None:
    """CAD1-CAD3 of the spec (under the model's mutant) on the schedule step from s; None if it has none."""
    with applied(model.mutant):
        if schedule(s, model.cfg) is None:
            return None
        props = {p.name: p for p in transition_properties_for(model.cfg) if p.name in CAD_PROPERTIES}
        return {name: props[name].holds(s, s, Schedule(), model.cfg) for name in CAD_PROPERTIES}


def _agreement(model: Model, states) -> dict[str, int]:
    """Formula and spec agree on every schedule step from `states`; how often each property broke."""
    ev, broken, checked = _evaluator(model), {name: 0 for name in CAD_PROPERTIES}, 0
    for s in states:
        expected = _spec_truth(model, s)
        if expected is None:
            continue
        assert ev.schedule_step(s) == expected, (model.mutant, s)
        for name, holds in expected.items():
            broken[name] += not holds
        checked += 1
    assert checked >= len(states) // 3
    return broken


@pytest.mark.slow
def test_each_cad_formula_agrees_with_the_spec_on_schedule_steps_perturbed_and_mutated():
    rng = random.Random(2)
    states = _sample(8, seed=3)
    perturbed = []
    for s in states:
        try:
            t = _perturbed(s, rng)
            System(MODEL).constant(t)
            perturbed.append(t)
        except NotRepresentable:
            pass
    assert _agreement(MODEL, states + perturbed) == {name: 0 for name in CAD_PROPERTIES}
    # each mutant breaks its property on some reachable step (three of them here, and three it keeps), the
    # formula where the spec does
    for mutant in (m for m in CADENCE if cadence_mutant_model(m.name) is MODEL):   # not the priority one's
        model = MODEL.with_mutant(mutant.name)
        broken = [s for s in _reachable() if _spec_truth(model, s) and not _spec_truth(model, s)[mutant.killed_by]]
        kept = [s for s in _reachable() if _spec_truth(model, s) and _spec_truth(model, s)[mutant.killed_by]]
        assert _agreement(model, broken[:3] + kept[:3])[mutant.killed_by] == 3, mutant.name


# --- the engines


@pytest.mark.slow               # 80 s and 73 s at load 9-10
def test_k_induction_keeps_the_cadence_conjuncts_and_cad1_to_cad3_follow_in_one_step():
    result = cad_induction(cad_model("vllm-0.34"))
    rows = result.by_name()
    assert {name: rows[name].status for name in CAD_PROPERTIES} == {name: "proved" for name in CAD_PROPERTIES}
    assert rows["WF_encoding"].status == "proved"
    assert all(rows[name].status == "proved" for name in CAD_AUXILIARY)


@pytest.mark.slow               # 6 s at load 9
def test_without_cada3_a_schedule_step_breaks_if2_through_a_wrapped_sum_and_with_it_none_does():
    """Why CADA3 is offered: with every other conjunct of the proof assumed,
    a schedule step still breaks IF2 from a frame with an entry in flight
    longer than the model (S2's and S10's sums wrap round in bit-vectors);
    with CADA3 assumed too, no schedule step breaks it."""
    from flightcheck.verification.z3.cadence_engines import cad_auxiliary
    from flightcheck.verification.z3.kv_engines import CANDIDATE, WF, _formula, _step_solvers
    cada3, if2 = "CADA3_entries_within_the_model_length", CANDIDATE + "IF2_stale_counter"
    system = System(CADENCE_Z3)
    names = [WF, *cad_auxiliary(CADENCE_Z3)]
    solver, assume, goal = _step_solvers(system, 1, names)[SCHEDULE]
    assert solver.check(*[assume[n] for n in names if n != cada3], z3.Not(goal[if2])) == z3.sat
    assert z3.is_false(solver.model().eval(_formula(system, cada3, 0), model_completion=True))
    assert solver.check(*[assume[n] for n in names], z3.Not(goal[if2])) == z3.unsat


@pytest.mark.slow
def test_bmc_bounds_cad1_to_cad3():
    result = cad_bmc(MODEL, 4)
    assert [(p.name, p.status, p.depth) for p in result.properties] == [(name, "bounded", 4) for name in CAD_PROPERTIES]


@pytest.mark.slow
def test_the_prompt_length_stamp_pr54627_is_found_by_bmc_at_2_and_replayed_on_the_spec():
    """cadence_stamps_on_prompt_length_pr54627 in the encoding too: BMC breaks
    CAD3 at the explicit search's length, 2 (an arrival, then a schedule that
    admits a one-token prompt: prompt-length stamp restarts the hold, the
    deferral's own test does not), and the trace replays on the mutated spec."""
    mutant = next(m for m in CADENCE if m.name == "cadence_stamps_on_prompt_length_pr54627")
    result = cad_bmc(MODEL.with_mutant(mutant.name), mutant.shortest, [mutant.killed_by])
    (row,) = result.properties
    assert (row.status, row.depth) == ("violated", mutant.shortest)
    assert row.trace[-1] == Schedule() and row.states[-1].prefill_hold == MODEL.cfg.prefill_schedule_interval - 1


@pytest.mark.slow
def test_the_backed_up_queue_held_pr44558_is_found_by_bmc_at_4_and_replayed_on_the_spec():
    mutant = next(m for m in CADENCE if m.name == "cadence_holds_backed_up_queue_pr44558")
    model = MODEL.with_mutant(mutant.name)
    row = cad_bmc(model, mutant.shortest, [mutant.killed_by]).by_name()[mutant.killed_by]
    assert (row.status, row.depth) == ("violated", mutant.shortest)
    assert row.states[-2].prefill_capacity_bound and row.trace[-1] == Schedule()
    assert cad_bmc(model, mutant.shortest - 1, [mutant.killed_by]).by_name()[mutant.killed_by].status == "bounded"


def test_verify_prefill_cadence_refuses_a_profile_without_it_and_a_flag_it_cannot_go_with(capsys):
    from flightcheck.cli import main
    assert main(["verify", "--profile", "vllm-0.8.5", "--prefill-cadence"]) == 2
    assert "--prefill-cadence needs a profile with the prefill cadence" in capsys.readouterr().err
    assert main(["verify", "--profile", "vllm-0.34", "--prefill-cadence", "--priority"]) == 2
    assert "--prefill-cadence searches one profile's cadence model" in capsys.readouterr().err


@pytest.mark.slow               # 7 s at load 10 (over the default's share)
def test_verify_prefill_cadence_proves_cad1_to_cad3_by_exhaustive_search_of_cadence_k2():
    """`flightcheck verify --profile vllm-0.34 --prefill-cadence --no-z3`
    without the mutants' hunt: every row proved or reached, CAD1-CAD3 among
    them as invariants (transition properties), the targets as targets."""
    from flightcheck.verification.cadence_suite import run_cadence_suite
    from flightcheck.verification.suite import SuiteOptions

    report = run_cadence_suite(SuiteOptions(profile="vllm-0.34", use_z3=False, mutants=())).to_json()
    assert report["ok"] and report["prefill_cadence"] and report["mutants"] == []
    rows = {p["name"]: p for p in report["properties"]}
    assert {rows[name]["status"] for name in CAD_PROPERTIES} == {"proved"}
    assert {rows[name]["kind"] for name in CAD_PROPERTIES} == {"invariant"}
    assert rows["prefill_held_for_a_decode"]["kind"] == "sometimes"
    assert {p["method"] for p in report["properties"]} == {"exhaustive cadence-k2 (1334 states, depth 17)",
                                                           "exhaustive cadence-prio-k2 (196 states, depth 15)"}


@pytest.mark.slow
def test_verify_prefill_cadence_kills_the_mutants_and_prints_the_z3_rows_proved_and_bounded():
    """`flightcheck verify --profile vllm-0.34 --prefill-cadence --json`: the
    explicit rows, the cadence mutants killed by their properties at their
    lengths on their models, and CAD1-CAD3 proved by k-induction and bounded by BMC on
    cadence-k2 (the method names the model)."""
    out = subprocess.run([sys.executable, "-m", "flightcheck.cli", "verify", "--profile", "vllm-0.34",
                          "--prefill-cadence", "--json"], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] and report["prefill_cadence"]
    assert {m["name"]: (m["killed"], m["property"], m["trace_length"]) for m in report["mutants"]} == \
        {m.name: (True, m.killed_by, m.shortest) for m in CADENCE}
    assert {m["name"]: m["model"] for m in report["mutants"]}["cadence_stamp_undone_by_hand_back"] == CADENCE_PRIO_K2.name
    proved = [(p["name"], p["status"], p["depth"]) for p in report["properties"]
              if p["method"].endswith("[cadence-z3-k2@vllm-0.34]")]
    bounded = [(p["name"], p["status"], p["depth"]) for p in report["properties"]
               if p["method"] == "bmc [cadence-k2@vllm-0.34]"]
    assert sorted(proved) == [(name, "proved", 1) for name in CAD_PROPERTIES]
    assert sorted(bounded) == [(name, "bounded", CAD_BMC_DEPTH) for name in CAD_PROPERTIES]

"""LoRA's cap and the prompt-logprobs limit in the Z3 encoding
(verification/z3/encoding/lora.py, lora_invariants.py) against the spec, and
the proofs of LORA1, LORA2 and PL1 on the Z3 LoRA models
(verification/z3/lora_models.py: lora-k2, 294 states; prompt-logprobs-k2, 52):

* the transition relation is spec.step's on the models' states (every
  successor both ways, the Z3 action replaying on the spec): on sampled
  states here (requests held by the cap among them), on every reachable
  state of both models in the slow tests;
* LORA1 and the auxiliary invariants agree with their concrete predicates
  on reachable and perturbed states; LORA2 and PL1 agree with the spec's
  transition properties on schedule steps, reachable, perturbed and mutated;
* k-induction proves LORA1 (with LORAA1-LORAA3), LORA2 and PL1 follow in
  one step; BMC bounds all three; BMC finds each LoRA mutant at the explicit
  search's length, its trace replayed on the spec (slow);
* a model without the cap or prompt logprobs gets the hooks' identity, and
  what the encoding leaves out is refused."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import z3

from flightcheck.spec import Schedule, State, Status, schedule, transition_properties_for
from flightcheck.spec.invariants import invariants_for
from flightcheck.verification.lora_models import LORA_K2, LORA_K2_ASYNC, PROMPT_LOGPROBS_K2
from flightcheck.verification.models import Model
from flightcheck.verification.mutants import applied
from flightcheck.verification.mutants.lora import LORA
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.lora_invariants import (
    LORA_AUXILIARY,
    LORA_AUXILIARY_PREDICATES,
    LORA_FORMULAS,
    LORA_STEP_FORMULAS,
    alone_schedule,
)
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.lora_engines import (
    LORA_BMC_DEPTH,
    STEP_PROPERTIES,
    lora_bmc,
    lora_induction,
    lora_properties,
)
from flightcheck.spec.lora import held_requests

LORA1 = "LORA1_loras_within_cap"


@functools.lru_cache(maxsize=None)
def _reachable(model: Model) -> tuple[State, ...]:
    return tuple(reachable(model))


def _held(model: Model) -> list[State]:
    """The reachable states with a request the cap holds."""
    return [s for s in _reachable(model) if held_requests(s, model.cfg)]


def test_the_models_exercise_the_cap_and_the_limit():
    lora, pl = _reachable(LORA_K2), _reachable(PROMPT_LOGPROBS_K2)
    assert (len(lora), len(pl)) == (294, 52)
    held = _held(LORA_K2)
    assert any(any(q > w for w in held_requests(s, LORA_K2.cfg) for q in s.running) for s in held)
    assert any(s.requests[1].prompt_logprobs and 1 in s.waiting and s.pool.labels.count(1) for s in pl)


def test_a_model_without_the_cap_gets_the_hooks_identity_and_what_is_left_out_is_refused():
    from flightcheck.verification.z3.encoding import lora
    plain = dataclasses.replace(LORA_K2, name="plain", cfg=dataclasses.replace(LORA_K2.cfg, max_loras=0))
    layout = System(plain).layout
    assert z3.is_false(lora.held_by_cap(layout, System(plain).frame(0), z3.Int("r"), [], 0))
    assert lora.cache_read_limit(layout, None, None, "max") == "max"
    assert lora.lora_request_fields(layout, 0, True) == dict(lora=0, prompt_logprobs=False)
    prio = Model("prio", dataclasses.replace(LORA_K2.cfg, scheduling_policy="priority"), LORA_K2.prompts)
    with pytest.raises(ValueError, match="LoRA cap and of prompt logprobs leaves out the priority policy"):
        System(prio)
    with pytest.raises(NotRepresentable, match="LoRA or prompt-logprobs flag"):
        s = next(s for s in _reachable(LORA_K2) if s.requests[0].status is not Status.NEW)
        System(LORA_K2).constant(s.with_request(0, lora=2))


def _cross_check(model: Model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


def test_the_relation_is_spec_step_on_held_and_prompt_logprobs_states():
    rng = random.Random(0)
    report = _cross_check(LORA_K2, rng.sample(_held(LORA_K2), 3))
    assert report.problems == [] and report.edges > report.states
    pl = [s for s in _reachable(PROMPT_LOGPROBS_K2) if 1 in s.waiting and s.requests[1].prompt_logprobs]
    report = _cross_check(PROMPT_LOGPROBS_K2, rng.sample(pl, 3))
    assert report.problems == []


@pytest.mark.slow               # 75-99 s, 13 s and 213 s at load 10
@pytest.mark.parametrize("model", [LORA_K2, PROMPT_LOGPROBS_K2, LORA_K2_ASYNC], ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_every_reachable_state(model):
    """lora-k2-async (vllm-0.34-async: placeholders, the decode stagger, a queue of K + 1) too: the
    encoding does not refuse the cap under async scheduling, so it is cross-checked there."""
    report = _cross_check(model, _reachable(model))
    assert report.problems == []
    assert (report.states, report.edges) == CROSS_CHECKED[model.name]


# Every reachable state and its spec successors (edges), cross-checked both ways.
CROSS_CHECKED = {"lora-k2": (294, 537), "prompt-logprobs-k2": (52, 70), "lora-k2-async": (525, 1018)}


# --- the formulas against the concrete predicates


def _state_truth(model: Model, s: State) -> dict[str, bool]:
    system = System(model)
    constant = system.constant(s)
    return {n: z3.is_true(z3.simplify(system.build(f, constant)))
            for n, f in {**LORA_FORMULAS, **LORA_AUXILIARY}.items()}


def _perturbed(s: State, rng: random.Random) -> State:
    """A waiting request moved to `running` (RUNNING, or keeping its status),
    or a request that has not arrived put in `running`."""
    choices = []
    if s.waiting:
        w = rng.choice(s.waiting)
        moved = dataclasses.replace(s, waiting=tuple(x for x in s.waiting if x != w), running=s.running + (w,))
        choices += [moved.with_request(w, status=Status.RUNNING), moved]
    new = [r for r, q in enumerate(s.requests) if q.status is Status.NEW]
    if new:
        choices.append(dataclasses.replace(s, running=s.running + (rng.choice(new),)))
    return rng.choice(choices) if choices else s


def test_lora1_and_the_auxiliary_formulas_agree_with_their_predicates():
    rng, broken = random.Random(1), {name: 0 for name in (LORA1, *LORA_AUXILIARY_PREDICATES)}
    states = list(_reachable(LORA_K2)[::12])
    checked = 0
    for s in states + [_perturbed(s, rng) for s in states for _ in range(2)]:
        try:
            truth = _state_truth(LORA_K2, s)
        except NotRepresentable:
            continue
        checked += 1
        expected = {LORA1: next(i for i in invariants_for(LORA_K2.cfg) if i.name == LORA1).holds(s, LORA_K2.cfg),
                    **{n: p(s, LORA_K2.cfg) for n, p in LORA_AUXILIARY_PREDICATES.items()}}
        assert {n: truth[n] for n in expected} == expected, s
        for n, holds in expected.items():
            broken[n] += not holds
    assert checked > len(states) and all(broken.values()), broken


class _Evaluator:
    """Truth values of LORA2 and PL1 on concrete schedule steps: a solve with
    the frame's schedule, and LORA2's second schedules, defined."""

    def __init__(self, model: Model) -> None:
        self.system = System(model)
        self.step = self.system.step(0, 1)
        frame = self.system.frame(0)
        self.transition = {n: self.system.build(LORA_STEP_FORMULAS[n], self.step) for n in lora_properties(model)[1]}
        self.solver = z3.Solver()
        self.solver.add(*self.system.sched(0)[1])
        for w, p in enumerate(model.prompts):
            if p.lora > 0 and model.cfg.max_loras:
                self.solver.add(*self.system.build(lambda layout, s, w=w: alone_schedule(layout, s, w)[1], frame))
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
def _evaluator(model: Model) -> _Evaluator:
    return _Evaluator(model)


def _spec_truth(model: Model, s: State) -> dict[str, bool] | None:
    """LORA2 and PL1 of the spec (under the model's mutant) on the schedule step from s; None if it has none."""
    with applied(model.mutant):
        if schedule(s, model.cfg) is None:
            return None
        props = {p.name: p for p in transition_properties_for(model.cfg) if p.name in STEP_PROPERTIES}
        return {name: p.holds(s, s, Schedule(), model.cfg) for name, p in props.items()}


def _agreement(model: Model, states) -> dict[str, int]:
    """Formula and spec agree on every schedule step from `states`; how often each property broke."""
    ev, broken, checked = _evaluator(model), {}, 0
    for s in states:
        expected = _spec_truth(model, s)
        if expected is None:
            continue
        assert ev.schedule_step(s) == expected, (model.mutant, s)
        for name, holds in expected.items():
            broken[name] = broken.get(name, 0) + (not holds)
        checked += 1
    assert checked >= 1
    return broken


def test_pl1_agrees_with_the_spec_on_schedule_steps_and_under_its_mutant():
    states = [s for s in _reachable(PROMPT_LOGPROBS_K2) if 1 in s.waiting][:6]
    assert _agreement(PROMPT_LOGPROBS_K2, states) == {"PL1_prompt_logprobs_read_no_cache": 0}
    mutant = PROMPT_LOGPROBS_K2.with_mutant("prompt_logprobs_read_prefix_cache_issue3251")
    assert _agreement(mutant, states)["PL1_prompt_logprobs_read_no_cache"] >= 1


@pytest.mark.slow
def test_lora2_agrees_with_the_spec_on_held_steps_perturbed_and_under_its_mutant():
    rng = random.Random(2)
    held = rng.sample(_held(LORA_K2), 6)
    perturbed = []
    for s in held:
        t = _perturbed(s, rng)
        try:
            System(LORA_K2).constant(t)
            perturbed.append(t)
        except NotRepresentable:
            pass
    assert _agreement(LORA_K2, held + perturbed + list(_reachable(LORA_K2)[:10])) == \
        {"LORA2_held_request_is_passed_over": 0}
    mutant = LORA_K2.with_mutant("lora_cap_stops_admission_pr15422")
    broken = [s for s in _held(LORA_K2)
              if (truth := _spec_truth(mutant, s)) is not None and not truth["LORA2_held_request_is_passed_over"]]
    assert broken and _agreement(mutant, broken[:3] + held[:3])["LORA2_held_request_is_passed_over"] == len(broken[:3])


# --- the engines


@pytest.mark.slow               # 21 s at load 10
def test_k_induction_proves_the_auxiliary_invariants_and_pl1_follows_in_one_step():
    rows = lora_induction(PROMPT_LOGPROBS_K2).by_name()
    assert rows["PL1_prompt_logprobs_read_no_cache"].status == "proved"
    assert all(rows[n].status == "proved" for n in LORA_AUXILIARY)


@pytest.mark.slow
def test_k_induction_proves_lora1_and_lora2_follows_in_one_step():
    rows = lora_induction(LORA_K2).by_name()
    assert {n: rows[n].status for n in (LORA1, "LORA2_held_request_is_passed_over")} == \
        {LORA1: "proved", "LORA2_held_request_is_passed_over": "proved"}
    assert all(rows[n].status == "proved" for n in LORA_AUXILIARY)


@pytest.mark.slow
def test_a_one_step_consequence_is_not_vacuous_under_the_mutant_it_breaks():
    """Under #3251's edit the same proof of PL1 finds a state where a schedule step breaks it."""
    rows = lora_induction(PROMPT_LOGPROBS_K2.with_mutant("prompt_logprobs_read_prefix_cache_issue3251")).by_name()
    assert rows["PL1_prompt_logprobs_read_no_cache"].status == "unknown"


@pytest.mark.slow
@pytest.mark.parametrize("model", [LORA_K2, PROMPT_LOGPROBS_K2], ids=lambda m: m.name)
def test_bmc_bounds_every_lora_property(model):
    result = lora_bmc(model, LORA_BMC_DEPTH)
    assert {(p.name, p.status, p.depth) for p in result.properties} == \
        {(n, "bounded", LORA_BMC_DEPTH) for n in ("WF_encoding", *(n for ns in lora_properties(model) for n in ns))}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", LORA, ids=lambda m: m.name)
def test_each_lora_mutant_is_found_by_bmc_at_its_length_and_replayed_on_the_spec(mutant):
    model = (PROMPT_LOGPROBS_K2 if mutant.name.startswith("prompt_logprobs") else LORA_K2).with_mutant(mutant.name)
    row = lora_bmc(model, mutant.shortest, [mutant.killed_by]).by_name()[mutant.killed_by]
    assert (row.status, row.depth) == ("violated", mutant.shortest)
    assert row.trace[-1] == Schedule() or mutant.killed_by == LORA1


def test_verify_lora_refuses_a_profile_without_it_and_a_flag_it_cannot_go_with(capsys):
    from flightcheck.cli import main
    assert main(["verify", "--profile", "vllm-0.8.5", "--lora"]) == 2
    assert "--lora needs a profile with the LoRA cap" in capsys.readouterr().err
    for other in ("--prefill-cadence", "--priority", "--kv-connector"):
        assert main(["verify", "--profile", "vllm-0.34", "--lora", other]) == 2
        assert "--lora searches one profile's LoRA models" in capsys.readouterr().err



@pytest.mark.slow               # about 3 min at load 10
def test_verify_lora_kills_the_mutants_and_prints_the_z3_rows_proved_and_bounded():
    """`flightcheck verify --profile vllm-0.34 --lora --json`: the explicit
    rows, the four LoRA mutants killed, and LORA1 proved by k-induction,
    LORA2 and PL1 one step from its invariant, all three bounded by BMC,
    each row naming its model."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "flightcheck.cli", "verify", "--profile", "vllm-0.34", "--lora",
                          "--json"], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] and report["lora"]
    assert {m["name"]: m["killed"] for m in report["mutants"]} == {m.name: True for m in LORA}
    z3_rows = {(p["name"], p["status"], p["method"]) for p in report["properties"] if "@vllm-0.34]" in p["method"]}
    assert z3_rows == {
        (LORA1, "proved", "k-induction (k=1) [lora-k2@vllm-0.34]"),
        ("LORA2_held_request_is_passed_over", "proved", "one step from the k-induction invariant [lora-k2@vllm-0.34]"),
        ("PL1_prompt_logprobs_read_no_cache", "proved",
         "one step from the k-induction invariant [prompt-logprobs-k2@vllm-0.34]"),
        (LORA1, "bounded", "bmc [lora-k2@vllm-0.34]"),
        ("LORA2_held_request_is_passed_over", "bounded", "bmc [lora-k2@vllm-0.34]"),
        ("PL1_prompt_logprobs_read_no_cache", "bounded", "bmc [prompt-logprobs-k2@vllm-0.34]")}

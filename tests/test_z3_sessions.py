"""Streaming sessions in the Z3 encoding (verification/z3/encoding/session_state.py,
sessions.py, session_schedule.py, session_invariants.py) against the spec,
and the proofs of SS1-SS4 on the session model (verification/z3/session_models.py,
session_engines.py; docs/proofs.md, "Streaming sessions"):

* a model without sessions keeps its frames (no session fields, the same
  status codes), and what the encoding of sessions leaves out is refused;
* the transition relation is spec.step's on the session models' states
  (every successor both ways, the Z3 action replaying on the spec): on a
  sample here, on every reachable state in the slow tests;
* SS2-SS4 and the auxiliary SA1-SA10 agree with the spec's predicates (the
  auxiliary ones: hold) on every reachable state, and SS2-SS4 on perturbed
  states where the spec's predicates break;
* k-induction proves SS2-SS4 and every auxiliary invariant, SS1 follows in
  one step, BMC bounds them; session mutants are found by BMC and their
  traces replayed on the spec."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import pytest
import z3

from flightcheck.spec import Fate, Status, invariants_for
from flightcheck.verification.models import MODELS
from flightcheck.verification.session_models import SESSION_CACHE_K2, SESSION_DRAFTS_K2
from flightcheck.verification.z3 import session_models as zs
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.session_invariants import SESSION_AUXILIARY, SESSION_FORMULAS
from flightcheck.verification.z3.encoding.state import F_ABORTED, NotRepresentable, num_statuses
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.results import EngineResult
from flightcheck.verification.z3.session_engines import (
    SS1,
    session_bmc,
    session_induction,
    ss1_bmc,
    ss1_one_step,
)


@functools.lru_cache(maxsize=None)
def _reachable(model) -> list:
    return list(reachable(model))


def _cross_check(model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


def test_a_model_without_sessions_keeps_its_frames():
    system = System(MODELS["shared-k3"])
    f = system.frame(0)
    assert f.sess == [] and all(q.session == [] for q in f.reqs)
    assert num_statuses(system.layout) == F_ABORTED + 1


def test_what_the_encoding_of_sessions_leaves_out_is_refused():
    with pytest.raises(ValueError, match="drafts"):
        System(SESSION_DRAFTS_K2)
    with pytest.raises(ValueError, match="prefix caching beside sessions"):
        System(SESSION_CACHE_K2)


@pytest.mark.parametrize("model", [zs.SESSION_SOLO, zs.SESSION_K2_ASYNC], ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_sampled_session_states(model):
    states = _reachable(model)
    sample = random.Random(0).sample(states, 3)
    report = _cross_check(model, sample)
    assert report.problems == []
    assert report.edges >= report.states


@pytest.mark.slow
@pytest.mark.parametrize("model", [zs.SESSION_SOLO, zs.SESSION_SOLO_ASYNC, zs.SESSION_K2,
                                   zs.session_solo("vllm-0.33"), zs.session_solo("vllm-0.33-async")],
                         ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_every_reachable_session_state(model):
    states = _reachable(model)
    report = _cross_check(model, states)
    assert report.problems == []
    assert report.states == len(states) == {"session-solo-k2@vllm-0.34": 136,
                                            "session-solo-k2@vllm-0.34-async": 264,
                                            "session-k2@vllm-0.34": 901,
                                            "session-solo-k2@vllm-0.33": 136,
                                            "session-solo-k2@vllm-0.33-async": 264}[model.name]


def _formula_holds(system: System, formula, state) -> bool:
    return z3.is_true(z3.simplify(system.build(formula, system.constant(state))))


def _agree(model, states) -> None:
    system, specs = System(model), {inv.name: inv for inv in invariants_for(model.cfg)}
    for state in states:
        for name, formula in SESSION_FORMULAS.items():
            assert _formula_holds(system, formula, state) == specs[name].holds(state, model.cfg), (name, state)
        for name, formula in {**SESSION_AUXILIARY, "WF": well_formed}.items():
            assert _formula_holds(system, formula, state), (name, state)


def test_each_formula_agrees_with_the_spec_on_sampled_states():
    model = zs.SESSION_SOLO_ASYNC
    parked = [s for s in _reachable(model) if any(q.status is Status.WAITING_FOR_STREAMING_REQ for q in s.requests)]
    _agree(model, random.Random(0).sample(_reachable(model), 20) + random.Random(0).sample(parked, 10))


@pytest.mark.slow
@pytest.mark.parametrize("model", [zs.SESSION_SOLO, zs.SESSION_SOLO_ASYNC, zs.SESSION_K2], ids=lambda m: m.name)
def test_each_formula_agrees_with_the_spec_on_every_reachable_state(model):
    _agree(model, _reachable(model))


def _perturbed(model) -> list:
    """Reachable states with one session field broken: a parked session
    with drafts or a queued input, an old turn's entry made live or its stale
    count dropped, a parked session in `running`'s seat count."""
    out = []
    for s in _reachable(model):
        for r, q in enumerate(s.requests):
            if q.status is Status.WAITING_FOR_STREAMING_REQ:
                out.append(s.with_request(r, num_drafts=1))
                out.append(s.with_request(r, queued_inputs=q.inputs_to_send[:1], inputs_to_send=q.inputs_to_send[1:]))
                if r not in s.running:
                    out.append(replace(s, running=s.running + (r,)))
            if any(e.turn < q.turn for b in s.in_flight for e in b if e.req == r):
                out.append(s.with_request(r, num_stale=0))
                out.append(replace(s, in_flight=tuple(tuple(replace(e, fate=Fate.LIVE) if e.req == r and e.turn < q.turn
                                                            else e for e in b) for b in s.in_flight)))
    return out


def test_each_formula_agrees_with_the_spec_on_perturbed_states():
    model = zs.SESSION_SOLO_ASYNC
    system, specs = System(model), {inv.name: inv for inv in invariants_for(model.cfg)}
    broken = {name: 0 for name in SESSION_FORMULAS}
    for state in _perturbed(model):
        try:
            system.constant(state)
        except NotRepresentable:
            continue
        for name, formula in SESSION_FORMULAS.items():
            want = specs[name].holds(state, model.cfg)
            assert _formula_holds(system, formula, state) == want, (name, state)
            broken[name] += not want
    assert all(broken.values()), broken


@pytest.mark.slow
@pytest.mark.parametrize("model", [zs.SESSION_SOLO, zs.SESSION_SOLO_ASYNC], ids=lambda m: m.name)
def test_k_induction_proves_each_session_invariant_and_ss1_follows_in_one_step(model):
    result = session_induction(model)
    assert {p.name: p.status for p in result.properties if p.status != "proved"} == {}
    assert [p.name for p in result.properties if p.kind != "auxiliary"] == list(SESSION_FORMULAS)
    assert ss1_one_step(model, result).status == "proved"


def test_ss1_does_not_follow_from_a_weaker_invariant():
    """The one-step check can fail: without the invariants that say an old
    turn's entries are stale in drop mode, a step binds an old output."""
    nothing_proved = EngineResult(zs.SESSION_SOLO.name, "k-induction (k=1)", 0.0, 1, [])
    assert ss1_one_step(zs.SESSION_SOLO, nothing_proved).status == "unknown"


@pytest.mark.slow
def test_bmc_bounds_each_session_property():
    result = session_bmc(zs.SESSION_SOLO, 6)
    assert {p.name: (p.status, p.depth) for p in result.properties} == {
        "WF_encoding": ("bounded", 6), "SS2_old_turn_given_up": ("bounded", 6),
        "SS3_waiting_session_holds_blocks": ("bounded", 6), "SS4_waiting_session_keeps_seat": ("bounded", 6)}
    assert ss1_bmc(zs.SESSION_SOLO, 6).status == "bounded"


def test_bmc_finds_the_omni5183_mutant_and_the_spec_agrees():
    """vllm-omni #5183 (the placeholders' tokens kept at a stop): SS3 breaks
    at depth 5, as in the explicit search; the engine replays the trace on
    the spec, whose SS3 breaks too."""
    model = zs.session_z3_mutant_model("stop_keeps_optimistic_tokens_omni5183", solo=True)
    result = session_bmc(model, 5, time_budget=300)
    verdict = result.by_name()["SS3_waiting_session_holds_blocks"]
    assert (verdict.status, verdict.depth) == ("violated", 5)
    assert verdict.states[-1].requests[0].status is Status.WAITING_FOR_STREAMING_REQ
    assert {p.name: p.status for p in result.properties if p.name != verdict.name} == {
        "WF_encoding": "bounded", "SS2_old_turn_given_up": "bounded", "SS4_waiting_session_keeps_seat": "bounded"}


@pytest.mark.slow
def test_bmc_finds_the_52765_mutant_by_ss1_and_the_spec_agrees():
    """vLLM PR #52765 (an old turn's outputs not dropped): SS1 breaks at
    depth 7 (the explicit search's), the trace replayed on the spec."""
    verdict = ss1_bmc(zs.session_z3_mutant_model("turn_output_not_dropped_pr52765", solo=True), 7)
    assert (verdict.name, verdict.status, verdict.depth) == (SS1, "violated", 7)


@pytest.mark.slow
def test_bmc_finds_the_freed_seat_mutant_and_the_spec_agrees():
    verdict = session_bmc(zs.session_z3_mutant_model("waiting_session_seat_freed"), 5).by_name()[
        "SS4_waiting_session_keeps_seat"]
    assert (verdict.status, verdict.depth) == ("violated", 5)


def test_verify_runs_the_z3_session_rows_only_under_the_encoded_profiles():
    from flightcheck.verification.z3.session_engines import SESSION_Z3_PROFILES, session_rows
    assert SESSION_Z3_PROFILES == ("vllm-0.33", "vllm-0.34", "vllm-0.33-async", "vllm-0.34-async")
    assert session_rows("vllm-0.8.5") == []


@pytest.mark.slow
def test_verify_streaming_sessions_reports_the_z3_rows_by_method():
    from flightcheck.verification.suite import SuiteOptions, run_suite
    result = run_suite(SuiteOptions(profile="vllm-0.34", streaming_sessions=True))
    assert result.ok and result.explicit_only is None
    rows = {(p.name, p.method): p.status for p in result.properties if "session-solo-k2" in p.method}
    where = " [session-solo-k2@vllm-0.34]"
    for name in SESSION_FORMULAS:
        assert rows[name, "k-induction (k=1)" + where] == "proved" and rows[name, "bmc" + where] == "bounded"
    assert rows[SS1, "one step of the k-induction invariant" + where] == "proved"
    assert rows[SS1, "bmc" + where] == "bounded"

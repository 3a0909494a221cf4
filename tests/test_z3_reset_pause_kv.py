"""Reset and pause beside a KV connector in the Z3 encoding: the reset of
the connector's cache (`Reset(running, connector=True)`, spec
reset_pause._forget_offers, the ghost `Request.offer_reset`) and RP5 on
reset-kv-z3-k1 (verification/z3/reset_pause_models.py):

* the transition relation is spec.step's on the model's states (every
  successor both ways, the connector's reports included): on a sample
  here, on every reachable state in the slow test;
* RPA3's formula agrees with its concrete predicate, RP5's with the spec's
  transition property, on the model's states and steps and on perturbed
  ones where they break;
* k-induction keeps every conjunct offered and RP5 (with RP1-RP3) follows
  in one step, BMC bounds it (slow); a reset that keeps the offer, planted
  in the spec and the encoding alike, is found by BMC in three steps with
  its trace replayed on the mutated spec."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import z3

from flightcheck.spec import step
from flightcheck.spec import CompleteOldest, Pause, Reset, Schedule, SetPause, State, transition_properties_for
from flightcheck.spec import reset_pause as spec_reset
from flightcheck.spec.state import Load, Status
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.models import Model
from flightcheck.verification.z3.encoding import reset_pause as encoded_reset
from flightcheck.verification.z3.encoding.actions import COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.reset_pause import rp_code
from flightcheck.verification.z3.encoding.reset_pause_invariants import (
    RP5_FORMULA,
    RP_KV_AUXILIARY,
    RP_KV_AUXILIARY_PREDICATES,
)
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import clone
from flightcheck.verification.z3.kv_engines import kv_bmc
from flightcheck.verification.z3.reset_pause_engines import (
    RP_KV_PROPERTIES,
    rp_bmc,
    rp_induction,
    rp_kv_model,
    rp_properties,
)
from flightcheck.verification.z3.reset_pause_models import RP_KV_Z3

from .z3_formula_evaluator import FormulaEvaluator

MODEL = RP_KV_Z3
RP5 = "RP5_connector_reset_forgets_offers"


@functools.lru_cache(maxsize=None)
def _reachable() -> tuple[State, ...]:
    return tuple(reachable(MODEL))


def _interesting(s: State) -> bool:
    """A state where the connector's reset or the pause beside a load matters."""
    return any(q.offer_reset for q in s.requests) or (s.pause is not Pause.UNPAUSED and bool(s.kv_holding))


def _sample(count: int, seed: int = 0) -> list[State]:
    states, rng = _reachable(), random.Random(seed)
    marked = [s for s in states if _interesting(s)]
    return rng.sample(marked, count // 2) + rng.sample(states, count - count // 2)


def test_the_model_is_small_and_reaches_a_reset_that_forgets_an_offer():
    states = _reachable()
    seen = {
        "an offer forgotten before its load": any(
            q.offer_reset and q.external_hit == 0 and q.status is Status.WAITING for s in states for q in s.requests),
        "a forgotten request admitted with no load": any(
            q.offer_reset and q.status is Status.RUNNING for s in states for q in s.requests),
        "a load parked": any(q.load is Load.IN_FLIGHT for s in states for q in s.requests),
        "a landed load under PAUSED_NEW": any(
            s.pause is Pause.PAUSED_NEW and q.load is Load.RECEIVED for s in states for q in s.requests),
        "a reset entry in flight": any(e.reset for s in states for b in s.in_flight for e in b),
    }
    assert all(seen.values()), [name for name, hit in seen.items() if not hit]
    assert len(states) == 408
    assert rp_properties(MODEL)[-1] == RP5 and RP_KV_PROPERTIES == (RP5,)


def test_a_connector_the_encoding_leaves_out_beside_reset_and_pause_is_refused():
    fenced = Model("fenced", dataclasses.replace(MODEL.cfg, num_stages=2), MODEL.prompts)
    with pytest.raises(ValueError, match="reset and pause leaves out a KV connector that .* fences its frees"):
        System(fenced)
    producer = Model("producer", dataclasses.replace(
        MODEL.cfg, kv_connector=dataclasses.replace(MODEL.cfg.kv_connector, producer=True)), MODEL.prompts)
    with pytest.raises(ValueError, match="a KV connector that sends"):
        System(producer)


def test_the_relation_is_spec_step_on_sampled_states_of_the_connectors_reset():
    checker, report = CrossChecker(MODEL), CrossReport()
    for s in _sample(16):
        checker.check(s, report)
    assert report.problems == []
    assert report.edges > report.states


def test_each_reset_code_is_its_spec_action_from_a_state_with_an_offer_not_taken():
    """From a state where request 0 waits with its offer and request 1 runs,
    each of the four reset codes gives the spec's successor of the Reset it
    decodes to, and only those with the connector's cache forget the offer."""
    s = next(s for s in _reachable() if s.requests[0].status is Status.WAITING and s.requests[0].external_hit
             and s.running)
    checker = CrossChecker(MODEL)
    forgot = {}
    for action in (Reset(r, c) for r in (False, True) for c in (False, True)):
        solver = z3.Solver()
        solver.add(checker.relation, *checker.system.encode(s, 0),
                   checker.step.choices.act == rp_code(action, checker.system.layout))
        assert solver.check() == z3.sat
        m = solver.model()
        assert checker.system.decode_action(m, checker.step) == action
        nxt = checker.system.decode(m, 1)
        assert nxt == step(s, MODEL.cfg, action)
        forgot[action] = nxt.requests[0].offer_reset
    assert forgot == {Reset(False, False): False, Reset(True, False): False,
                      Reset(False, True): True, Reset(True, True): True}


# --- the formulas against the concrete predicates


@functools.lru_cache(maxsize=None)
def _evaluator() -> FormulaEvaluator:
    """RPA3 on states and RP5 on steps (RP5 reads the frame's schedule: a solve)."""
    return FormulaEvaluator(MODEL, RP_KV_AUXILIARY, {RP5: RP5_FORMULA[RP5]})


def _kept_offer(s: State) -> State:
    """A forgotten request offered its prompt's hit again (what a reset that
    keeps the offer leaves), or a request marked forgotten with a load parked."""
    for r, q in enumerate(s.requests):
        if q.offer_reset:
            return s.with_request(r, external_hit=MODEL.prompts[r].external_hit)
        if q.load is Load.IN_FLIGHT:
            return s.with_request(r, offer_reset=True)
    return s


def test_rpa3_agrees_with_its_predicate_on_states_and_perturbed_ones():
    ev = _evaluator()
    (name, holds), = RP_KV_AUXILIARY_PREDICATES.items()
    broken = 0
    for s in _sample(24, seed=1):
        for t in (s, _kept_offer(s)):
            expected = holds(t, MODEL.cfg)
            assert ev.state(t, name) == expected, t
            broken += not expected
    assert broken


def _code(action) -> int:
    if isinstance(action, (Reset, SetPause)):
        return rp_code(action, _evaluator().system.layout)
    return {Schedule: SCHEDULE, CompleteOldest: COMPLETE}.get(type(action), 0)


def test_rp5s_formula_agrees_with_the_spec_on_steps_and_on_a_schedule_that_parks_a_forgotten_load():
    ev = _evaluator()
    spec = next(p for p in transition_properties_for(MODEL.cfg) if p.name == RP5)
    checked = broken = 0
    states = _sample(16, seed=3) + [s for s in _reachable() if any(q.offer_reset for q in s.requests)][:8]
    for s in states:
        for action, t in explicit.successors(MODEL, s):
            # a forgotten request's load set in transfer after the step: what RP5 forbids
            forgot = [r for r, q in enumerate(s.requests) if q.offer_reset]
            perturbed = [t.with_request(r, load=Load.IN_FLIGHT) for r in forgot[:1]]
            for nxt in (t, *perturbed):
                try:
                    ev.system.constant(nxt)
                except NotRepresentable:
                    continue
                expected = spec.holds(s, nxt, action, MODEL.cfg)
                assert ev.edge(s, _code(action), nxt, RP5) == expected, (s, action, nxt)
                checked += 1
                broken += not expected
    assert checked > 50 and broken


# --- the engines


@pytest.mark.slow               # 90-172 s each at load 12-13 (408 states, 1,840 edges; 0.33's: 36 empty batches)
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_the_relation_is_spec_step_on_every_reachable_state_of_the_connectors_reset(profile):
    model = rp_kv_model(profile)
    checker, report = CrossChecker(model), CrossReport()
    for s in reachable(model):
        checker.check(s, report)
    assert report.problems == []
    assert (report.states, report.edges) == (408, 1840)


@pytest.mark.slow               # 25-48 s at load 12-13
def test_k_induction_keeps_every_conjunct_and_rp5_follows_in_one_step():
    result = rp_induction(MODEL)
    rows = result.by_name()
    assert {n: rows[n].status for n in rp_properties(MODEL)} == {
        "RP1_paused_schedules_nothing": "proved", "RP2_reset_drops_in_flight": "proved",
        "RP3_reset_output_never_applied": "proved", RP5: "proved",
        "RP4_prefix_cache_reset": "unknown"}          # broken: the next test
    assert [p.name for p in result.properties if p.status != "proved"] == ["RP4_prefix_cache_reset"]
    assert {"RPA1_reset_entries_dropped", "RPA3_forgotten_offers_stay_unloaded", "KV1_no_reuse_under_transfer"} \
        <= {p.name for p in result.properties}


@pytest.mark.slow               # 14-45 s at load 12-13
def test_bmc_bounds_rp5_and_breaks_rp4_where_a_parked_load_holds_its_blocks():
    """RP4 breaks in three steps as on the explicit reset-kv-async-k2 (vLLM
    raises: a reset of the running requests while a parked load holds
    blocks, docs/vllm-kv-connector-findings.md); RP1-RP3 and RP5 hold to 6."""
    rows = rp_bmc(MODEL, 6).by_name()
    assert (rows["RP4_prefix_cache_reset"].status, rows["RP4_prefix_cache_reset"].depth) == ("violated", 3)
    assert {n: (rows[n].status, rows[n].depth) for n in rp_properties(MODEL) if n != "RP4_prefix_cache_reset"} == \
        {n: ("bounded", 6) for n in rp_properties(MODEL) if n != "RP4_prefix_cache_reset"}


@pytest.mark.slow               # 95-155 s at load 12
def test_bmc_bounds_the_connectors_invariants_the_model_carries_too():
    """KV1, KV2, KV4 (kept by the k-induction above) and the encoding's
    well-formedness, bounded to 6 by kv_engines.kv_bmc on the same model."""
    result = kv_bmc(MODEL, 6)
    assert [(p.name, p.status, p.depth) for p in result.properties] == [
        (n, "bounded", 6) for n in ("WF_encoding", "KV1_no_reuse_under_transfer", "KV2_loading_not_scheduled",
                                    "KV4_no_leak")]


def test_a_reset_that_keeps_the_offer_is_found_by_bmc_and_replayed_on_the_spec(monkeypatch):
    """Planted in the spec and the encoding alike: the connector's reset
    marks the offer forgotten (the ghost) but keeps it. BMC breaks RP5 in
    three steps (request 0 arrives, the connector's cache is reset, a
    schedule parks its load), and the trace replays on the mutated spec,
    whose RP5 fails on its last step; two steps bound it."""
    def spec_keeps(state):
        for r, q in enumerate(state.requests):
            if q.status.is_active and q.load is Load.NONE and q.external_hit > 0:
                state = state.with_request(r, offer_reset=True)
        return state

    real = encoded_reset._forget_offers

    def encoding_keeps(layout, st):
        out = clone(st)         # the ghost as the real reset sets it, `forgotten` left as it was
        out.rp[0].offer_reset = real(layout, st).rp[0].offer_reset
        return out

    monkeypatch.setattr(spec_reset, "_forget_offers", spec_keeps)
    monkeypatch.setattr(encoded_reset, "_forget_offers", encoding_keeps)
    assert rp_bmc(MODEL, 2, [RP5]).by_name()[RP5].status == "bounded"
    (row,) = rp_bmc(MODEL, 3, [RP5]).properties
    assert (row.status, row.depth) == ("violated", 3)
    assert Reset(False, True) in row.trace or Reset(True, True) in row.trace
    assert row.trace[-1] == Schedule()
    last = row.states[-1].requests[0]
    assert last.offer_reset and last.load is Load.IN_FLIGHT and last.external_hit == 2


def test_the_verify_row_is_rp5_on_the_model_under_each_profiles_sync_rules():
    assert rp_kv_model("vllm-0.34") is RP_KV_Z3
    assert rp_kv_model("vllm-0.33-async").cfg.profile == "vllm-0.33"
    assert rp_kv_model("vllm-0.34-async").cfg.profile == "vllm-0.34"


def test_the_reset_pause_rows_carry_rp5_from_the_model_beside_a_connector(monkeypatch):
    """`flightcheck verify --reset-pause`'s Z3 rows (reset_pause_rows): RP1-RP4
    from reset-pause-z3-k2 and RP5 from reset-kv-z3-k1, each by k-induction
    and by BMC, the method naming the model and the encoded profile (the
    engines stubbed: their own results are the slow tests')."""
    from flightcheck.verification.z3 import reset_pause_engines as engines
    from flightcheck.verification.z3.results import EngineResult, EngineVerdict
    asked = []

    def fake(method: str):
        def run(model, *args, **kwargs):
            names = args[1] if method == "bmc" and len(args) > 1 else rp_properties(model)
            asked.append((method, model.name, tuple(names)))
            return EngineResult(model.name, method, 0.0, 1, [EngineVerdict(n, "transition", "proved", method, 1, 0.0)
                                                             for n in names])
        return run

    monkeypatch.setattr(engines, "rp_induction", fake("k-induction"))
    monkeypatch.setattr(engines, "rp_bmc", fake("bmc"))
    rows = engines.reset_pause_rows("vllm-0.33-async")
    by_model = {}
    for row in rows:
        by_model.setdefault(row.method.split("[")[1].split("@")[0], set()).add(row.name)
    assert by_model == {"reset-pause-z3-k2": set(engines.RP_PROPERTIES), "reset-kv-z3-k1": {RP5}}
    assert {r.method for r in rows if r.name == RP5} == {
        "k-induction [reset-kv-z3-k1@vllm-0.33; vllm-0.33-async's synchronous twin]",
        "bmc [reset-kv-z3-k1@vllm-0.33; vllm-0.33-async's synchronous twin]"}
    assert ("bmc", "reset-kv-z3-k1@vllm-0.33", (RP5,)) in asked

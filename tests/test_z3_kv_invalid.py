"""KV7 in the Z3 encoding of the connector (verification/z3/encoding/kv_sync.py,
kv_invalid.py; docs/proofs.md, "KV7: no compute on invalid KV"): synchronous
loads and prefix caching beside the connector, and `invalid_kv` in the frame,
on `kv-invalid-k2` (verification/kv_models.py) under vLLM 0.34 and under
finding 7's fix:

* the transition relation is spec.step's (every successor both ways, with
  every report the connector could make): on a sample here, on every
  reachable state in the slow tests;
* the sample holds what KV7 turns on (a sync load's entry, an invalid block,
  a failure of a running and of a finished loader), so it is no vacuous check;
* what the encoding still leaves out is refused, never checked by a partial relation;
* KV7's step formula and KVA10 (`quarantined`) agree with the spec's
  predicates on every schedule step and state of the model (a sample here,
  all in the slow tests), and under vLLM 0.34 the formula is false on the
  last step of the counterexample the explicit search finds (no vacuous
  formula).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import z3

from flightcheck.spec import Status
from flightcheck.spec.kv_invalid import quarantined, schedule_reads
from flightcheck.spec.transitions import FailKvLoad, Schedule
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.kv_models import KV_INVALID_K2
from flightcheck.verification.z3.encoding.crosscheck import concrete_successors
from flightcheck.verification.z3.encoding.actions import SCHEDULE
from flightcheck.verification.z3.encoding.kv_invalid_formulas import kv7_no_compute_on_invalid_kv, kva10_invalid_kv_quarantined
from flightcheck.verification.z3.encoding.kv_state import refuse_unencoded_connector
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import WF, kv_properties
from flightcheck.verification.z3.kv_invalid_engines import KV7, kv7_auxiliary, kv7_bmc, kv7_induction
from flightcheck.verification.z3.kv_models import KV_INVALID_K1
from flightcheck.verification.z3.profiles import profile_model
from tests.test_z3_kv import _cross_check, _reachable

FIXED = profile_model(KV_INVALID_K2, "vllm-0.34-invalid-kv-fixed")
MODELS = (KV_INVALID_K2, FIXED)


def _name(model) -> str:
    return model.name if "@" in model.name else f"{model.name}@{model.cfg.profile}"


def _kv7_states(model, count: int, seed: int = 0) -> list:
    """`count` reachable states where KV7's parts act: an invalid block, or a
    sync load's entry in flight (its failure enabled)."""
    states = [s for s in _reachable(model) if s.invalid_kv or any(e.external for b in s.in_flight for e in b)]
    return random.Random(seed).sample(states, min(count, len(states)))


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_relation_is_spec_step_on_sampled_kv7_states(model):
    report = _cross_check(model, _kv7_states(model, 6))
    assert report.problems == []
    assert report.edges > report.states


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_relation_is_spec_step_on_every_reachable_kv7_state(model):
    states = _reachable(model)
    report = _cross_check(model, states)
    assert report.problems == []
    assert report.states == len(states) > 300


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_model_reaches_every_part_the_encoding_adds(model):
    seen = set()
    for s in _reachable(model):
        seen.add("invalid block") if s.invalid_kv else None
        for action, nxt in concrete_successors(model, s):
            if isinstance(action, FailKvLoad):
                status = s.requests[action.req].status
                seen.add("running loader fails" if status is Status.RUNNING else "finished loader fails")
                if nxt.pool.labels != s.pool.labels:
                    seen.add("failure evicts")
            if any(e.external for e in (nxt.in_flight[-1] if nxt.in_flight else ())):
                seen.add("sync load scheduled")
            if s.invalid_kv and len(nxt.invalid_kv) < len(s.invalid_kv):
                seen.add("invalid block forgotten")
    want = {"invalid block", "running loader fails", "finished loader fails", "sync load scheduled",
            "invalid block forgotten"}
    assert seen >= want | ({"failure evicts"} if model is FIXED else set()), seen
    assert ("failure evicts" in seen) == (model is FIXED)       # vLLM's rule leaves the blocks cached


def test_what_the_encoding_leaves_out_is_still_refused():
    refuse_unencoded_connector(KV_INVALID_K2)
    fail_policy = dataclasses.replace(KV_INVALID_K2.cfg.kv_connector, load_failure_policy="fail")
    model = dataclasses.replace(KV_INVALID_K2, cfg=dataclasses.replace(KV_INVALID_K2.cfg, kv_connector=fail_policy,
                                                                       check_invalid_kv=False))
    with pytest.raises(ValueError, match="synchronous loads under the fail policy"):
        refuse_unencoded_connector(model)
    prompts = (dataclasses.replace(KV_INVALID_K2.prompts[0], load_async=True), KV_INVALID_K2.prompts[1])
    with pytest.raises(ValueError, match="asynchronous loads or a producer beside"):
        refuse_unencoded_connector(dataclasses.replace(KV_INVALID_K2, prompts=prompts))


class _StepTruth:
    """KV7's step formula on a concrete schedule edge (both frames encoded:
    exactly one of the formula and its negation is satisfiable)."""

    def __init__(self, model) -> None:
        self.system = System(model)
        self.step = self.system.step(0, 1)
        self.formula = self.system.build(kv7_no_compute_on_invalid_kv, self.step)
        self.solver = z3.SolverFor("QF_BV")
        self.solver.add(self.step.constraints)

    def __call__(self, s, nxt) -> bool:
        self.solver.push()
        self.solver.add(*self.system.encode(s, 0), *self.system.encode(nxt, 1), self.step.choices.act == SCHEDULE)
        holds, breaks = (self.solver.check(f) == z3.sat for f in (self.formula, z3.Not(self.formula)))
        self.solver.pop()
        assert holds != breaks, "the edge does not determine the formula"
        return holds


def _agreement(model, states) -> tuple[int, int]:
    """(schedule edges, KV7 breaches) once every edge and state agreed with the spec."""
    truth, edges, breaches = _StepTruth(model), 0, 0
    for s in states:
        kva10 = z3.simplify(truth.system.build(kva10_invalid_kv_quarantined, truth.system.constant(s)))
        assert z3.is_true(kva10) == quarantined(s, model.cfg), s
        for action, nxt in concrete_successors(model, s):
            if isinstance(action, Schedule):
                assert truth(s, nxt) == (not schedule_reads(s, nxt, model.cfg)), (s, nxt)
                edges, breaches = edges + 1, breaches + bool(schedule_reads(s, nxt, model.cfg))
    return edges, breaches


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_kv7_and_kva10_agree_with_the_spec_on_sampled_states(model):
    edges, _ = _agreement(model, _kv7_states(model, 12, seed=1))
    assert edges > 0


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_kv7_and_kva10_agree_with_the_spec_on_every_reachable_state(model):
    edges, breaches = _agreement(model, _reachable(model))
    assert edges > 70
    assert (breaches > 0) == (model is KV_INVALID_K2)        # vLLM 0.34 breaks KV7, the fix does not


def test_kv7_formula_is_false_on_the_last_step_of_the_searchs_counterexample():
    result = explicit.search(KV_INVALID_K2)
    violation = next(v for v in result.violations if v.property == "KV7_no_compute_on_invalid_kv")
    state, states = explicit.initial(KV_INVALID_K2), []
    for action, nxt in violation.path:
        states.append((state, action, nxt))
        state = nxt
    truth = _StepTruth(KV_INVALID_K2)
    before, action, after = states[-1]
    assert isinstance(action, Schedule) and schedule_reads(before, after, KV_INVALID_K2.cfg)
    assert not truth(before, after)
    assert all(truth(b, a) for b, act, a in states[:-1] if isinstance(act, Schedule))


def _conjuncts(model) -> list[str]:
    """The k-induction's candidates that hold on the model's reachable states:
    every one but A7 (under the fix a failure uncaches a block two holders
    share: an unlabelled block no longer private) and, under vLLM 0.34's
    rules, KVA10 (its blocks stay cached)."""
    dropped = {"candidate:A7_unlabelled_blocks_are_private"} | ({"KVA10_invalid_kv_quarantined"}
                                                                if model is KV_INVALID_K2 else set())
    return [n for n in [WF, *kv_properties(model), *kv7_auxiliary()] if n not in dropped]


def _conjuncts_hold(model, states) -> None:
    from flightcheck.spec import invariants_for
    from flightcheck.verification.z3.kv_engines import _on
    system, spec = System(model), {inv.name: inv for inv in invariants_for(model.cfg)}
    for s in states:
        frame = system.constant(s)
        for name in _conjuncts(model):
            truth = z3.is_true(z3.simplify(_on(system, name, frame)))
            assert truth == (spec[name].holds(s, model.cfg) if name in spec else True), (name, s)


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_induction_candidates_hold_on_sampled_kv7_states(model):
    _conjuncts_hold(model, _kv7_states(model, 8, seed=2))


@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_the_induction_candidates_hold_on_every_reachable_kv7_state(model):
    _conjuncts_hold(model, _reachable(model))


# --- the model k-induction proves KV7 on: kv-invalid-k2 with one stage ----------------

K1_MODELS = (profile_model(KV_INVALID_K1, "vllm-0.34"), profile_model(KV_INVALID_K1, "vllm-0.34-invalid-kv-fixed"))


def test_kv_invalid_k1_is_searched_exhaustively():
    """The smaller model is checked by exhaustive search too: vLLM 0.34 breaks
    KV7 by finding 7's run (the carrier completed before the sharer's
    schedule), the fix keeps every safety property."""
    from flightcheck.verification.results import SOMETIMES_NAMES
    found = {}
    for model in K1_MODELS:
        result = explicit.search(model)
        safety = [v for v in result.violations if v.property not in SOMETIMES_NAMES]
        found[model.cfg.profile] = (result.complete, result.num_states, result.num_edges, result.max_depth,
                                    [(v.property, [str(a).split(" (")[0] for a, _ in v.path]) for v in safety])
    assert found == {
        "vllm-0.34": (True, 104, 175, 10, [("KV7_no_compute_on_invalid_kv", [
            "arrive r0", "arrive r1", "schedule", "kv load failed r0 from block 0", "complete oldest", "abort r0",
            "schedule"])]),
        "vllm-0.34-invalid-kv-fixed": (True, 112, 178, 9, []),
    }


@pytest.mark.parametrize("model", K1_MODELS, ids=_name)
def test_the_relation_is_spec_step_on_sampled_kv_invalid_k1_states(model):
    assert _cross_check(model, _kv7_states(model, 4, seed=3)).problems == []


@pytest.mark.parametrize("model", K1_MODELS, ids=_name)
def test_the_relation_is_spec_step_on_every_reachable_kv_invalid_k1_state(model):
    states = _reachable(model)
    report = _cross_check(model, states)
    assert report.problems == [] and report.states == len(states) > 100


def test_k_induction_proves_kv7_on_kv_invalid_k1_under_the_fix():
    result = kv7_induction(K1_MODELS[1], 1)
    assert {p.name: p.status for p in result.properties} == \
        {name: "proved" for name in [WF, *kv_properties(K1_MODELS[1]), *kv7_auxiliary(), KV7]}


def test_under_vllm_0_34_kv7_is_not_proved_and_quarantined_not_inductive():
    """No vacuous proof: the same conjuncts under vLLM's rule leave KV7
    unproved (the solver's state reads an invalid block) and KVA10 falls
    under `fail_kv_load` (the blocks stay cached)."""
    rows = {p.name: p for p in kv7_induction(K1_MODELS[0], 1).properties}
    assert rows[KV7].status == "unknown" and rows["KVA10_invalid_kv_quarantined"].status == "unknown"
    assert "under action 5" in rows["KVA10_invalid_kv_quarantined"].message


def test_bmc_finds_finding_7_under_vllm_0_34_and_the_spec_replays_it():
    """kv7_bmc on kv-invalid-k1 under vLLM 0.34: KV7 broken at depth 7 (the
    trace replayed on the spec, which breaks KV7 on its last step: else
    ReplayMismatch), KVA10 at depth 3 (the first failure leaves the block
    cached); the connector's invariants bounded."""
    rows = {p.name: p for p in kv7_bmc(K1_MODELS[0], 7).properties}
    assert (rows[KV7].status, rows[KV7].depth) == ("violated", 7)
    assert [str(a).split(" (")[0] for a in rows[KV7].trace] == [
        "arrive r0", "arrive r1", "schedule", "kv load failed r0 from block 0", "abort r0", "complete oldest", "schedule"]
    assert (rows["KVA10_invalid_kv_quarantined"].status, rows["KVA10_invalid_kv_quarantined"].depth) == ("violated", 3)
    assert all(p.status == "bounded" for name, p in rows.items() if name.startswith(("WF", "KV1", "KV2", "KV4")))

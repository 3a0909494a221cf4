"""The priority policy beside streaming sessions in the Z3 encoding
(verification/z3/encoding/priority_state.py's stamps, priority_sessions.py,
priority_session_invariants.py) against the spec, and SS5's proof
(verification/z3/priority_session_engines.py; docs/proofs.md, "Streaming
sessions", "SS5 under the priority policy"):

* the policy beside sessions is encoded only where every session's
  priority is its own (`PRIO_SESSIONS`: two sessions, priorities 0 and 1);
  two sessions of one priority (`PRIO_SESSIONS_BREAK`, where vLLM's heap
  break is reachable) are refused, and the explicit search breaks SS5 there
  in 5 steps while it holds on `PRIO_SESSIONS`;
* the arrival order with a session named twice (an input stamped before it
  is taken) encodes and decodes to the spec's tuple;
* the transition relation is spec.step's on the model's states (every
  successor both ways): on a sample here, on every reachable state in the
  slow test;
* SS5's formula agrees with the spec's predicate on reachable states and on
  perturbed ones (a queue reversed), PS1 and PA1 hold on reachable states;
* k-induction proves SS5 (with PR1, SS2-SS4 and every auxiliary kept)
  under vllm-0.34 and vllm-0.33, BMC bounds it, and the verify rows name
  the model."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import pytest
import z3

from flightcheck.spec import invariants_for
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, reachable
from flightcheck.verification.z3.encoding.invariants import well_formed
from flightcheck.verification.z3.encoding.priority_invariants import pa1_arrived_iff_placed
from flightcheck.verification.z3.encoding.priority_session_invariants import (
    ps1_stamps_are_queued_inputs,
    ss5_session_queues_in_priority_order,
)
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.priority_session_engines import (
    SS5,
    SS5_BMC_DEPTH,
    ss5_bmc,
    ss5_induction,
    ss5_rows,
)
from flightcheck.verification.z3.session_models import PRIO_SESSIONS, PRIO_SESSIONS_BREAK, prio_sessions

STATES = 573


@functools.lru_cache(maxsize=None)
def _states() -> tuple:
    return tuple(reachable(PRIO_SESSIONS))


def _stamped() -> list:
    """Reachable states whose arrival order names a session twice."""
    return [s for s in _states() if len(set(s.arrivals)) < len(s.arrivals)]


def _both_holding() -> list:
    return [s for s in _states() if len(s.kv_holding) == 2]


def _holds(system: System, state, formula) -> bool:
    return z3.is_true(z3.simplify(system.build(formula, system.constant(state))))


def test_the_policy_beside_sessions_is_encoded_only_where_each_session_has_its_own_priority():
    assert [p.priority for p in PRIO_SESSIONS.prompts] == [0, 1]
    frame = System(PRIO_SESSIONS).frame(0)
    assert [len(row) for row in frame.prio[0].stamps] == [1, 1]      # one input each besides the end
    with pytest.raises(ValueError, match="priority another request shares"):
        System(PRIO_SESSIONS_BREAK)


def test_the_model_stamps_inputs_and_parks_both_sessions():
    assert len(_states()) == STATES
    assert len(_stamped()) == 232 and len(_both_holding()) == 54
    assert any(s.kv_holding == (0, 1) for s in _both_holding())


def test_an_arrival_order_naming_a_session_twice_round_trips():
    system = System(PRIO_SESSIONS)
    for s in random.Random(0).sample(_stamped(), 5):
        solver = z3.Solver()
        solver.add(system.encode(s, 0))
        assert solver.check() == z3.sat
        assert system.decode(solver.model(), 0) == s


def test_the_relation_is_spec_step_on_stamped_and_sampled_states():
    checker, report = CrossChecker(PRIO_SESSIONS), CrossReport()
    for s in random.Random(1).sample(_stamped(), 3) + _both_holding()[:1] + random.Random(2).sample(_states(), 2):
        checker.check(s, report)
    assert report.problems == [] and report.states == 6 and report.edges >= 6


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_the_relation_is_spec_step_on_every_reachable_state(profile):
    model = prio_sessions(profile)
    checker, report = CrossChecker(model), CrossReport()
    for s in (_states() if model is PRIO_SESSIONS else reachable(model)):
        checker.check(s, report)
    assert report.problems == [] and report.states == STATES


def test_ss5_agrees_with_the_spec_on_reachable_and_perturbed_states():
    system = System(PRIO_SESSIONS)
    spec = next(i for i in invariants_for(PRIO_SESSIONS.cfg) if i.name == SS5)
    states = list(random.Random(3).sample(_states(), 12)) + _both_holding()[:4]
    for s in states:
        assert _holds(system, s, ss5_session_queues_in_priority_order) and spec.holds(s, PRIO_SESSIONS.cfg)
        assert _holds(system, s, ps1_stamps_are_queued_inputs) and _holds(system, s, pa1_arrived_iff_placed)
    perturbed = [replace(s, kv_holding=s.kv_holding[::-1]) for s in _both_holding()[:4]]
    perturbed += [replace(s, waiting=s.waiting[::-1]) for s in _states() if len(s.waiting) == 2][:4]
    assert len(perturbed) == 8
    for s in perturbed:
        assert not spec.holds(s, PRIO_SESSIONS.cfg)
        assert not _holds(system, s, ss5_session_queues_in_priority_order) and _holds(system, s, well_formed)


@pytest.mark.slow
def test_ss5_ps1_pa1_and_wf_hold_on_every_reachable_state():
    system = System(PRIO_SESSIONS)
    for s in _states():
        for formula in (ss5_session_queues_in_priority_order, ps1_stamps_are_queued_inputs, pa1_arrived_iff_placed,
                        well_formed):
            assert _holds(system, s, formula), (formula.__name__, s)


@pytest.mark.slow
def test_the_explicit_search_keeps_ss5_on_the_model_and_breaks_it_where_two_sessions_share_a_priority():
    from flightcheck.verification.explicit.search import search
    kept = search(PRIO_SESSIONS)
    assert kept.complete and kept.num_states == STATES and not [v for v in kept.violations if v.path]
    broken = search(PRIO_SESSIONS_BREAK)
    lengths = {v.property: len(v.path) for v in broken.violations if v.path}
    assert lengths == {SS5: 5}


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_k_induction_proves_ss5_with_every_conjunct_kept(profile):
    result = ss5_induction(prio_sessions(profile))
    assert {p.name: p.status for p in result.properties if p.status != "proved"} == {}
    assert result.by_name()[SS5].status == "proved"


def test_the_ss5_rows_cover_the_synchronous_session_profiles_only():
    assert ss5_rows("vllm-0.34-async") == [] and ss5_rows("vllm-0.33-async") == [] and ss5_rows("vllm-0.8.5") == []
    assert prio_sessions("vllm-0.33").name == "prio-sessions-k1@vllm-0.33"


@pytest.mark.slow
def test_the_verify_rows_prove_and_bound_ss5_on_the_model():
    rows = {p.method: (p.status, p.depth) for p in ss5_rows("vllm-0.34")}
    where = f" [{PRIO_SESSIONS.name}]"
    assert rows == {"k-induction (k=1)" + where: ("proved", 1), "bmc" + where: ("bounded", SS5_BMC_DEPTH)}


@pytest.mark.slow
def test_past_the_guard_bmc_reaches_vllms_heap_break_on_two_sessions_of_one_priority(monkeypatch):
    """The guard is what keeps SS5 provable, not a blind spot of the
    encoding: let through, the encoding of PRIO_SESSIONS_BREAK (exact up to
    the first queue out of order) breaks SS5 at the explicit search's depth
    (both sessions park, the one at `kv_holding`'s head takes its input in place), and the
    trace replays on the spec, which breaks SS5 there too."""
    from flightcheck.verification.z3.encoding import priority_state
    monkeypatch.setattr(priority_state, "sessions_keys_distinct", lambda model: True)
    verdict = ss5_bmc(PRIO_SESSIONS_BREAK, 5).by_name()[SS5]
    assert (verdict.status, verdict.depth) == ("violated", 5)
    assert type(verdict.trace[-1]).__name__ == "SendInput"

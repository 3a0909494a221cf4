"""SS4 proved by k-induction beside a second request (docs/proofs.md,
"Streaming sessions"): on session-k2 (the session beside a plain request,
K = 2, sync) the Houdini loop keeps SS4 once SA10 is offered
(sa10_stale_preemption_leaves_a_seat in spec/session_invariants.py; Z3:
encoding/session_invariants.py, registered through SESSION_AUXILIARY), and
drops it without. SA10's formula agrees with the spec's predicate on the
states where its premise holds (session-pressure-k2, a session preempted
with deliver-mode stale output in flight) and on perturbed ones where it
breaks, and holds on every sampled state of session-k2."""

from __future__ import annotations

import functools
import random
from collections import deque
from dataclasses import replace

import pytest
import z3

from flightcheck.spec import Status, initial_state, invariants_for
from flightcheck.verification.explicit.search import successors
from flightcheck.verification.session_models import SESSION_PROFILE_MODELS
from flightcheck.verification.z3 import session_models as zs
from flightcheck.verification.z3.encoding.feature_formulas import AUXILIARY
from flightcheck.verification.z3.encoding.session_invariants import SESSION_FORMULAS
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.kv_engines import kv_induction
from flightcheck.verification.z3.session_engines import SESSION_PROPERTIES, session_auxiliary, session_induction, ss1_one_step

SA10, SS4 = "SA10_stale_preemption_leaves_a_seat", "SS4_waiting_session_keeps_seat"
PRESSURE = next(m for m in SESSION_PROFILE_MODELS["vllm-0.34"] if m.name.startswith("session-pressure-k2"))


@functools.lru_cache(maxsize=None)
def _reachable(model) -> tuple:
    root = initial_state(len(model.prompts), model.cfg.num_blocks)
    seen, frontier = {root: None}, deque([root])
    while frontier:
        for _, nxt in successors(model, frontier.popleft()):
            if nxt not in seen:
                seen[nxt] = None
                frontier.append(nxt)
    return tuple(seen)


def _premise(s) -> bool:
    return any(q.status is Status.PREEMPTED and q.num_stale > 0 and not q.drop_stale for q in s.requests)


def _agrees(model, states) -> list[bool]:
    system, spec = System(model), next(i for i in invariants_for(model.cfg) if i.name == SA10)
    out = []
    for s in states:
        try:
            term = system.constant(s)
        except NotRepresentable:
            continue
        want = spec.holds(s, model.cfg)
        assert z3.is_true(z3.simplify(system.build(AUXILIARY[SA10], term))) == want, s
        out.append(want)
    return out


def test_sa10_is_registered_as_a_session_auxiliary_invariant():
    assert SA10 in AUXILIARY and SA10 in session_auxiliary(zs.SESSION_K2.cfg) and SA10 not in SESSION_FORMULAS


def test_sa10_agrees_with_the_spec_where_its_premise_holds_and_where_it_breaks():
    held = [s for s in _reachable(PRESSURE) if _premise(s)]
    assert len(held) == 2 and _agrees(PRESSURE, held) == [True, True]
    # perturbed: the seats all counted (the session listed in `running` again), or a later batch
    # with an entry of the session, or the queue one batch short: each breaks SA10
    broken = []
    for s in held:
        r = next(r for r, q in enumerate(s.requests) if q.status is Status.PREEMPTED)
        broken += [replace(s, running=s.running + (r,)),
                   replace(s, in_flight=s.in_flight[:1] + tuple(b + (s.in_flight[0][0],) for b in s.in_flight[1:]
                                                                if s.in_flight[0][0].req == r)),
                   replace(s, in_flight=s.in_flight[:1])]
    verdicts = _agrees(PRESSURE, broken)
    assert verdicts == [False] * 6


def test_sa10_holds_on_sampled_states_of_session_k2():
    states = random.Random(0).sample(_reachable(zs.SESSION_K2), 15)
    assert all(_agrees(zs.SESSION_K2, states))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["vllm-0.34", "vllm-0.33"])
def test_k_induction_proves_ss4_beside_a_second_request_and_ss1_follows(profile: str):
    model = SESSION_PROFILE_MODELS[profile][0]
    assert model.name == f"session-k2@{profile}"
    result = session_induction(model)
    assert {p.name: p.status for p in result.properties if p.status != "proved"} == {}
    assert result.by_name()[SS4].status == result.by_name()[SA10].status == "proved"
    assert ss1_one_step(model, result).status == "proved"


@pytest.mark.slow
def test_without_sa10_the_houdini_loop_drops_ss4_on_session_k2():
    aux = [n for n in session_auxiliary(zs.SESSION_K2.cfg) if n != SA10]
    result = kv_induction(zs.SESSION_K2, 1, list(SESSION_PROPERTIES), aux)
    assert result.by_name()[SS4].status != "proved"
    assert {p.name for p in result.properties if p.status != "proved"} == {SS4}

"""The Z3 encoding of the KV connector (verification/z3/encoding/connector.py,
kv_schedule.py, kv_state.py, kv_invariants.py) against the spec, and the
proofs of KV1, KV2, KV4 on the connector models (verification/z3/kv_models.py):

* the transition relation is spec.step's on the connector models' states
  (every successor both ways, the Z3 action replaying on the spec): on a
  sample here, on every reachable state in the slow tests;
* each KV formula agrees with the spec's predicate of the same name, on
  reachable states and on perturbed ones where the predicates break;
* k-induction proves each KV invariant, BMC bounds them, and a seeded
  encoding bug (an aborted load's table freed at once) is found by BMC
  and refused by the replay on the spec."""

from __future__ import annotations

import dataclasses
import functools
import random
from collections import deque

import pytest
import z3

from flightcheck.spec import Status, invariants_for
from flightcheck.spec.state import Load
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.z3.encoding import connector
from flightcheck.verification.z3.encoding.crosscheck import CrossChecker, CrossReport, concrete_successors
from flightcheck.verification.z3.encoding.kv_invariants import KV_AUXILIARY, KV_FORMULAS
from flightcheck.verification.z3.encoding.state import NotRepresentable
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.encoding.terms import leaves
from flightcheck.verification.z3.kv_engines import kv_bmc, kv_induction, kv_properties
from flightcheck.verification.z3.kv_models import KV_ASYNC, KV_MODELS
from flightcheck.verification.z3.profiles import profile_model
from flightcheck.verification.z3.results import ReplayMismatch


@functools.lru_cache(maxsize=None)
def _reachable(model, limit: int | None = None) -> list:
    """Breadth-first over the spec with the connector's reports (the first `limit` states)."""
    root = explicit.initial(model)
    seen, frontier, out = {root}, deque([root]), []
    while frontier and (limit is None or len(out) < limit):
        s = frontier.popleft()
        out.append(s)
        for _, nxt in concrete_successors(model, s):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return out


def _sample(model, count: int, seed: int = 0) -> list:
    """`count` reachable states, spread over the whole graph."""
    states = _reachable(model)
    return random.Random(seed).sample(states, min(count, len(states)))


def _cross_check(model, states) -> CrossReport:
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    return report


@pytest.mark.parametrize("model", KV_MODELS + (profile_model(KV_ASYNC, "vllm-0.34"),), ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_sampled_connector_states(model):
    report = _cross_check(model, _sample(model, 4))
    assert report.problems == []
    assert report.edges > report.states


@pytest.mark.parametrize("model", KV_MODELS, ids=lambda m: m.name)
def test_the_relation_is_spec_step_on_every_reachable_connector_state(model):
    states = _reachable(model)
    report = _cross_check(model, states)
    assert report.problems == []
    assert report.states == len(states) > 1000


def test_the_models_exercise_every_part_of_the_encoding():
    """What a connector rule changes is reachable in the models, so the cross-check compares it."""
    seen = {name: False for name in ("parked", "landed", "failed", "held for a load", "held for a send",
                                     "two deferred frees", "preempted", "finished with an error")}
    for model in KV_MODELS:
        for s in _reachable(model):
            qs = s.requests
            seen["parked"] |= any(q.load is Load.IN_FLIGHT for q in qs)
            seen["landed"] |= any(q.load is Load.RECEIVED for q in qs)
            seen["failed"] |= any(q.load is Load.FAILED for q in qs)
            seen["held for a load"] |= any(q.held and q.load.in_transfer for q in qs)
            seen["held for a send"] |= any(q.held and not q.load.in_transfer for q in qs)
            seen["two deferred frees"] |= len(s.deferred_frees) >= 2
            seen["preempted"] |= any(q.status.value == "PREEMPTED" for q in qs)
            seen["finished with an error"] |= any(q.status.value == "FINISHED_ERROR" for q in qs)
    assert all(seen.values()), [name for name, hit in seen.items() if not hit]


class _Formulas:
    """The KV formulas evaluated on concrete states (substitution, no solving)."""

    def __init__(self, model):
        self.model, self.system = model, System(model)
        frame = self.system.frame(0)
        self.variables = [v for _, v in leaves(frame)]
        self.formulas = {n: self.system.build(f, frame) for n, f in {**KV_FORMULAS, **KV_AUXILIARY}.items()}

    def truth(self, state, name: str) -> bool:
        values = [v for _, v in leaves(self.system.constant(state))]
        return z3.is_true(z3.simplify(z3.substitute(self.formulas[name], *zip(self.variables, values))))


def _perturbed(state, rng: random.Random):
    """A state near `state` that the KV predicates may reject: a request's
    load, held flag, table or status changed, or the free queue given a held block."""
    r = rng.randrange(len(state.requests))
    q = state.requests[r]
    choice = rng.randrange(5)
    if choice == 4 and q.status is not Status.NEW:
        return state.with_request(r, status=Status.WAITING_FOR_REMOTE_KVS)
    if choice == 0:
        return state.with_request(r, load=rng.choice(list(Load)))
    if choice == 1:
        return state.with_request(r, held=not q.held)
    if choice == 2 and q.block_table:
        return state.with_request(r, block_table=q.block_table[:-1])
    held = [b for b in range(len(state.pool.ref_counts)) if b not in state.pool.free_queue]
    if not held:
        return state
    pool = dataclasses.replace(state.pool, free_queue=state.pool.free_queue + (rng.choice(held),))
    return dataclasses.replace(state, pool=pool)


@pytest.mark.parametrize("model", KV_MODELS, ids=lambda m: m.name)
def test_each_kv_formula_agrees_with_the_spec_predicate(model):
    formulas, rng = _Formulas(model), random.Random(1)
    spec = {inv.name: inv for inv in invariants_for(model.cfg)}
    broken = {name: 0 for name in kv_properties(model)}
    states = _sample(model, 25)
    for s in states + [_perturbed(s, rng) for s in states for _ in range(2)]:
        try:
            formulas.system.constant(s)
        except NotRepresentable:
            continue
        for name in kv_properties(model):
            assert formulas.truth(s, name) == spec[name].holds(s, model.cfg), (name, s)
            broken[name] += not spec[name].holds(s, model.cfg)
    assert all(broken.values()), broken         # the perturbations break each one somewhere


@pytest.mark.parametrize("model", KV_MODELS, ids=lambda m: m.name)
def test_the_auxiliary_invariants_hold_on_reachable_states(model):
    formulas = _Formulas(model)
    for s in _sample(model, 30):
        for name in KV_AUXILIARY:
            assert formulas.truth(s, name), (name, s)


@pytest.mark.parametrize("model", KV_MODELS, ids=lambda m: m.name)
def test_k_induction_proves_each_kv_invariant(model):
    result = kv_induction(model, k=1)
    rows = result.by_name()
    assert {name: rows[name].status for name in kv_properties(model)} == \
        {name: "proved" for name in kv_properties(model)}
    assert rows["WF_encoding"].status == "proved"


def test_bmc_bounds_the_kv_invariants():
    result = kv_bmc(KV_ASYNC, 3)
    assert [(p.name, p.status, p.depth) for p in result.properties] == \
        [(name, "bounded", 3) for name in ("WF_encoding", *kv_properties(KV_ASYNC))]


def test_a_seeded_encoding_bug_is_found_by_bmc_and_refused_by_the_replay(monkeypatch):
    """The encoding mutated to free a finishing request's table even when it
    is held (vLLM #32255's early free: an aborted load's blocks back in the
    free queue while the load still writes them): BMC reaches a KV1
    violation three steps in (arrive, park, abort), and its trace does not
    replay on the spec, so the engine refuses it."""
    real = connector.release_table

    def frees_held_tables(layout, s, r, table, table_len, when=True):
        return real(layout, s, r, table, table_len)

    monkeypatch.setattr(connector, "release_table", frees_held_tables)
    with pytest.raises(ReplayMismatch, match="step 3 \\(abort r0\\)"):
        kv_bmc(KV_ASYNC, 3, ["KV1_no_reuse_under_transfer"])

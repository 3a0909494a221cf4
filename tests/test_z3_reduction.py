"""The BMC reductions of verification/z3/bmc/reduction.py are sound on the models
they are used on: every order the peephole rules drop commutes (the kept order
is enabled and ends in the same state) at every reachable state, the rules do
drop something, twins are interchangeable, and reduced BMC agrees with plain
BMC."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import z3

from flightcheck.spec import State, step
from flightcheck.verification import models
from flightcheck.verification.explicit.search import search, successors
from flightcheck.verification.z3.bmc.engine import BmcOptions, bmc, default_properties
from flightcheck.verification.z3.encoding.crosscheck import reachable
from flightcheck.verification.z3.bmc.reduction import StepPair, forbidden, twins
from flightcheck.verification.z3.encoding.system import ACTION_CODE, System
from flightcheck.verification.z3.encoding.terms import V


def _code(action) -> tuple[int, int]:
    """(Choices.act, Choices.req) of a spec action; req is 0 where unused, as the encoding writes it."""
    return ACTION_CODE[type(action)], getattr(action, "req", 0)


RULE_KINDS = {("Abort", "Arrive"), ("CompleteOldest", "Arrive"), ("Abort", "Abort"), ("Abort", "CompleteOldest"),
              ("CompleteOldest", "Schedule"), ("Schedule", "Arrive")}


# Rules that find nothing to drop in a model: pressure-k2 and one-batch never leave
# a request waiting behind a schedule when another arrives; the complete-schedule
# rule is for continue_prefill only.
IDLE_RULES = {
    models.PRESSURE_K2.name: {("Schedule", "Arrive")},
    models.SHARED_K3.name: set(),
    models.ONE_BATCH.name: {("CompleteOldest", "Schedule"), ("Schedule", "Arrive")},
}


@pytest.mark.parametrize("model", [models.PRESSURE_K2, models.SHARED_K3, models.ONE_BATCH], ids=lambda m: m.name)
def test_every_dropped_order_commutes_at_every_reachable_state(model):
    idle_rules = IDLE_RULES[model.name]
    system = System(model)
    consts: dict[State, object] = {}

    def const(s: State):
        if s not in consts:
            consts[s] = system.constant(s)
        return consts[s]

    dropped, kept = Counter(), Counter()
    for s in reachable(model):
        for a, t in successors(model, s):
            for b, u in successors(model, t):
                kinds = (type(a).__name__, type(b).__name__)
                if kinds not in RULE_KINDS:
                    continue
                (aa, ar), (ba, br) = _code(a), _code(b)
                rule = system.build(lambda layout: forbidden(layout, StepPair(V(aa), V(ar), V(ba), V(br),
                                                                              const(s), const(t), const(u))))
                verdict = z3.simplify(rule)
                assert z3.is_true(verdict) or z3.is_false(verdict), verdict
                if z3.is_false(verdict):
                    kept[kinds] += 1
                    continue
                dropped[kinds] += 1
                other = step(s, model.cfg, b)
                assert other is not None, f"{a}; {b} dropped, but {b} is disabled at\n{s}"
                assert step(other, model.cfg, a) == u, f"{a}; {b} dropped, but {b}; {a} ends elsewhere from\n{s}"
    # every rule but the model's idle ones drops some order here, and the guarded ones keep some too
    assert set(dropped) == RULE_KINDS - idle_rules, dropped
    guarded = [("Abort", "CompleteOldest"), ("Abort", "Abort"), ("CompleteOldest", "Schedule"), ("Schedule", "Arrive")]
    assert all(kept[k] > 0 for k in guarded if k not in idle_rules), kept


def _rename(s: State, r0: int, r1: int, n: int) -> State:
    """s with requests r0 and r1 swapped, their private block labels with them."""
    def ren(r: int) -> int:
        return {r0: r1, r1: r0}.get(r, r)

    private = {}
    for i in range(len(s.pool.labels)):      # spec.state.content_label of (r, i), past the prompt
        private[-(1 + r0 + n * i)] = -(1 + r1 + n * i)
        private[-(1 + r1 + n * i)] = -(1 + r0 + n * i)
    reqs = list(s.requests)
    reqs[r0], reqs[r1] = reqs[r1], reqs[r0]
    in_flight = tuple(tuple(replace(e, req=ren(e.req)) for e in batch) for batch in s.in_flight)
    pool = replace(s.pool, labels=tuple(private.get(lab, lab) for lab in s.pool.labels))
    return replace(s, requests=tuple(reqs), waiting=tuple(map(ren, s.waiting)),
                   running=tuple(map(ren, s.running)), in_flight=in_flight, pool=pool,
                   scheduled_ids=frozenset(map(ren, s.scheduled_ids)))


def test_twins_are_interchangeable_at_every_reachable_state():
    """Renaming shared-k3's twins maps the reachable states onto themselves and
    each state's successors onto the renamed state's successors."""
    model = models.SHARED_K3
    assert twins(model) == [(0, 1)]
    states = set(reachable(model))
    n = model.num_requests
    for s in states:
        s2 = _rename(s, 0, 1, n)
        assert s2 in states
        assert {_rename(t, 0, 1, n) for _, t in successors(model, s)} == {t for _, t in successors(model, s2)}


def test_reduced_bmc_reaches_every_target_at_its_breadth_first_depth():
    """Shortest paths survive the reductions: each "sometimes" target of
    shared-k3 is reached at the depth breadth-first search first reaches it
    (the preempted request that resumes and finishes at 9 steps)."""
    model = models.SHARED_K3
    shortest = search(model).reached
    res = bmc(model, max(shortest.values()), BmcOptions(properties=[], reduce=True))
    assert {p.name: p.depth for p in res.properties if p.status == "reached"} == shortest


@pytest.mark.slow
def test_reduced_bmc_reaches_depth_eight_with_every_feature_on():
    """Every property bounded to depth 8 on shared-k3 within 10 minutes (270 s
    on 2026-12-03; benchmarks/bmc_depth.py --reduce reached depth 9 in 567 s)."""
    res = bmc(models.SHARED_K3, 8, BmcOptions(sometimes=[], time_budget=600, reduce=True))
    assert res.depth == 8
    assert [p.status for p in res.properties] == ["bounded"] * len(default_properties()), res.properties


def test_reduction_is_refused_for_a_mutant():
    with pytest.raises(ValueError, match="mutant"):
        bmc(models.mutant_model("shared_snapshot"), 2, BmcOptions(reduce=True))

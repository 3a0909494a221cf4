"""The Z3 encoding of vllm-0.33-async (issue 22): output placeholders, the
decode countdown, the queue of K + 1 batches, the max_tokens guard,
num_new_tokens with placeholders, their reset on preemption and settlement at
completion, and block hashing on output. The cross-check compares the
encoding's transition relation with the spec's, both ways, on states of the
profile's own models met by seeded random walks, chosen so that each async
rule is in play (the controls below)."""

from __future__ import annotations

import pytest

from flightcheck.spec import State
from flightcheck.verification.models import PROFILE_MODELS
from flightcheck.verification.z3.encoding.crosscheck import (CrossChecker, CrossReport, random_walk_states,
                                                             reachable)
from flightcheck.verification.z3.encoding.state import Layout
from flightcheck.verification.z3.profiles import ENCODED_PROFILES, profile_model

ASYNC = "vllm-0.33-async"
ASYNC_MODELS = PROFILE_MODELS[ASYNC]


def _held_by_max_tokens_guard(s: State, r: int) -> bool:
    """spec.schedule._placeholders_reach_max_tokens on a RUNNING request."""
    q = s.requests[r]
    return q.placeholders > 0 and q.num_computed + 2 - q.placeholders >= q.prompt_len + q.max_tokens


def _async_states(model, count: int = 30) -> list[State]:
    """`count` random-walk states of `model` where the async rules bite (a
    request with placeholders, or counting down), and 10 others."""
    walk = random_walk_states(model, 400, seed=11)
    busy = [s for s in walk if any(q.placeholders or q.decode_countdown for q in s.requests)]
    calm = [s for s in walk if s not in set(busy)]
    return busy[:count] + calm[:10]


def test_the_async_profile_is_encoded():
    assert ASYNC in ENCODED_PROFILES
    layout = Layout.of(ASYNC_MODELS[0])
    assert layout.K == ASYNC_MODELS[0].cfg.num_stages + 1      # the queue holds K + 1 batches


@pytest.mark.parametrize("model", ASYNC_MODELS, ids=lambda m: m.name)
def test_relation_equals_spec_on_random_states_of_the_async_models(model):
    checker, report = CrossChecker(model), CrossReport()
    for s in _async_states(model):
        checker.check(s, report)
    assert report.problems == []
    assert report.states == 40 and report.edges > report.states


def test_the_cross_checked_states_exercise_every_async_rule():
    """Control for the cross-check: among its states, a request with two
    placeholder groups in flight, one counting down, one the max_tokens guard
    holds back, one with drafts among its placeholders (spec decode), and a
    full queue of K + 1 batches."""
    states = [(m, s) for m in ASYNC_MODELS for s in _async_states(m)]
    assert any(sum(1 for b in s.in_flight for e in b if e.req == r and e.samples) >= 2 and q.placeholders >= 2
               for _, s in states for r, q in enumerate(s.requests))
    assert any(q.decode_countdown > 0 for _, s in states for q in s.requests)
    assert any(_held_by_max_tokens_guard(s, r) for _, s in states for r in s.running)
    assert any(any(e.drafts for b in s.in_flight for e in b if e.samples) for m, s in states
               if m.cfg.num_spec_tokens)
    assert any(len(s.in_flight) == m.cfg.num_stages + 1 for m, s in states)


@pytest.mark.slow
def test_relation_equals_spec_on_every_reachable_state_of_async_drafts_k2():
    """Every reachable state of the async model with spec decode and prefix
    caching (1,302 states; minutes)."""
    model = next(m for m in ASYNC_MODELS if m.name == "async-drafts-k2")
    states = list(reachable(model))
    checker, report = CrossChecker(model), CrossReport()
    for s in states:
        checker.check(s, report)
    assert report.problems == [] and report.states == len(states)


def test_a_sync_model_under_the_async_profile_is_cross_checked_too():
    """profile_model carries a sync model into the async profile (the verify
    model's route): its relation is the spec's as well."""
    from flightcheck.verification import models
    model = profile_model(models.SHARED_K3, ASYNC)
    checker, report = CrossChecker(model), CrossReport()
    for s in random_walk_states(model, 25, seed=5):
        checker.check(s, report)
    assert report.problems == []


# -- the async invariants as formulas (spec.invariants.ASYNC_REPLACEMENTS, ASYNC_INVARIANTS) --

def _disagreements(model, states) -> list[str]:
    """Every encoded invariant of the profile against the spec's predicate."""
    import z3
    from flightcheck.spec import invariants_for
    from flightcheck.verification.z3.encoding.invariants import (
        ASYNC_UNENCODED,
        invariant_formulas_for,
        well_formed,
    )
    from flightcheck.verification.z3.encoding.system import System
    system = System(model)
    frame = system.frame(0)
    sched, defs = system.sched(0)
    formulas = {n: system.build(f, frame, sched) for n, f in invariant_formulas_for(model.cfg).items()}
    wf = system.build(well_formed, frame)
    solver, bad = z3.Solver(), []
    solver.add(defs)
    for s in states:
        solver.push()
        solver.add(system.encode(s, 0))
        assert solver.check() == z3.sat
        m = solver.model()
        solver.pop()
        assert z3.is_true(m.eval(wf, model_completion=True)), s
        for inv in invariants_for(model.cfg):
            if inv.name in ASYNC_UNENCODED:
                continue
            if inv.holds(s, model.cfg) != z3.is_true(m.eval(formulas[inv.name], model_completion=True)):
                bad.append(f"{inv.name} disagrees on {s}")
    return bad


def _perturbed(model, states, count: int, seed: int) -> list[State]:
    """States off the invariants: a placeholder count, a countdown, an entry's
    sampling flag, drafts, start or length, or num_computed nudged."""
    import dataclasses
    import random
    rng, out = random.Random(seed), []
    while len(out) < count:
        s = rng.choice(states)
        reqs = list(s.requests)
        r = rng.randrange(len(reqs))
        q = reqs[r]
        choice = rng.randrange(4)
        if choice == 0:
            reqs[r] = dataclasses.replace(q, placeholders=max(0, q.placeholders + rng.choice([-1, 1])))
        elif choice == 1:
            reqs[r] = dataclasses.replace(q, decode_countdown=rng.randrange(model.cfg.stagger + 1))
        elif choice == 2:
            reqs[r] = dataclasses.replace(q, num_computed=max(0, q.num_computed + rng.choice([-1, 1])))
        else:
            full = [k for k, b in enumerate(s.in_flight) if b]
            if not full:
                continue
            k = rng.choice(full)
            batch = list(s.in_flight[k])
            j = rng.randrange(len(batch))
            e = batch[j]
            batch[j] = rng.choice([dataclasses.replace(e, samples=not e.samples), dataclasses.replace(e, n=e.n + 1),
                                   dataclasses.replace(e, start=max(0, e.start - 1)),
                                   dataclasses.replace(e, drafts=rng.randrange(model.cfg.num_spec_tokens + 2))])
            out.append(dataclasses.replace(s, in_flight=s.in_flight[:k] + (tuple(batch),) + s.in_flight[k + 1:]))
            continue
        out.append(dataclasses.replace(s, requests=tuple(reqs)))
    return out


@pytest.mark.parametrize("model", ASYNC_MODELS, ids=lambda m: m.name)
def test_async_invariant_formulas_agree_with_the_spec(model):
    """On random-walk states (where they hold) and on perturbed ones (where
    they often fail: the count of failures is the control)."""
    from flightcheck.spec import invariants_for
    states = random_walk_states(model, 120, seed=7)
    assert _disagreements(model, states) == []
    off = _perturbed(model, states, 120, seed=3)
    assert _disagreements(model, off) == []
    broken = {inv.name for s in off for inv in invariants_for(model.cfg) if not inv.holds(s, model.cfg)}
    assert {"IA1_placeholders", "S3a_async_coverage", "S6p_async_decode_gating"} <= broken


# -- the engines under async -------------------------------------------------------

def test_bmc_bounds_every_encoded_async_property_on_async_k3():
    """BMC of async-k3 (K = 3, queue of 4) to depth 4: every state invariant
    the profile keeps (L2 under async excepted: not encoded) and every
    transition property holds on every path, IA1, IA2, S3a, S5a, S6p among them."""
    from flightcheck.spec import invariants_for
    from flightcheck.verification.z3.bmc.engine import BmcOptions, bmc, default_properties
    from flightcheck.verification.z3.encoding.invariants import ASYNC_UNENCODED
    model = next(m for m in ASYNC_MODELS if m.name == "async-k3")
    res = bmc(model, 4, BmcOptions(sometimes=()))
    rows = res.by_name()
    assert set(rows) == set(default_properties(model.cfg))
    assert {i.name for i in invariants_for(model.cfg)} - set(rows) == ASYNC_UNENCODED
    assert {"IA1_placeholders", "IA2_placeholders_within_max_tokens", "S3a_async_coverage",
            "S5a_async_sampling", "S6p_async_decode_gating"} <= set(rows)
    assert res.depth == 4 and all(v.status == "bounded" for v in rows.values()), rows


# -- the auxiliary invariants of async k-induction (z3.induction.strengthening) --------

def _a12_holds(s: State, cfg) -> bool:
    """A12 on a spec state: every in-flight entry, whatever its fate, starts and has a length within max_model_len."""
    return all(e.start <= cfg.max_model_len and e.n <= cfg.max_model_len for b in s.in_flight for e in b)


def _a6a_holds(s: State, cfg) -> bool:
    """A6 as restated under async with spec decode: every request proposes 0..k drafts."""
    return all(0 <= q.num_drafts <= cfg.num_spec_tokens for q in s.requests)


def _a6_sync_holds(s: State) -> bool:
    """The sync A6: a request with live entries in flight proposes its last live entry's drafts."""
    from flightcheck.spec import Fate
    for r, q in enumerate(s.requests):
        mine = [e for b in s.in_flight for e in b if e.req == r and e.fate == Fate.LIVE]
        if mine and q.num_drafts != mine[-1].drafts:
            return False
    return True


@pytest.mark.parametrize("model", ASYNC_MODELS, ids=lambda m: m.name)
def test_every_reachable_async_state_satisfies_the_async_auxiliary_invariants(model):
    """A12 and A6's async form, restated on spec states, hold on every
    reachable state of the profile's three models (their exhaustive
    searches: 21,554, 1,302 and 3,875 states); the Z3 formulas of every
    auxiliary invariant k-induction assumes under the profile agree with the
    restatements and hold on the first 300 states of each."""
    import z3
    from flightcheck.verification.z3.encoding.system import System
    from flightcheck.verification.z3.induction.strengthening import AUXILIARY, auxiliary_for
    states = list(reachable(model))
    assert len(states) > 1000
    assert [s for s in states if not _a12_holds(s, model.cfg)] == []
    assert [s for s in states if not _a6a_holds(s, model.cfg)] == []
    system = System(model)
    frame = system.frame(0)
    _, defs = system.sched(0)
    names = auxiliary_for(model.cfg)
    assert "A12_snapshots_within_the_model_length" in names
    formulas = {name: system.build(AUXILIARY[name], frame) for name in names}
    solver, failing = z3.Solver(), []
    solver.add(defs)
    for s in states[:300]:
        solver.push()
        solver.add(system.encode(s, 0))
        assert solver.check() == z3.sat
        m = solver.model()
        solver.pop()
        failing += [f"{name} fails on reachable {s}" for name, f in formulas.items()
                    if not z3.is_true(m.eval(f, model_completion=True))]
    assert failing == []


def test_the_sync_a6_is_false_under_async_with_spec_decode():
    """Why A6 is restated under async: on async-drafts-k2 a reachable state
    has a request whose proposals differ from the drafts of its last live
    entry (an older decode's output came back after a younger one was
    scheduled), so the sync A6 cannot be assumed there."""
    model = next(m for m in ASYNC_MODELS if m.name == "async-drafts-k2")
    assert any(not _a6_sync_holds(s) for s in reachable(model))


def test_k_induction_proves_every_encoded_async_property_on_async_drop_k2():
    """The quick async proof (k = 1, the auxiliary invariants of
    auxiliary_for, A12 among them): every invariant the profile encodes, IA1,
    IA2, S3a, S5a, S6' and IF1-IF3 among them, and the transition properties,
    on drop mode with spec decode, K = 2 (a queue of 3). shared-k3 under the
    profile, verify's model, is the slow test in test_z3_engines.py."""
    from flightcheck.verification.z3.encoding.transitions import spec_properties_for
    from flightcheck.verification.z3.induction.kinduction import prove_by_induction
    model = next(m for m in ASYNC_MODELS if m.name == "async-drop-k2")
    res = prove_by_induction(model, jobs=2)
    assert [p.name for p in res.properties if p.status != "proved"] == []
    proved = {p.name for p in res.properties}
    assert set(spec_properties_for(model.cfg)) <= proved
    assert {"IA1_placeholders", "IA2_placeholders_within_max_tokens", "S6p_async_decode_gating",
            "IF2_stale_counter", "A12_snapshots_within_the_model_length"} <= proved


@pytest.mark.slow
@pytest.mark.parametrize("name", ["async-k3", "async-drafts-k2"])
def test_k_induction_proves_every_encoded_async_property_on_the_other_async_models(name):
    from flightcheck.verification.z3.induction.kinduction import prove_by_induction
    model = next(m for m in ASYNC_MODELS if m.name == name)
    res = prove_by_induction(model, jobs=2)
    assert [p.name for p in res.properties if p.status != "proved"] == []


def test_without_a12_schedule_breaks_the_stale_counter_with_a_cti():
    """The control for A12: with every other conjunct assumed, `schedule` can
    break IF2 on async-drop-k2 unless A12 is assumed too (the first
    counterexample to induction: orphaned entries whose lengths wrap the
    bit-vector sum); with A12 it cannot."""
    import z3
    from flightcheck.verification.z3.encoding.actions import SCHEDULE
    from flightcheck.verification.z3.encoding.invariants import invariant_formulas_for
    from flightcheck.verification.z3.encoding.system import System
    from flightcheck.verification.z3.induction.step import k_induction
    from flightcheck.verification.z3.induction.strengthening import auxiliary_for
    model = next(m for m in ASYNC_MODELS if m.name == "async-drop-k2")
    system = System(model)
    names = ["WF_encoding", *invariant_formulas_for(model.cfg), *auxiliary_for(model.cfg)]
    step = k_induction(system, 1, names)
    query = next(q for q in step.queries if q.action == SCHEDULE)
    without = [name for name in names if name != "A12_snapshots_within_the_model_length"]
    assert query.check("IF2_stale_counter", step.assumptions(without)) == z3.sat
    assert query.check("IF2_stale_counter", step.assumptions(names)) == z3.unsat


# -- the async targets as Z3 cover formulas (z3.encoding.sometimes.ASYNC_SOMETIMES_FORMULAS) --

@pytest.mark.parametrize("model", ASYNC_MODELS, ids=lambda m: m.name)
def test_async_target_formulas_agree_with_the_spec_on_reachable_states(model):
    """decode_behind_decode and stopped_with_output_in_flight as formulas
    agree with the spec's predicates on the first 800 states of a
    breadth-first search, among which each target is both true and false
    (the control)."""
    import z3
    from flightcheck.spec.sometimes import ASYNC_SOMETIMES
    from flightcheck.verification.z3.encoding.sometimes import ASYNC_SOMETIMES_FORMULAS
    from flightcheck.verification.z3.encoding.system import System
    system = System(model)
    frame = system.frame(0)
    formulas = {name: system.build(f, frame) for name, f in ASYNC_SOMETIMES_FORMULAS.items()}
    assert set(formulas) == {t.name for t in ASYNC_SOMETIMES}
    solver, seen, bad = z3.Solver(), set(), []
    for s in reachable(model, limit=800):
        solver.push()
        solver.add(system.encode(s, 0))
        assert solver.check() == z3.sat
        m = solver.model()
        solver.pop()
        for target in ASYNC_SOMETIMES:
            spec = any(target.target(s, model.cfg, r) for r in range(model.num_requests))
            seen.add((target.name, spec))
            if spec != z3.is_true(m.eval(formulas[target.name], model_completion=True)):
                bad.append(f"{target.name} disagrees on {s}")
    assert bad == []
    assert seen == {(target.name, value) for target in ASYNC_SOMETIMES for value in (True, False)}


def test_bmc_covers_the_async_targets_on_async_drop_k2():
    """Both async targets reached by BMC cover queries (asked by name), each
    confirmed by the spec's predicate on the trace and at the depth the
    exhaustive search first reaches it (4 and 5: shortest-first)."""
    from flightcheck.verification.z3.bmc.engine import BmcOptions, bmc
    model = next(m for m in ASYNC_MODELS if m.name == "async-drop-k2")
    res = bmc(model, 5, BmcOptions(properties=(), sometimes=("decode_behind_decode", "stopped_with_output_in_flight"),
                                   reduce=True))
    rows = res.by_name()
    assert {name: (row.status, row.depth) for name, row in rows.items()} == {
        "decode_behind_decode": ("reached", 4), "stopped_with_output_in_flight": ("reached", 5)}

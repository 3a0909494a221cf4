"""Every Z3 formula of an invariant, a transition property or a "sometimes"
target agrees with the spec's Python predicate of the same name, on
reachable states, on states of mutants (where invariants break) and on
randomly perturbed states; the auxiliary invariants hold on reachable states."""

from __future__ import annotations

import dataclasses
import random

import pytest
import z3

from flightcheck.spec import (INVARIANTS, SOMETIMES, TRANSITION_PROPERTIES, Abort, Arrive, CompleteOldest,
                              Config, Fate, Prompt, Schedule, State, invariants_for)
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification import models
from flightcheck.verification.mutants import applied
from flightcheck.verification.z3.encoding.actions import ABORT, ARRIVE, COMPLETE, SCHEDULE
from flightcheck.verification.z3.encoding.crosscheck import random_walk_states, reachable
from flightcheck.verification.z3.encoding.invariants import (
    COUNTER_FORMULAS,
    invariant_formulas_for,
    well_formed,
)
from flightcheck.verification.z3.encoding.sometimes import (
    SCHEDULE_SOMETIMES_FORMULAS,
    SOMETIMES_FORMULAS,
    VERIFICATION_SOMETIMES,
)
from flightcheck.verification.z3.encoding.transitions import TRANSITION_FORMULAS
from flightcheck.verification.z3.induction.strengthening import AUXILIARY
from flightcheck.verification.z3.encoding.system import System
from flightcheck.verification.z3.profiles import DEFERRAL_MODEL, profile_model

SLOW = pytest.mark.slow
CODE = {Arrive: ARRIVE, Schedule: SCHEDULE, CompleteOldest: COMPLETE, Abort: ABORT}


class Evaluator:
    """Truth values of the Z3 formulas on concrete states (one solve per state)."""

    def __init__(self, model):
        self.model = model
        self.system = System(model)
        self.frame = self.system.frame(0)
        sched, defs = self.system.sched(0)
        self.invariants = {n: self.system.build(f, self.frame, sched)
                           for n, f in invariant_formulas_for(model.cfg).items()}
        self.auxiliary = {n: self.system.build(f, self.frame) for n, f in AUXILIARY.items()}
        self.wf = self.system.build(well_formed, self.frame)
        self.sometimes = {n: self.system.build(f, self.frame) for n, f in SOMETIMES_FORMULAS.items()}
        self.solver = z3.Solver()
        self.solver.add(defs)
        self.step = self.system.step(0, 1)
        self.step_solver = z3.Solver()
        self.step_solver.add(self.step.constraints)
        self.transition = {n: self.system.build(f, self.step) for n, f in TRANSITION_FORMULAS.items()}

    def state(self, s: State, ghost=None) -> z3.ModelRef:
        self.solver.push()
        self.solver.add(self.system.encode(s, 0, ghost))
        assert self.solver.check() == z3.sat
        m = self.solver.model()
        self.solver.pop()
        return m

    def edge(self, s: State, action, t: State) -> z3.ModelRef:
        self.step_solver.push()
        self.step_solver.add(self.system.encode(s, 0) + self.system.encode(t, 1))
        self.step_solver.add(self.step.choices.act == CODE[type(action)])
        assert self.step_solver.check() == z3.sat
        m = self.step_solver.model()
        self.step_solver.pop()
        return m


def _truth(m, f) -> bool:
    return z3.is_true(m.eval(f, model_completion=True))


def perturb(s: State, rng: random.Random, cfg) -> State:
    """One random small change that keeps the state representable."""
    reqs = list(s.requests)
    choice = rng.randrange(8)
    r = rng.randrange(len(reqs))
    if choice == 0:
        reqs[r] = dataclasses.replace(reqs[r], num_computed=max(0, reqs[r].num_computed + rng.choice([-1, 1])))
    elif choice == 1:
        reqs[r] = dataclasses.replace(reqs[r], num_output=max(0, reqs[r].num_output + rng.choice([-1, 1])))
    elif choice == 2:
        reqs[r] = dataclasses.replace(reqs[r], num_drafts=rng.randrange(cfg.num_spec_tokens + 2))
    elif choice == 3 and any(s.in_flight):
        k = rng.choice([i for i, b in enumerate(s.in_flight) if b])   # vLLM 0.33's empty batches have no entry
        batch = list(s.in_flight[k])
        j = rng.randrange(len(batch))
        e = batch[j]
        batch[j] = rng.choice([dataclasses.replace(e, fate=rng.choice(list(Fate))),
                               dataclasses.replace(e, samples=not e.samples),
                               dataclasses.replace(e, n=e.n + 1),
                               dataclasses.replace(e, start=max(0, e.start - 1)),
                               dataclasses.replace(e, drafts=rng.randrange(cfg.num_spec_tokens + 2))])
        return dataclasses.replace(s, in_flight=s.in_flight[:k] + (tuple(batch),) + s.in_flight[k + 1:])
    elif choice == 4:
        refs = list(s.pool.ref_counts)
        b = rng.randrange(len(refs))
        refs[b] = max(0, refs[b] + rng.choice([-1, 1]))
        return dataclasses.replace(s, pool=dataclasses.replace(s.pool, ref_counts=tuple(refs)))
    elif choice == 5 and s.pool.free_queue:
        free = list(s.pool.free_queue)
        free.pop(rng.randrange(len(free)))
        return dataclasses.replace(s, pool=dataclasses.replace(s.pool, free_queue=tuple(free)))
    elif choice == 6:
        labels = list(s.pool.labels)
        b = rng.randrange(len(labels))
        labels[b] = rng.choice([None, 7, -1, -2])
        # the duplicates list keeps only labels still cached twice, in label
        # order (any other list is not representable: state.copy_ranks)
        still = [x for x in s.pool.duplicates if labels[x] is not None and labels.count(labels[x]) >= 2]
        duplicates = tuple(sorted(still, key=lambda x: labels[x]))
        return dataclasses.replace(s, pool=dataclasses.replace(s.pool, labels=tuple(labels), duplicates=duplicates))
    elif choice == 7 and len(s.waiting) + len(s.running) < len(reqs):
        status = reqs[r].status
        return dataclasses.replace(s, running=s.running + (r,)) if status.is_active else s
    return dataclasses.replace(s, requests=tuple(reqs))


def perturb_counters(s: State, rng: random.Random) -> State:
    """One random change of a request's vLLM 0.33 counters."""
    reqs = list(s.requests)
    r = rng.randrange(len(reqs))
    q = reqs[r]
    reqs[r] = rng.choice([dataclasses.replace(q, num_in_flight=max(0, q.num_in_flight + rng.choice([-1, 1]))),
                          dataclasses.replace(q, num_stale=q.num_stale + rng.choice([-1, 1])),
                          dataclasses.replace(q, drop_stale=not q.drop_stale),
                          dataclasses.replace(q, num_in_flight=-1)])     # below 0: IF0
    return dataclasses.replace(s, requests=tuple(reqs))


def _compare_states(model, states, check_aux: bool) -> list[str]:
    ev, cfg, bad = Evaluator(model), model.cfg, []
    for s in states:
        m = ev.state(s)
        assert _truth(m, ev.wf), s
        for inv in invariants_for(cfg):
            with applied(model.mutant):     # L2 and L3 run the spec's (mutant) actions
                holds = inv.holds(s, cfg)
            if holds != _truth(m, ev.invariants[inv.name]):
                bad.append(f"{inv.name} disagrees on {s}")
        if check_aux:
            bad += [f"{n} fails on reachable {s}" for n, f in ev.auxiliary.items() if not _truth(m, f)]
        for sm in SOMETIMES:
            if sm.after is None:
                py = any(sm.target(s, cfg, r) for r in range(model.num_requests))
                if py != _truth(m, ev.sometimes[sm.name]):
                    bad.append(f"{sm.name} disagrees on {s}")
    return bad


@pytest.mark.parametrize("model", [models.PRESSURE_K2, pytest.param(models.ONE_BATCH, marks=SLOW)],
                         ids=lambda m: m.name)
def test_invariant_formulas_agree_on_reachable_states(model):
    assert _compare_states(model, list(reachable(model, limit=100)), check_aux=True) == []


# Two requests sharing a label, admitted close enough together to cache it twice.
DUPLICATING = models.Model(
    "tiny-k3", Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
                      max_model_len=6, prefix_caching=True, num_spec_tokens=1),
    (Prompt(2, 1, (7,)), Prompt(3, 1, (7,))))


@pytest.mark.parametrize("model", [profile_model(models.PRESSURE_K2, "vllm-0.8.4"),
                                   profile_model(DUPLICATING, "vllm-0.8.5")], ids=lambda m: m.name)
def test_invariant_formulas_agree_on_reachable_states_under_a_profile(model):
    """0.8.4 preallocates blocks and schedules one batch per request; 0.8.5
    caches a label twice: the formulas (the new targets and S9's caching
    clause included) and the auxiliary invariants still agree with the spec
    on the reachable states."""
    assert _compare_states(model, list(reachable(model, limit=150)), check_aux=True) == []


@pytest.mark.parametrize("model", [DEFERRAL_MODEL, profile_model(DUPLICATING, "vllm-0.33")], ids=lambda m: m.name)
def test_invariant_formulas_agree_on_reachable_states_under_0_33(model):
    """vLLM 0.33: S10's threshold clause only for batches of two entries or
    more; the free-queue head, the deferral and the stop order reach states
    0.8.x does not; the formulas and the auxiliary invariants still agree
    with the spec on every reachable state."""
    assert _compare_states(model, list(reachable(model)), check_aux=True) == []


def _first_entry_over(s: State, k: int, threshold: int) -> State:
    """s with the first entry of in-flight batch k one token over `threshold`."""
    batch = s.in_flight[k]
    batch = (dataclasses.replace(batch[0], n=threshold + 1),) + batch[1:]
    return dataclasses.replace(s, in_flight=s.in_flight[:k] + (batch,) + s.in_flight[k + 1:])


def test_invariant_formulas_agree_on_perturbed_0_33_states():
    """S10's clause under 0.33 on states outside the invariants: a one-entry
    batch over the threshold is allowed, a two-entry one is not."""
    rng, model = random.Random(5), models.DEFERRED_K3
    base = list(reachable(model, limit=300))
    states = [perturb(rng.choice(base), rng, model.cfg) for _ in range(300)]
    threshold = model.cfg.long_prefill_token_threshold
    # vLLM 0.33's empty batches make random walks over the threshold in a batch
    # of two rare: a few such states made on purpose, from batches of two
    states += [_first_entry_over(s, k, threshold) for s in base for k, b in enumerate(s.in_flight)
               if len(b) > 1][:10]
    assert _compare_states(model, states, check_aux=False) == []
    over = [len(b) for s in states for b in s.in_flight if any(e.n > threshold for e in b)]
    assert 1 in over and any(n > 1 for n in over)     # both sides of the clause were compared


def test_counter_formulas_agree_on_perturbed_0_33_states():
    """IF1-IF3 (vLLM 0.33's counters) as Z3 formulas agree with the spec's
    predicates on perturbed states, and the perturbations break each of them
    (so both truth values were compared)."""
    rng, model = random.Random(21), models.DEFERRED_K3
    base = list(reachable(model, limit=300))
    states = [perturb_counters(rng.choice(base), rng) for _ in range(300)]
    assert _compare_states(model, states, check_aux=False) == []
    counter_invariants = [inv for inv in invariants_for(model.cfg) if inv.name in COUNTER_FORMULAS]
    assert {inv.name for inv in counter_invariants} == set(COUNTER_FORMULAS)
    assert all(any(not inv.holds(s, model.cfg) for s in states) for inv in counter_invariants)


def test_the_deferral_target_formula_agrees_with_its_predicate():
    """The verification-only target `deferred_resumption` (the next schedule
    passes over a preempted request whose orphans are in flight): its formula
    over the frame's schedule and its concrete predicate agree on every
    reachable state of the deferral model, and some state reaches it."""
    ev, cfg = Evaluator(DEFERRAL_MODEL), DEFERRAL_MODEL.cfg
    sched, _ = ev.system.sched(0)
    formula = ev.system.build(SCHEDULE_SOMETIMES_FORMULAS["deferred_resumption"], ev.frame, sched)
    target = next(t for t in VERIFICATION_SOMETIMES if t.name == "deferred_resumption")
    reached = 0
    for s in reachable(DEFERRAL_MODEL):
        py = any(target.target(s, cfg, r) for r in range(DEFERRAL_MODEL.num_requests))
        assert py == _truth(ev.state(s), formula), s
        reached += py
    assert reached > 0


def test_invariant_formulas_agree_on_default_states():
    assert _compare_states(models.DEFAULT, random_walk_states(models.DEFAULT, 20, seed=2), check_aux=True) == []


@pytest.mark.parametrize("mutant", ["rejections_not_subtracted", "no_length_cap",
                                    pytest.param("blocks_not_freed_on_abort", marks=SLOW),
                                    pytest.param("stale_output_applied_to_resumed", marks=SLOW),
                                    pytest.param("budget_ignored", marks=SLOW)])
def test_invariant_formulas_agree_on_mutant_states(mutant):
    model = models.mutant_model(mutant)
    states = list(reachable(model, limit=80))
    assert _compare_states(model, states, check_aux=False) == []


def test_invariant_formulas_agree_on_perturbed_states():
    rng = random.Random(5)
    model = models.PRESSURE_K2
    base = list(reachable(model, limit=200))
    states = [perturb(rng.choice(base), rng, model.cfg) for _ in range(200)]
    broken = sum(1 for s in states if any(not inv.holds(s, model.cfg) for inv in INVARIANTS))
    assert broken > 50                     # the perturbations do break invariants
    assert _compare_states(model, states, check_aux=False) == []


def test_two_stage_target_uses_the_ghost_flag():
    model = models.PRESSURE_K2
    ev = Evaluator(model)
    s = next(x for x in reachable(model) if any(q.status.value == "FINISHED_LENGTH" for q in x.requests))
    r = next(i for i, q in enumerate(s.requests) if q.status.value == "FINISHED_LENGTH")
    flags = tuple(i == r for i in range(model.num_requests))
    assert _truth(ev.state(s, flags), ev.sometimes["preempted_request_resumes_and_finishes"])
    assert not _truth(ev.state(s, (False,) * model.num_requests),
                      ev.sometimes["preempted_request_resumes_and_finishes"])


@pytest.mark.parametrize("mutant", [None, "shared_snapshot",
                                    pytest.param("stale_output_applied_to_resumed", marks=SLOW),
                                    pytest.param("admit_after_preemption", marks=SLOW)])
def test_transition_property_formulas_agree_on_edges(mutant):
    model = models.mutant_model(mutant) if mutant else models.PRESSURE_K2
    ev, cfg, bad, edges = Evaluator(model), model.cfg, [], 0
    for s in reachable(model, limit=40):
        for action, t in explicit.successors(model, s):
            m = ev.edge(s, action, t)
            edges += 1
            for p in TRANSITION_PROPERTIES:
                with applied(model.mutant):     # S12 re-runs the spec's (mutant) schedule
                    holds = p.holds(s, t, action, cfg)
                if holds != _truth(m, ev.transition[p.name]):
                    bad.append(f"{p.name} disagrees on {s} --{action}--> {t}")
    assert edges > 40 and bad == []


def test_copy_ranks_hold_exactly_the_duplicates_list_of_every_reachable_state():
    """The encoding keeps BlockPool.duplicates as one rank per block: on every
    reachable state of a model where labels are cached twice, the ranks give
    back the list, and a list ranks cannot hold is refused, not misread."""
    from flightcheck.verification.z3.encoding.state import NotRepresentable, Layout, constant_state, copy_ranks, \
        duplicates_of
    model = profile_model(DUPLICATING, "vllm-0.8.5")
    states = list(reachable(model))
    with_copies = [s for s in states if s.pool.duplicates]
    assert with_copies, "the model must reach a label cached twice"
    for s in states:
        assert duplicates_of(s.pool.labels, copy_ranks(s.pool)) == s.pool.duplicates
    state = with_copies[0]
    repeated = dataclasses.replace(state, pool=dataclasses.replace(state.pool,
                                                                   duplicates=state.pool.duplicates * 2))
    with pytest.raises(NotRepresentable, match="copy ranks cannot hold them"):
        constant_state(Layout.of(model), repeated)
